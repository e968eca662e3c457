"""The config-patch step's patch file, as the real talosctl loads it.

Real source: talosctl's patch loader decodes a multi-document patch with the config decoder, which refuses two
documents of one kind; for the v1alpha1 (``machine:``/``cluster:``) document the message is
``duplicate document /v1alpha1/ is not allowed`` (talos@v1.12.0
``pkg/machinery/config/configloader/internal/decoder/decoder.go:108-109``, reached from
``pkg/machinery/config/configpatcher/load.go:24``). Found by running talosctl v1.12.0 against simnode with
``default_runtime_patch: true`` on Talos 1.12, where the default runtime is a ``machine.files`` entry.
"""

from __future__ import annotations

import yaml

from runbook_lib.model.machineconfig import remaining_patch
from runbook_lib.model.params import validate
from runbook_lib.model.profiles import render_documents


def _profile(talos_version: str):  # type: ignore[no-untyped-def]
    params = validate(
        {
            "cluster": "c",
            "target": "simulated",
            "talos_version": talos_version,
            "default_runtime_patch": True,
            "nodes": [{"name": "gpu-1", "address": "10.5.0.3"}],
        },
        source="test",
    )
    return params.profile(params.nodes[0])


def _wanted(talos_version: str) -> list[dict]:  # type: ignore[type-arg]
    profile = _profile(talos_version)
    return profile.machine_config_patch_documents(install_images=None) + profile.default_runtime_documents()


def _v1alpha1_documents(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all(text) if d and "kind" not in d]


def test_modules_and_default_runtime_go_to_talosctl_as_one_machine_document_on_talos_1_12() -> None:
    """Before: two ``machine:`` documents in one file, which talosctl refuses before touching any node."""
    wanted = _wanted("v1.12.7")
    assert sum(1 for d in wanted if "machine" in d) == 2  # the profile keeps them apart: the plan names both
    patch = render_documents(remaining_patch(wanted, [{"machine": {"kernel": {}}}]))
    (machine_doc,) = _v1alpha1_documents(patch)
    machine = machine_doc["machine"]
    assert {m["name"] for m in machine["kernel"]["modules"]} >= {"nvidia", "nvidia_uvm"}
    assert machine["files"][0]["path"] == "/etc/cri/conf.d/20-customization.part"
    assert machine["sysctls"]


def test_what_a_node_already_has_is_left_out_of_the_one_document() -> None:
    """A node with the modules already gets only the default-runtime file, still as a single document."""
    wanted = _wanted("v1.12.7")
    modules_doc = next(d for d in wanted if "kernel" in d.get("machine", {}))
    patch = render_documents(remaining_patch(wanted, [modules_doc]))
    (machine_doc,) = _v1alpha1_documents(patch)
    assert set(machine_doc["machine"]) == {"files"}


def test_a_1_14_modules_patch_for_a_node_before_1_14_is_machine_kernel_modules_and_met_by_it() -> None:
    """A node still on 1.13 refuses KernelModuleConfig documents (tests/sim/test_real_talos_113_to_114.py), so the
    1.14 profile's patch for it lists the modules under ``machine.kernel.modules``; once it has them there, the
    1.14 documents count as met (1.14 merges both forms: talos@v1.14.0-rc.1
    pkg/machinery/config/container/container.go:355-372), so a second run and the image step see the patch done."""
    profile = _profile("v1.14.0")
    documents = profile.machine_config_patch_documents()
    legacy = profile.machine_config_patch_documents(legacy_modules=True)
    assert {d.get("kind") for d in documents} == {"KernelModuleConfig"}
    [machine] = legacy
    names = [m["name"] for m in machine["machine"]["kernel"]["modules"]]
    assert names == [d["name"] for d in documents]
    assert remaining_patch(documents, legacy) == []
    # a document that asks more than the name (parameters) is not met by the older form
    with_parameters = [{**documents[0], "parameters": ["NVreg_OpenRmEnableUnsupportedGpus=1"]}]
    assert remaining_patch(with_parameters, legacy) == with_parameters
    # and the documents are still what a node without the modules lacks
    assert remaining_patch(documents, [{"machine": {}}]) == documents
