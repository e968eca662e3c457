"""``tools/build-talosctl.sh`` for the releases the Go module proxy half serves, and what their talosctl prints
differently (issue 14, Talos 1.3-1.5).

Asked on 2026-12-02, proxy.golang.org answers talos v1.5.5's ``.info`` and ``.zip`` with 200 and its ``.mod`` with
"403 This module version is not available." (v1.4.0's and v1.3.5's are served), which stopped the build at its
first ``go mod download``. A module's ``.mod`` is the go.mod inside its zip (the one at the v1.5.5 tag, compared
with siderolabs/talos's git tag), so the script serves that file through a file proxy in front of the others
and says so. These tests run the script against a local stand-in proxy shaped like the refusal, so they need Go
but no network; the script stops at ``go mod tidy`` here (the stand-in serves no pkg/machinery), after the step
under test.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.realtalos import ROOT
from tests.sim.talosctl_legs import LEGS, leg

VERSION = "v1.5.5"
MODULE = "github.com/siderolabs/talos"
GO_MOD = f"module {MODULE}\n\ngo 1.20\n"
REFUSED = b"not found: This module version is not available.\n"


def module_zip() -> bytes:
    """A module zip as the proxy serves one: every file under ``<module>@<version>/``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{MODULE}@{VERSION}/go.mod", GO_MOD)
        zf.writestr(f"{MODULE}@{VERSION}/go.sum", "")  # the script starts from the release's go.sum
        zf.writestr(f"{MODULE}@{VERSION}/doc.go", "package talos\n")
    return buf.getvalue()


def stand_in(refuse_zip: bool) -> type[BaseHTTPRequestHandler]:
    """The proxy's answers for talos at VERSION: .info and .zip served (the zip refused too if asked), the .mod
    refused with 403 as proxy.golang.org words it; anything else 404 (the script's later steps are not tested)."""
    files = {
        f"/{MODULE}/@v/{VERSION}.info": (200, b'{"Version":"%s"}' % VERSION.encode()),
        f"/{MODULE}/@v/{VERSION}.mod": (403, REFUSED),
        f"/{MODULE}/@v/{VERSION}.zip": (403, REFUSED) if refuse_zip else (200, module_zip()),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = files.get(self.path, (404, b"not found\n"))
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test reads the script's output, not the server's."""

    return Handler


@pytest.fixture(params=[False, True], ids=["zip-served", "zip-refused"])
def proxy(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), stand_in(refuse_zip=request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", request.param
    server.shutdown()
    server.server_close()


def run_script(tmp_path: Path, proxy_url: str) -> subprocess.CompletedProcess[str]:
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        pytest.skip("go is not installed (tools/build-talosctl.sh needs it)")
    env = {
        **os.environ,
        "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}",
        "GOPROXY": proxy_url,
        "GOMODCACHE": str(tmp_path / "modcache"),
        "GOFLAGS": "-modcacherw",  # so tmp_path can be removed
        "RUNBOOK_TOOLS_CACHE": str(tmp_path / "tools"),
    }
    script = ROOT / "tools" / "build-talosctl.sh"
    return subprocess.run(
        [str(script), VERSION], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_a_release_whose_go_mod_the_proxy_refuses_is_fetched_with_the_go_mod_of_its_zip(
    tmp_path: Path, proxy: tuple[str, bool]
) -> None:
    url, zip_refused = proxy
    proc = run_script(tmp_path, url)
    assert (
        proc.returncode != 0
    )  # the stand-in has no pkg/machinery: the script stops after the step under test
    note = f"{MODULE} {VERSION}/go.mod => the go.mod file of its module zip (the proxy refuses the .mod)"
    if zip_refused:
        # nothing to take the go.mod from: the refusal is reported as go words it, and nothing is noted
        assert f"{VERSION}.mod: 403 Forbidden" in proc.stderr, proc.stderr
        assert note not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    else:
        assert f"build-talosctl.sh: {note}" in proc.stderr, proc.stderr
        assert f"{VERSION}.mod: 403" not in proc.stderr, proc.stderr
        assert "pkg/machinery" in proc.stderr, proc.stderr  # it went on to the next module the release needs
    assert not (tmp_path / "tools" / "talosctl" / VERSION / "talosctl").exists()


# ---------------------------------------------------------------- what talosctl 1.5 prints differently


@pytest.mark.parametrize("which", LEGS)
def test_talosctl_1_5_prints_a_failed_read_as_the_error_apid_streamed(tmp_path: Path, which: str) -> None:
    """Found comparing the Python talosctl with the real v1.5.5 (tests/sim/test_fake_vs_real_talosctl.py): up to
    1.5 ``read`` collects the node error apid puts in the stream's metadata through helpers.AppendErrors
    (talos@v1.5.5 cmd/talosctl/cmd/talos/read.go:40-70, cmd/talosctl/pkg/talos/helpers/error.go:17-33); 1.6
    turned it into the reader's error, printed ``error reading: ...`` (pkg/machinery/client/client.go ReadStream).
    The fake printed 1.6's text for every release."""
    state = tmp_path / "state"
    create(state, ClusterSpec(workers=1, talos_version=VERSION, scenario="fresh"))
    with leg(which, state, VERSION) as run:
        proc = run("-n", "10.5.0.3", "read", "/proc/nope")
    missing = "rpc error: code = Unknown desc = stat /proc/nope: no such file or directory"
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"1 error occurred:\n {missing}\n")
