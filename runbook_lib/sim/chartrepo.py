"""The simulated cluster's Helm chart repository: our stand-in charts, packaged by the real helm, on 127.0.0.1.

Why a served repository: the runbook installs charts the way a site does (``helm repo add`` + ``helm upgrade
--install repo/chart --version``), so the simulated cluster must answer ``<url>/index.yaml`` and the chart
archives like NVIDIA's repositories, or an air-gapped site's mirror, do. The charts are our own
(``chartsrc/``, each fact with its source); ``helm package --version`` stamps every version the runbook pins
and ``helm repo index`` writes the index, so what helm reads is what helm itself produced.

The same archives are also served at a second URL, the *mirror* (``charts_mirror`` in ``endpoints.json``), as an
air-gapped site's copy of NVIDIA's repository under a path of its own: a ``repo_url`` parameter naming it is
used as given, and each repository logs the requests it answered (``<state>/logs/charts*.log``), so a run can
be shown to have fetched from the mirror and never from the default.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import yaml

CHART_SOURCES = Path(__file__).resolve().parent / "chartsrc"
#: Versions served per chart: the ones the runbook pins (``DevicePlugin.chart_version``'s defaults:
#: 0.17.2 up to Talos 1.11, 0.18.0 from 1.12, and params/simulated.yaml's 0.18.0; ``GpuOperator.chart_version``
#: v26.3.3 from Talos 1.13, the version Talos CI pins). The gpu-operator chart's facts are v26.3.3's only.
CHART_VERSIONS: dict[str, tuple[str, ...]] = {
    "nvidia-device-plugin": ("0.17.2", "0.18.0"),
    "gpu-operator": ("v26.3.3", "v26.7.0"),
}
#: What a served version's values change from ``chartsrc``'s (v26.3.3's): an upgrade of the GPU Operator chart
#: moves the operator's device plugin to a new image, which is what the kubernetes step must see roll out.
#: v26.7.0's own value only (gpu-operator@v26.7.0 deployments/gpu-operator/values.yaml:241-245; v26.3.3's is
#: v0.19.3, values.yaml:222-226); the rest of v26.7.0's chart is not modelled.
VALUES_OF: dict[tuple[str, str], dict[str, dict[str, str]]] = {
    ("gpu-operator", "v26.7.0"): {"devicePlugin": {"version": "v0.20.0"}},
}


#: The mirror's path: a site's mirror is rarely at a host's root (e.g. https://charts.example.com/nvidia).
MIRROR_PATH = "nvidia"


class _LoggingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the repository directory; one line per request (``GET /index.yaml 200``) in the repository's own
    log, not the supervisor's (which is for failures)."""

    request_log: Path | None = None
    _lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:
        return

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.request_log is None:
            return
        with self._lock, self.request_log.open("a") as out:
            out.write(f"{self.command} {self.path} {code}\n")


def package(helm: Path, out: Path) -> list[Path]:
    """``helm package`` every served version of every chart into ``out``; the archives written."""
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    archives = []
    with tempfile.TemporaryDirectory(prefix="chartsrc-") as scratch:
        for chart, versions in CHART_VERSIONS.items():
            for version in versions:
                source = _source(chart, version, Path(scratch))
                argv = [str(helm), "package", str(source), "-d", str(out)]
                argv += ["--version", version, "--app-version", version]
                _run(argv, f"helm package {chart} {version}")
                archives.append(out / f"{chart}-{version}.tgz")
    return archives


def _source(chart: str, version: str, scratch: Path) -> Path:
    """The chart's source for ``version``: ``chartsrc`` itself, or a copy with ``VALUES_OF``'s values set."""
    changes = VALUES_OF.get((chart, version))
    if not changes:
        return CHART_SOURCES / chart
    copy = scratch / f"{chart}-{version}" / chart
    shutil.copytree(CHART_SOURCES / chart, copy)
    values = yaml.safe_load((copy / "values.yaml").read_text(encoding="utf-8"))
    for section, keys in changes.items():
        values[section].update(keys)
    (copy / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return copy


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()}")


class ChartRepo:
    """An HTTP server on a free loopback port serving ``root`` once ``index`` has written index.yaml into
    ``root/path`` (the repository's URL ends in ``path``); requests logged to ``request_log`` when given."""

    def __init__(self, root: Path, path: str = "", request_log: Path | None = None) -> None:
        handler_class = type("_Handler", (_LoggingHandler,), {"request_log": request_log})
        handler = functools.partial(handler_class, directory=str(root))
        self.directory = root / path if path else root
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}" + (f"/{path}" if path else "")
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
        if self._thread.ident is not None:  # shutdown() of a server never served would wait forever
            self.server.shutdown()
        self.server.server_close()


def serve(helm: Path, directory: Path, request_log: Path | None = None) -> ChartRepo:
    """Package the charts into ``directory``, index them for a fresh loopback port and serve them."""
    package(helm, directory)
    return _indexed_and_started(ChartRepo(directory, request_log=request_log), helm)


def serve_mirror(helm: Path, source: ChartRepo, root: Path, request_log: Path | None = None) -> ChartRepo:
    """The archives ``source`` serves, copied under ``root/nvidia`` and indexed for a second loopback port:
    what ``helm repo add`` finds at a site's mirror (its own index.yaml, whose archive URLs point at the
    mirror, so helm never reaches the source)."""
    directory = root / MIRROR_PATH
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    for archive in source.directory.glob("*.tgz"):
        shutil.copyfile(archive, directory / archive.name)
    return _indexed_and_started(ChartRepo(root, MIRROR_PATH, request_log), helm)


def _indexed_and_started(repo: ChartRepo, helm: Path) -> ChartRepo:
    """``repo`` indexed and serving; its port released when ``helm repo index`` fails, as the caller registers
    ``stop()`` only once this returns."""
    try:
        repo.index(helm)
        repo.start()
    except BaseException:
        repo.stop()
        raise
    return repo
