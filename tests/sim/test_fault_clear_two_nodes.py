"""``runbook sim fault --clear`` of two nodes waits until the real talosctl reaches BOTH (``realtalos._wait_answering``).

It asked ``talosctl -n a,b version`` and took exit 0 for "every node answers"; but ``version`` is one-to-many:
while another node answers, talosctl prints the failing node's error as a ``WARNING:`` naming it and exits 0
(siderolabs/talos v1.12.0 cmd/talosctl/cmd/talos/version.go, pkg/machinery/client/reply.go FilterMessages;
the shape captured from talosctl v1.12 against simnode in tests/sim/test_real_talosctl.py:331-336). So clearing
two nodes returned as soon as the first one answered, into the window where the second still refused.

The talosctl here is a stand-in script printing exactly those shapes, so the order (which node's apid front
redials first, simnode/front.go ``apidBackoff``) is the test's, not the scheduler's: a real simnode brings both
back within the same backoff and would rarely show the bug.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runbook_lib.sim import realtalos
from runbook_lib.sim.state import sim_paths

FIRST, SECOND = "10.5.0.2", "10.5.0.3"

#: answers ``version`` for every node in -n but the ones in refusing.json, which fail with apid's dial error
#: until their count of refusals runs out; every call appended to calls.json.
FAKE_TALOSCTL = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
refusing = json.loads((here / "refusing.json").read_text())
nodes = sys.argv[sys.argv.index("-n") + 1].split(",")
calls = json.loads((here / "calls.json").read_text()) if (here / "calls.json").exists() else []
down = [n for n in nodes if refusing.get(n, 0) > 0]
calls.append({{"nodes": nodes, "down": down}})
(here / "calls.json").write_text(json.dumps(calls))
for n in down:
    refusing[n] -= 1
(here / "refusing.json").write_text(json.dumps(refusing))
def unavailable(a):
    return ('rpc error: code = Unavailable desc = connection error: desc = '
            f'"transport: Error while dialing: dial tcp {{a}}:50000: connect: connection refused"')
errors = "".join(f"\\t* {{n}}: {{unavailable(n)}}\\n" for n in down)
multi = f"{{len(down)}} error{{'s' if len(down) > 1 else ''}} occurred:\\n{{errors}}\\n\\n"
print("Client:\\n\\tTag:         v1.12.0\\nServer:")
for n in nodes:
    if n not in down:
        print(f"\\tNODE:        {{n}}\\n\\tTag:         v1.12.0\\n\\tEnabled:     RBAC")
if down and len(down) == len(nodes):
    sys.stderr.write("error getting version: " + multi)
    sys.exit(1)
if down:
    sys.stderr.write("WARNING: " + multi)
"""


def fake_talosctl(state: Path, refusing: dict[str, int]) -> Path:
    """The stand-in talosctl under the state's bin dir, where ``_wait_answering`` runs it; its directory."""
    bin_dir = sim_paths(state).bin_dir
    bin_dir.mkdir(parents=True)
    script = bin_dir / "talosctl"
    script.write_text(FAKE_TALOSCTL.format(python=sys.executable))
    script.chmod(0o755)
    (bin_dir / "refusing.json").write_text(json.dumps(refusing))
    return bin_dir


def test_clearing_two_nodes_waits_until_the_second_answers_too(tmp_path: Path) -> None:
    bin_dir = fake_talosctl(tmp_path, {SECOND: 3})  # the first is back at once, the second after 3 tries
    realtalos._wait_answering(tmp_path, [FIRST, SECOND])
    calls = json.loads((bin_dir / "calls.json").read_text())
    assert calls[-1]["down"] == [], calls  # the last check found every node answering
    assert json.loads((bin_dir / "refusing.json").read_text())[SECOND] == 0, calls


def test_a_node_that_never_answers_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(realtalos, "ANSWER_TIMEOUT_S", 0.5)
    fake_talosctl(tmp_path, {SECOND: 10_000})
    with pytest.raises(realtalos.RealTalosError, match=rf"nodes {SECOND} still refuse") as err:
        realtalos._wait_answering(tmp_path, [FIRST, SECOND])
    assert f"dial tcp {SECOND}:50000: connect: connection refused" in str(err.value)
