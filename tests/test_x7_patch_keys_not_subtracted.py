"""The config-patch step never drops part of the patch it was asked to apply.

``remaining_patch`` subtracts what a node's config already has from the profile's patch documents, key by
key, and copied only the keys it knew how to subtract (``machine.kernel.modules`` by name, ``machine.sysctls``,
``machine.files``, ``machine.install.extensions``). Any other key in a ``machine:`` document — a typo in a
profile (``modlues``), or a key a later profile adds, such as a module's ``parameters`` (Talos's
``KernelModuleConfig``: ``name`` and ``parameters``, /work/shared/reference/talos/config.schema.v1.12.json
``v1alpha1.KernelModuleConfig``) — was dropped without a word: the node was patched without it, and when
nothing else was missing the step said "the machine config already contains the patch". The parameters have no
key that carries patch content of a user's (``machine_patch`` is refused: tests/sim/test_real_patch_refusal.py),
so the documents are the profile's; a key that cannot be subtracted is refused, naming the document and key,
before any node is patched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runbook_lib.errors import PermanentError
from runbook_lib.model.machineconfig import UnhandledPatchKey, contains, remaining_patch
from runbook_lib.model.profiles import GpuProfile, profile_for
from runbook_lib.model.versions import SUPPORTED_MINORS
from runbook_lib.steps.patch import config_patch, read_configs
from tests.simcluster import sim_cluster

MODULES = [{"name": n} for n in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")]
#: A node that has the modules patch already (as a second run finds it).
PATCHED = [{"version": "v1alpha1", "machine": {"type": "worker", "kernel": {"modules": MODULES}}}]
#: A node whose config has no NVIDIA module yet.
FRESH = [{"version": "v1alpha1", "machine": {"type": "worker"}}]


def _profile_docs_with(extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Talos 1.12's modules document (as the profile builds it) with ``extra`` merged into ``machine``."""
    docs = profile_for("v1.12.0").machine_config_patch_documents()
    docs[0]["machine"].update(extra)
    return docs


def test_a_misspelt_key_in_a_profile_document_is_refused_naming_it_not_dropped() -> None:
    """Before: ``remaining_patch`` returned nothing for the typo, so a patched node was "already done"."""
    docs = _profile_docs_with({"kernel": {"modlues": MODULES}})
    with pytest.raises(UnhandledPatchKey) as caught:
        remaining_patch(docs, PATCHED)
    assert isinstance(caught.value, PermanentError)  # the CLI's exit 2, nothing retried
    assert caught.value.message.startswith("patch document 1 (machine:) has key machine.kernel.modlues, ")
    with pytest.raises(UnhandledPatchKey):
        contains(PATCHED, docs)  # verify/preflight: not "already contains the patch"


def test_module_parameters_are_refused_rather_than_subtracted_by_name_and_lost() -> None:
    """A node with ``nvidia`` loaded but without its parameters would keep running without them: the module is
    subtracted by name, and appending a second ``nvidia`` entry would list it twice (Talos appends lists)."""
    docs = _profile_docs_with({})
    docs[0]["machine"]["kernel"]["modules"][0]["parameters"] = ["NVreg_OpenRmEnableUnsupportedGpus=1"]
    with pytest.raises(UnhandledPatchKey) as caught:
        remaining_patch(docs, PATCHED)
    assert "machine.kernel.modules[0].parameters" in caught.value.message


def test_the_refusal_does_not_depend_on_what_the_node_has() -> None:
    """The same documents are refused on a fresh node, where the rest would otherwise go out without the key:
    the step fails before the first node of the fleet is patched, not half way through it."""
    docs = _profile_docs_with({"nodeLabels": {"nvidia.com/gpu.present": "true"}})
    with pytest.raises(UnhandledPatchKey) as caught:
        remaining_patch(docs, FRESH)
    assert "machine.nodeLabels" in caught.value.message


def test_a_top_level_key_beside_machine_is_refused() -> None:
    docs = _profile_docs_with({})
    docs[0]["cluster"] = {"allowSchedulingOnControlPlanes": True}
    with pytest.raises(UnhandledPatchKey) as caught:
        remaining_patch(docs, FRESH)
    assert "patch document 1 (machine:) has key cluster," in caught.value.message


@pytest.mark.parametrize("flavor", ["oss", "proprietary"])
def test_every_profiles_documents_are_subtracted_whole(flavor: str) -> None:
    """Every release's real documents (modules, sysctl, install extensions, default runtime) pass the check and
    come out whole on a fresh node, and as nothing on a node that has them."""
    for major, minor in SUPPORTED_MINORS:
        if flavor == "proprietary" and minor < 5:
            continue
        profile = profile_for(f"v{major}.{minor}.0", flavor)  # type: ignore[arg-type]
        images = profile.install_extension_images() if minor <= 4 else None
        docs = profile.machine_config_patch_documents(install_images=images)
        docs += profile.default_runtime_documents()
        remaining = remaining_patch(docs, FRESH)
        assert remaining, (major, minor)
        assert not remaining_patch(docs, applied(remaining)), (major, minor)


def applied(remaining: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FRESH's config once ``remaining`` is applied: the machine part merged into its v1alpha1 document, the
    named documents (``KernelModuleConfig``, ``CRICustomizationConfig``) beside it."""
    machine: dict[str, Any] = next((d["machine"] for d in remaining if "machine" in d), {})
    return [{"version": "v1alpha1", "machine": {"type": "worker", **machine}}] + [
        d for d in remaining if "kind" in d
    ]


@pytest.mark.slow
def test_the_config_patch_step_refuses_before_any_node_is_patched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the step with ``apply: true`` on a simulated fleet: the profile's documents carry a key the
    subtraction does not handle, the step raises the refusal, and no node's config changed (no change command
    ran; every config reads back as before)."""
    profile_docs = GpuProfile.machine_config_patch_documents

    def with_node_labels(self: GpuProfile, **kwargs: Any) -> list[dict[str, Any]]:
        docs = profile_docs(self, **kwargs)
        docs[0]["machine"]["nodeLabels"] = {"nvidia.com/gpu.present": "true"}
        return docs

    monkeypatch.setattr(GpuProfile, "machine_config_patch_documents", with_node_labels)
    with sim_cluster(tmp_path, daemon=False, apply=True, rollout_concurrency=2) as (params, ctx):
        before, errors = read_configs(ctx, list(params.nodes))
        with pytest.raises(UnhandledPatchKey) as caught:
            config_patch(ctx)
        after, _errors = read_configs(ctx, list(params.nodes))
        changes = ctx.journal.changes()
    assert not errors and after == before
    assert changes == []
    assert "machine.nodeLabels" in caught.value.message
