"""The verification inventory: identical nodes on one line, the odd one named, unknowns said as such."""

from __future__ import annotations

from runbook_lib.model.inventory import (
    Gpu,
    KubeGpu,
    NodeInventory,
    group_inventory,
    kube_gpu,
    node_gpus,
)

SCHEMATIC = "ef35b8d5b5f2a0ef8dbc0b3bd1e0f2fb3e4e2d9e1d2b8c1c0a4f1a1b6f5c4d3e"
EXTENSIONS = (
    ("nvidia-open-gpu-kernel-modules-lts", "570.172.08-v1.12.7"),
    ("nvidia-container-toolkit-lts", "570.172.08-v1.17.8"),
)
LIVE = (("nvidia", "Live"), ("nvidia_uvm", "Live"), ("nvidia_drm", "Live"), ("nvidia_modeset", "Live"))


def inventory(**changes: object) -> NodeInventory:
    fields: dict[str, object] = {
        "talos": "v1.12.7",
        "schematic": SCHEMATIC,
        "extensions": EXTENSIONS,
        "modules": LIVE,
        "driver": "570.172.08",
        "gpus": (Gpu("AD104GL [L4]", 23034),),
        "allocatable": None,
    }
    return NodeInventory(**(fields | changes))  # type: ignore[arg-type]


def test_a_thousand_identical_nodes_take_one_line_and_the_odd_one_is_named():
    fleet = {f"gpu-{i:04d}": inventory() for i in range(1000)}
    fleet["gpu-0500"] = inventory(driver=None, modules=(("nvidia", "not loaded"), *LIVE[1:]))
    groups = group_inventory(fleet)
    assert [len(g.nodes) for g in groups] == [999, 1]
    big, odd = (g.line() for g in groups)
    assert big.startswith(
        "999 nodes: Talos v1.12.7, schematic ef35b8d5b5f2…, nvidia-open-gpu-kernel-modules-lts"
    )
    assert "modules live, driver 570.172.08, 1× AD104GL [L4] 22.5 GiB" in big
    assert odd.startswith("gpu-0500: ") and "modules: nvidia not loaded" in odd and "driver not loaded" in odd


def test_gpu_memory_without_gpu_feature_discovery_is_unknown_not_guessed():
    gpus = node_gpus(["AD104GL [L4]", "AD104GL [L4]"], None)
    assert gpus is not None and "2× AD104GL [L4] memory unknown" in inventory(gpus=gpus).describe()


def test_gfd_labels_as_the_device_plugin_writes_them_give_memory_and_allocatable():
    # Labels as NVIDIA/k8s-device-plugin internal/lm/resource.go (commit 02f65cc) writes them: the NVML name
    # with spaces replaced by "-", total memory in MiB, the count; allocatable as the kubelet reports it.
    node = {
        "metadata": {
            "name": "gpu-0001",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.memory": "23034",
                "nvidia.com/gpu.count": "1",
            },
        },
        "status": {"allocatable": {"cpu": "7", "nvidia.com/gpu": "1"}},
    }
    kube = kube_gpu(node)
    assert kube == KubeGpu(allocatable=1, product="NVIDIA-L4", memory_mib=23034, count=1)
    line = inventory(gpus=node_gpus(["AD104GL [L4]"], kube), allocatable=kube.allocatable).describe()
    assert line.endswith("1× AD104GL [L4] 22.5 GiB, nvidia.com/gpu allocatable 1")


def test_gfd_memory_is_not_spread_over_a_different_gpu_count():
    kube = KubeGpu(allocatable=1, product="NVIDIA-L4", memory_mib=23034, count=1)
    assert node_gpus(["AD104GL [L4]", "GH100 [H100 SXM5 80GB]"], kube) == (
        Gpu("AD104GL [L4]"),
        Gpu("GH100 [H100 SXM5 80GB]"),
    )


def test_before_talos_1_8_gpus_come_from_gfd_or_are_unknown():
    assert "GPUs unknown" in inventory(gpus=node_gpus(None, None)).describe()
    kube = KubeGpu(allocatable=0, product="NVIDIA-L4", memory_mib=23034, count=2)
    assert "2× NVIDIA-L4 22.5 GiB" in inventory(gpus=node_gpus(None, kube)).describe()


def test_a_node_without_nvidia_gpu_on_its_pci_bus_says_so():
    assert "no NVIDIA GPU" in inventory(gpus=node_gpus([], None)).describe()


def test_the_record_form_keeps_every_node_of_a_group():
    groups = group_inventory({"b": inventory(), "a": inventory(), "c": inventory(talos="v1.12.6")})
    record = [g.to_dict() for g in groups]
    assert record[0]["nodes"] == ["a", "b"] and record[0]["count"] == 2
    assert record[0]["extensions"]["nvidia-container-toolkit-lts"] == "570.172.08-v1.17.8"
    assert record[1]["line"].startswith("c: Talos v1.12.6")
