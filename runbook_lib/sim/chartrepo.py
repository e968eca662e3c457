"""The simulated cluster's Helm chart repository: our stand-in charts, packaged by the real helm, on 127.0.0.1.

Why a served repository: the runbook installs charts the way a site does (``helm repo add`` + ``helm upgrade
--install repo/chart --version``), so the simulated cluster must answer ``<url>/index.yaml`` and the chart
archives like NVIDIA's repositories, or an air-gapped site's mirror, do. The charts are our own
(``chartsrc/``, each fact with its source); ``helm package --version`` stamps every version the runbook pins
and ``helm repo index`` writes the index, so what helm reads is what helm itself produced.
"""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from pathlib import Path

CHART_SOURCES = Path(__file__).resolve().parent / "chartsrc"
#: Versions served per chart: the ones the runbook pins (``DevicePlugin.chart_version``'s defaults:
#: 0.17.2 up to Talos 1.11, 0.18.0 from 1.12, and params/simulated.yaml's 0.18.0; ``GpuOperator.chart_version``
#: v26.3.3 from Talos 1.13, the version Talos CI pins). The gpu-operator chart's facts are v26.3.3's only.
CHART_VERSIONS: dict[str, tuple[str, ...]] = {
    "nvidia-device-plugin": ("0.17.2", "0.18.0"),
    "gpu-operator": ("v26.3.3",),
}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the repository directory; request lines go nowhere (the supervisor's log is for failures)."""

    def log_message(self, format: str, *args: object) -> None:
        return


def package(helm: Path, out: Path) -> list[Path]:
    """``helm package`` every served version of every chart into ``out``; the archives written."""
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    archives = []
    for chart, versions in CHART_VERSIONS.items():
        for version in versions:
            argv = [str(helm), "package", str(CHART_SOURCES / chart), "-d", str(out)]
            argv += ["--version", version, "--app-version", version]
            _run(argv, f"helm package {chart} {version}")
            archives.append(out / f"{chart}-{version}.tgz")
    return archives


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()}")


class ChartRepo:
    """An HTTP server on a free loopback port serving ``directory`` once ``index`` has written index.yaml."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.directory = directory
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="chart-repo", daemon=True)

    def index(self, helm: Path) -> None:
        """``helm repo index`` with this server's URL, so the archives' URLs in index.yaml point here."""
        _run([str(helm), "repo", "index", str(self.directory), "--url", self.url], "helm repo index")
        # helm chmods index.yaml 0644 whatever the umask (its atomic write sets the mode): the state dir's
        # files stay the owner's only, as everything else the simulator writes.
        for path in self.directory.iterdir():
            path.chmod(0o600)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(helm: Path, directory: Path) -> ChartRepo:
    """Package the charts into ``directory``, index them for a fresh loopback port and serve them."""
    package(helm, directory)
    repo = ChartRepo(directory)
    repo.index(helm)
    repo.start()
    return repo
