"""What NVIDIA containers print on a real node: ``nvidia-smi`` tables per driver branch, the device plugin's
start-up log, the CUDA vectoradd sample.

Kept apart from the node agent so the texts (which tests and parsers compare against) live in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from runbook_lib.sim.state import Gpu

# CUDA version reported by each driver branch (nvidia-smi header).
_CUDA_BY_BRANCH = {
    515: "11.7",
    520: "11.8",
    525: "12.0",
    530: "12.1",
    535: "12.2",
    545: "12.3",
    550: "12.4",
    555: "12.5",
    560: "12.6",
    565: "12.7",
    570: "12.8",
    575: "12.9",
    580: "13.0",
    590: "13.1",
    595: "13.2",
}


def cuda_version(driver: str) -> str:
    major = int(driver.split(".", maxsplit=1)[0])
    best = max((b for b in _CUDA_BY_BRANCH if b <= major), default=515)
    return _CUDA_BY_BRANCH[best]


def _watts(model: str) -> int:
    m = model.upper()
    for key, w in (
        ("H100", 700),
        ("H200", 700),
        ("A100", 400),
        ("B200", 1000),
        ("L40", 300),
        ("L4", 72),
        ("A10", 150),
        ("T4", 70),
        ("V100", 300),
        ("RTX", 450),
    ):
        if key in m:
            return w
    return 250


def _bus(gpu: Gpu) -> str:
    """``0000:01:00.0`` → ``00000000:01:00.0`` as nvidia-smi prints it."""
    dom, rest = [*gpu.bus_id.split(":", 1), ""][:2] if gpu.bus_id.count(":") == 2 else ("0000", gpu.bus_id)
    return f"{dom.zfill(8).upper()}:{rest.upper()}"


def nvidia_smi(driver: str, gpus: list[Gpu], when: datetime | None = None) -> str:
    """The default ``nvidia-smi`` table in the layout of the driver's branch (three widths over the years):
    the date line, the GPU table (79 columns before 530, then 89, and 91 from 550), the processes table."""
    when = when or datetime.now(UTC)
    major = int(driver.split(".", maxsplit=1)[0])
    cuda = cuda_version(driver)
    lines = [when.strftime("%a %b %d %H:%M:%S %Y").replace(" 0", "  ", 1) + "       "]
    if major < 530:
        table, width = _narrow_gpu_table(driver, cuda, gpus)
    else:
        table, width = _gpu_table(driver, cuda, gpus, mid=24 if major >= 550 else 22)
    return "\n".join(lines + table + _processes_table(width)) + "\n"


def _narrow_gpu_table(driver: str, cuda: str, gpus: list[Gpu]) -> tuple[list[str], int]:
    """Before the 530 branch: 79 columns, three cells of 31/22/22."""
    w = 79
    lines = [
        "+" + "-" * (w - 2) + "+",
        f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}".ljust(w - 1) + "|",
        "|-------------------------------+----------------------+----------------------+",
        "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
        "|                               |                      |               MIG M. |",
        "|===============================+======================+======================|",
    ]
    for i, g in enumerate(gpus):
        lines += [
            f"| {i:>3}  {g.model[:18]:<18}  On   | {_bus(g)} Off |                    0 |",
            f"| N/A   31C    P8 {9:>5}W / {_watts(g.model):>3}W | {'0MiB':>9} / {str(g.memory_mib) + 'MiB':>8} |      0%      Default |",
            "|                               |                      |                  N/A |",
        ]
    lines.append("+-------------------------------+----------------------+----------------------+")
    return lines, w


def _gpu_table(driver: str, cuda: str, gpus: list[Gpu], *, mid: int) -> tuple[list[str], int]:
    """From the 530 branch: cells of 41/``mid``/22 (the middle one 22 wide, 24 from 550)."""
    cols = (41, mid, 22)
    w = sum(cols) + 4

    def row(*cells: str) -> str:
        return "|" + "|".join(c.ljust(n)[:n] for c, n in zip(cells, cols, strict=True)) + "|"

    def rule(ch: str, edge: str) -> str:
        return "|" + "+".join(ch * n for n in cols) + edge

    lines = [
        "+" + "-" * (w - 2) + "+",
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}".ljust(w - 1) + "|",
        rule("-", "+"),
        row(
            " GPU  Name                 Persistence-M ",
            " Bus-Id".ljust(mid - 7) + "Disp.A ",
            " Volatile Uncorr. ECC ",
        ),
        row(
            " Fan  Temp   Perf          Pwr:Usage/Cap ", "Memory-Usage ".rjust(mid), " GPU-Util  Compute M. "
        ),
        row("", "", "               MIG M. "),
        rule("=", "|"),
    ]
    for i, g in enumerate(gpus):
        lines += [
            row(f"{i:>4}  {g.model[:29]:<29}  On  ", f"{_bus(g)} Off ".rjust(mid), "0 ".rjust(22)),
            row(
                f" N/A   34C    P8{16:>15}W / {_watts(g.model):>4}W ",
                f"{'0MiB':>7} / {str(g.memory_mib) + 'MiB':>9} ".rjust(mid),
                "      0%      Default ",
            ),
            row("", "", "N/A ".rjust(22)),
        ]
    lines.append("+" + "+".join("-" * n for n in cols) + "+")
    return lines, w


def _processes_table(w: int) -> list[str]:
    """The processes table under the GPU table, as wide as it; no process runs on a simulated GPU."""
    return [
        " " * w,
        "+" + "-" * (w - 2) + "+",
        "| Processes:".ljust(w - 1) + "|",
        "|  GPU   GI   CI        PID   Type   Process name".ljust(w - 12) + "GPU Memory |",
        "|        ID   ID".ljust(w - 12) + "Usage      |",
        "|" + "=" * (w - 2) + "|",
        "|  No running processes found".ljust(w - 1) + "|",
        "+" + "-" * (w - 2) + "+",
    ]


def nvidia_smi_list(gpus: list[Gpu]) -> str:
    return "".join(f"GPU {i}: {g.model} (UUID: {g.uuid})\n" for i, g in enumerate(gpus))


def nvidia_smi_query(driver: str, gpus: list[Gpu], fields: list[str], noheader: bool) -> str:
    values: dict[str, Callable[[Gpu], str]] = {
        "name": lambda g: g.model,
        "driver_version": lambda g: driver,
        "memory.total": lambda g: f"{g.memory_mib} MiB",
        "uuid": lambda g: g.uuid,
        "pci.bus_id": _bus,
        "index": lambda g: str(gpus.index(g)),
    }

    def cell(f: str, g: Gpu) -> str:
        fn = values.get(f)
        return fn(g) if fn else "[N/A]"

    rows = [", ".join(cell(f, g) for f in fields) for g in gpus]
    if not noheader:
        rows.insert(0, ", ".join(f + (" [MiB]" if f == "memory.total" else "") for f in fields))
    return "\n".join(rows) + "\n"


VECTORADD_PASS = (
    "[Vector addition of 50000 elements]\n"
    "Copy input data from the host memory to the CUDA device\n"
    "CUDA kernel launch with 196 blocks of 256 threads\n"
    "Copy output data from the CUDA device to the host memory\n"
    "Test PASSED\n"
    "Done\n"
)


def vectoradd_fail(reason: str) -> str:
    return f"[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code {reason})!\n"


def _klog(level: str, src: str, msg: str, when: datetime | None = None) -> str:
    when = when or datetime.now(UTC)
    return f"{level}{when.strftime('%m%d %H:%M:%S.%f')}       1 {src}] {msg}\n"


def device_plugin_log(ok: bool, resource: str = "nvidia.com/gpu", fail_on_init: bool = True) -> str:
    out = (
        _klog("I", "main.go:235", "Starting FS watcher.")
        + _klog("I", "main.go:242", "Starting OS watcher.")
        + _klog("I", "main.go:257", "Starting Plugins.")
        + _klog("I", "main.go:314", "Loading configuration.")
        + _klog("I", "main.go:339", "Updating config with default resource matching patterns.")
        + _klog("I", "main.go:350", "Retrieving plugins.")
    )
    if ok:
        sock = resource.rsplit("/", maxsplit=1)[-1]
        out += (
            _klog("I", "server.go:176", f"Starting GRPC server for '{resource}'")
            + _klog(
                "I",
                "server.go:117",
                f"Starting to serve '{resource}' on /var/lib/kubelet/device-plugins/nvidia-{sock}.sock",
            )
            + _klog("I", "server.go:125", f"Registered device plugin for '{resource}' with Kubelet")
        )
        return out
    out += (
        _klog("E", "factory.go:112", "Incompatible strategy detected auto")
        + _klog(
            "E", "factory.go:113", "If this is a GPU node, did you configure the NVIDIA Container Toolkit?"
        )
        + _klog(
            "E",
            "factory.go:114",
            "You can check the prerequisites at: https://github.com/NVIDIA/k8s-device-plugin#prerequisites",
        )
        + _klog(
            "E",
            "factory.go:115",
            "You can learn how to set the runtime at: https://github.com/NVIDIA/k8s-device-plugin#quick-start",
        )
        + _klog(
            "E",
            "factory.go:116",
            "If this is not a GPU node, you should set up a toleration or nodeSelector to only deploy this plugin on GPU nodes",
        )
    )
    if fail_on_init:
        out += _klog(
            "E",
            "main.go:132",
            "error starting plugins: error creating plugin manager: unable to create plugin manager: invalid device discovery strategy",
        )
    else:
        out += _klog("I", "main.go:362", "No devices found. Waiting indefinitely.")
    return out
