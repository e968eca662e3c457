"""Rollback (issue 17 point 5): the GPU nodes back to where the runbook found them, from its change records.

The rollback's design (which evidence, which order, which Kubernetes objects) is the project's own; the
Talos behaviour it relies on is cited where it is used: ``$patch: delete`` selectors (talos@v1.12.0
pkg/machinery/config/configloader/internal/decoder/delete.go ``makeSequenceSelector`` and selector.go
``deleteForPath``/``deleteStructFrom``), JSON6902 refused on multi-document configs (talos@v1.12.0
pkg/machinery/config/configpatcher/json6902.go), and ``talosctl rollback`` only swapping boot entries
(talos@v1.12.0 cmd/talosctl/cmd/talos/rollback.go, internal/app/machined/internal/server/v1alpha1/
v1alpha1_server.go ``Rollback``).
"""

from __future__ import annotations

import pytest

from runbook_lib.sim import patching

MODULES_PATCH = (
    "machine:\n  kernel:\n    modules:\n    - name: nvidia\n    - name: nvidia_uvm\n"
    "  sysctls:\n    net.core.bpf_jit_harden: '1'\n"
)


# -- the simulator deletes as Talos does ---------------------------------------------------------------------


def test_sim_list_item_delete_removes_the_first_item_matching_its_first_key() -> None:
    """talos@v1.12.0 decoder/delete.go ``makeSequenceSelector``: a ``$patch: delete`` item in any list is a
    selector on its first other key (not only in the lists Talos merges by key); selector.go
    ``deleteStructFrom`` removes the first match and fails with "lookup failed" when none matches."""
    config = [
        {"machine": {"kernel": {"modules": [{"name": "zfs"}, {"name": "nvidia"}, {"name": "nvidia_uvm"}]}}}
    ]
    patch = patching.StrategicPatch(
        [{"machine": {"kernel": {"modules": [{"name": "nvidia", "$patch": "delete"}]}}}]
    )
    out = patching.apply_strategic(config, patch)
    assert out[0]["machine"]["kernel"]["modules"] == [{"name": "zfs"}, {"name": "nvidia_uvm"}]
    with pytest.raises(patching.PatchError, match="lookup failed"):
        patching.apply_strategic(out, patch)
