"""How long the runbook lets ``talosctl upgrade`` run before it stops it, with and without talosctl's own drain.

talosctl 1.13+ (its default path, no ``--legacy``) bounds only the reboot wait with ``--timeout``; the drain (5 min,
``--drain-timeout``) comes before it and the wait for Ready before the uncordon, up to ``--timeout`` again, after it
(talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166, drain.go:106-150, nodedrain.go:30). The runbook stopped
every upgrade at ``--timeout`` + 30 s, so a healthy but slow upgrade was killed in its drain or its uncordon wait,
which leaves the node cordoned. The program here is a stand-in that only sleeps: what is tested is the runbook's
deadline for it, with the margin (``KILL_MARGIN``) set to 0 so the test takes seconds, not minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.clients import talosctl as talosctl_module
from runbook_lib.clients.talosctl import Talosctl

IMAGE = "factory.talos.dev/metal-installer/0123abcd:v1.13.9"


@pytest.fixture
def slow_talosctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Talosctl:
    """A "talosctl" that takes 2 s and succeeds, as an upgrade whose drain outlasted ``--timeout`` does."""
    script = tmp_path / "talosctl"
    script.write_text("#!/bin/sh\nsleep 2\necho done >&2\n")
    script.chmod(0o755)
    monkeypatch.setattr(talosctl_module, "KILL_MARGIN", 0.0)
    return Talosctl(str(script))


def test_an_upgrade_talosctl_drains_is_not_stopped_at_its_timeout(slow_talosctl: Talosctl) -> None:
    run = slow_talosctl.upgrade("10.5.0.3", IMAGE, timeout=1.0, drains=True)
    assert run.ok, run.stderr


def test_an_upgrade_without_a_drain_is_still_stopped_after_its_timeout(slow_talosctl: Talosctl) -> None:
    run = slow_talosctl.upgrade("10.5.0.3", IMAGE, timeout=1.0, drains=False)
    assert not run.ok and "(timed out after 1 s)" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("node", "client", "legacy", "drains"),
    [
        ("v1.13.9", "v1.13.9", False, True),
        ("v1.12.7", "v1.13.9", False, False),  # below the new API's range: talosctl falls back to legacy
        ("v1.13.9", "v1.12.0", False, False),  # talosctl 1.12 has no drain
        ("v1.13.9", "v1.13.9", True, False),
        # a development build's tag (git describe): talosctl parses it tolerantly (semver.ParseTolerant,
        # talos@v1.13.0 cmd/talosctl/pkg/talos/helpers/checks.go:55-75) and, within ">1.13.0-alpha.2 <2.0.0"
        # (upgrade.go:85), drains. The runbook cannot read such a tag, so it allowed no time for the drain.
        ("v1.13.0-alpha.2-30-g1234abc", "v1.13.9", False, True),
        (None, "v1.13.9", False, True),  # not read: allow for the drain rather than stop it midway
    ],
)
def test_whether_talosctl_drains(node: str | None, client: str, legacy: bool, drains: bool) -> None:
    from runbook_lib.steps.image_risks import drains as will_drain

    assert will_drain(node, client, legacy=legacy) is drains
