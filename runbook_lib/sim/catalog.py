"""The simulated Image Factory's knowledge: which official extensions exist for each Talos release, and
which schematics have been registered.

Why: the simulated factory (``sim/factory.py``) answers ``GET /version/{v}/extensions/official`` and
``GET /schematics/{id}``, and the simulated ``talosctl upgrade --image <factory>/…/<id>:<ver>`` must know
which extensions (at which tags) that installer carries, exactly as the real factory would build it.  Both
read this module so they never disagree.  The data comes from the facts file's version tables (§1.1 names,
§1.2 tag formats and driver/toolkit versions); patch releases reuse their ``.0`` versions except where the
facts name a real patch release (v1.12.7, v1.12.0-beta.0).

Faults that tests switch on live in ``state_dir/faults.json`` under ``"factory"``; the ones this module
honours are ``"missing_extensions": {"v1.12.7": ["siderolabs/…"], "*": [...]}`` (an extension the factory
does not have for that version) and ``"kmod_built_for": {"v1.12.7": "v1.12.6"}`` (kernel-module tags built
for another release, as a stale mirror would serve).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runbook_lib.errors import PermanentError
from runbook_lib.model.profiles import DRIVER_TABLE
from runbook_lib.model.schematic import (
    VANILLA_SCHEMATIC_ID,
    ExtensionInfo,
    Schematic,
    parse_schematic,
)
from runbook_lib.model.versions import TalosVersion
from runbook_lib.sim import state
from runbook_lib.sim.state import atomic_write

SIDERO = "Sidero Labs"

#: Newest patch per minor line the simulated factory lists: the releases the simulated cluster defaults to.
LATEST_PATCH: dict[tuple[int, int], int] = {
    TalosVersion.parse(v).minor_line: TalosVersion.parse(v).patch or 0 for v in state.LATEST_PATCH.values()
}
#: Pre-releases that appear in the facts (real output exists for 1.12.0-beta.0, facts §6).
PRERELEASES = ("v1.12.0-beta.0", "v1.14.0-rc.1")

#: The Image Factory builds for Talos 1.5 and later; 1.3–1.4 users install extensions from ghcr.io.
FIRST_FACTORY_MINOR = (1, 5)

#: (driver LTS/single, driver production, container toolkit) at each ``.0`` extensions release (facts §1.2):
#: the same published facts the GPU profiles cite, so both rooms read them from one table.
NVIDIA_VERSIONS: Mapping[tuple[int, int], tuple[str, str | None, str]] = DRIVER_TABLE
#: Real releases whose versions differ from their ``.0``: v1.12.7 from siderolabs/extensions@v1.12.7
#: nvidia-gpu/vars.yaml (NVIDIA_DRIVER_LTS_VERSION 580.126.20, NVIDIA_DRIVER_PRODUCTION_VERSION 570.211.01,
#: CONTAINER_TOOLKIT_VERSION v1.18.2; its production tag is also in facts §1.2); until 7 Dec 2026 the LTS driver
#: here was v1.12.0's, 580.105.08 (Talos profiles review). The patch a bare minor means (``state.LATEST_PATCH``)
#: where it differs from its ``.0``, each from siderolabs/extensions@<tag> nvidia-gpu/vars.yaml
#: (NVIDIA_DRIVER_LTS_VERSION, NVIDIA_DRIVER_PRODUCTION_VERSION, CONTAINER_TOOLKIT_VERSION; simulator audit, stop
#: 52); the other latest patches, v1.3.7 to v1.8.4 and v1.11.6, carry their ``.0``'s versions at their tags. Other
#: patch releases of the catalog keep their ``.0``'s versions, which the real ones may not (within 1.12 they
#: change at .2, .3, .4 and .6): the simulated tags of those releases are not the real factory's.
NVIDIA_OVERRIDES: dict[str, tuple[str, str | None, str]] = {
    "v1.12.7": ("580.126.20", "570.211.01", "v1.18.2"),
    "v1.12.0-beta.0": ("580.95.05", "570.195.03", "v1.18.0"),
    "v1.9.6": ("535.230.02", "550.144.03", "v1.17.3"),
    "v1.10.9": ("535.247.01", "570.148.08", "v1.17.8"),
    "v1.12.11": ("580.126.20", "570.211.01", "v1.18.2"),
    "v1.13.9": ("580.178.04", "595.91.07", "v1.19.1"),
}

_KMOD_OPEN_DESC = "This system extension provides nvidia open source driver kernel modules built against a specific Talos version."
_KMOD_NONFREE_DESC = "This system extension provides nvidia proprietary driver kernel modules built against a specific Talos version."
_TOOLKIT_DESC = "This system extension provides the NVIDIA container toolkit (nvidia-container-runtime, nvidia-ctk, nvidia-persistenced)."
_FABRIC_DESC = "This system extension provides the NVIDIA fabric manager for NVSwitch systems."
_GDR_DESC = "This system extension provides the NVIDIA GPUDirect RDMA (gdrdrv) kernel module."


def talos_versions() -> list[str]:
    """Every release the simulated factory knows, oldest first (``GET /versions`` lists those from 1.5)."""
    out: list[str] = []
    for (major, minor), last in sorted(LATEST_PATCH.items()):
        out.extend(f"v{major}.{minor}.{patch}" for patch in range(last + 1))
    out.extend(PRERELEASES)
    return sorted(out, key=TalosVersion.parse)


def factory_versions() -> list[str]:
    """What ``GET /versions`` returns: releases the factory can build (Talos 1.5 and later), and of the
    pre-releases only the newest minor line's alpha and beta, as the real factory filters its list
    (siderolabs/image-factory internal/artifacts/versions.go ``fetchTalosVersions`` at 9d6ab0e). It still serves
    the extensions of every release of the catalog (``buildable``)."""
    newest = max(TalosVersion.parse(v) for v in talos_versions()).minor_line

    def listed(version: TalosVersion) -> bool:
        kind = version.prerelease.lstrip("-").split(".")[0]
        return not version.prerelease or (version.minor_line == newest and kind in ("alpha", "beta"))

    return [v for v in buildable() if listed(TalosVersion.parse(v))]


def buildable() -> list[str]:
    """The releases whose extensions and installers the simulated factory serves: the catalog's from 1.5."""
    return [v for v in talos_versions() if TalosVersion.parse(v).minor_line >= FIRST_FACTORY_MINOR]


def is_known_version(talos_version: str) -> bool:
    return _canonical(talos_version) in talos_versions()


def _canonical(talos_version: str) -> str:
    return str(TalosVersion.parse(talos_version))


def _digest(ref: str) -> str:
    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


def _ext(name: str, tag: str, description: str, *, tier: str, talos: TalosVersion) -> ExtensionInfo:
    ref = f"ghcr.io/siderolabs/{name}:{tag}"
    # Manifests gained a "[tier]" prefix in 2025-08 (extensions v1.11), facts §6.
    desc = f"[{tier}] {description}" if talos.at_least(1, 11) else description
    return ExtensionInfo(
        name=f"siderolabs/{name}", ref=ref, digest=_digest(ref), author=SIDERO, description=desc
    )


def nvidia_versions(talos_version: str) -> tuple[str, str | None, str]:
    """(driver LTS, driver production or None, toolkit version) shipped with that Talos release."""
    canonical = _canonical(talos_version)
    if canonical in NVIDIA_OVERRIDES:
        return NVIDIA_OVERRIDES[canonical]
    talos = TalosVersion.parse(canonical)
    try:
        return NVIDIA_VERSIONS[talos.minor_line]
    except KeyError:
        raise PermanentError(f"no NVIDIA extensions are known for Talos {canonical}") from None


def official_extensions(talos_version: str) -> list[ExtensionInfo]:
    """The official extensions the factory offers for one exact Talos release, sorted by name."""
    talos = TalosVersion.parse(_canonical(talos_version))
    if talos.patch is None:
        raise PermanentError(f"{talos_version!r} is a minor line, not a release", hint="e.g. v1.12.7")
    minor = talos.minor_line
    if minor not in NVIDIA_VERSIONS:
        return []
    lts, production, toolkit = nvidia_versions(str(talos))
    exts: list[ExtensionInfo] = []
    if minor < (1, 8):
        exts.append(
            _ext(
                "nvidia-open-gpu-kernel-modules", f"{lts}-{talos}", _KMOD_OPEN_DESC, tier="core", talos=talos
            )
        )
        exts.append(
            _ext("nvidia-container-toolkit", f"{lts}-{toolkit}", _TOOLKIT_DESC, tier="core", talos=talos)
        )
        exts.append(_ext("nvidia-fabricmanager", lts, _FABRIC_DESC, tier="core", talos=talos))
        # nonfree-kmod-nvidia first ships with extensions v1.5.0 (extensions@v1.4.8 nvidia-gpu/ has none; its
        # nonfree/kmod-nvidia is at v1.5.0): until stop 52 offered from 1.4.8 (simulator audit)
        if talos.at_least(1, 5):
            exts.append(
                _ext("nonfree-kmod-nvidia", f"{lts}-{talos}", _KMOD_NONFREE_DESC, tier="extra", talos=talos)
            )
    else:
        tracks: list[tuple[str, str]] = [("lts", lts)]
        if production:
            tracks.append(("production", production))
        for track, driver in tracks:
            exts.append(
                _ext(
                    f"nvidia-open-gpu-kernel-modules-{track}",
                    f"{driver}-{talos}",
                    _KMOD_OPEN_DESC,
                    tier="core",
                    talos=talos,
                )
            )
            exts.append(
                _ext(
                    f"nonfree-kmod-nvidia-{track}",
                    f"{driver}-{talos}",
                    _KMOD_NONFREE_DESC,
                    tier="extra",
                    talos=talos,
                )
            )
            exts.append(
                _ext(
                    f"nvidia-container-toolkit-{track}",
                    f"{driver}-{toolkit}",
                    _TOOLKIT_DESC,
                    tier="core",
                    talos=talos,
                )
            )
            exts.append(_ext(f"nvidia-fabricmanager-{track}", driver, _FABRIC_DESC, tier="core", talos=talos))
        if minor >= (1, 12):
            exts.append(_ext("nvidia-gdrdrv-device", f"2.5.1-{talos}", _GDR_DESC, tier="extra", talos=talos))
    exts.extend(_common_extensions(talos))
    return sorted(exts, key=lambda e: e.name)


def _common_extensions(talos: TalosVersion) -> list[ExtensionInfo]:
    """A few widely used non-NVIDIA extensions, so name look-ups and "close names" are realistic."""
    minor = talos.minor
    return [
        _ext(
            "amd-ucode",
            f"2025{minor:02d}10",
            "This system extension provides AMD microcode binaries.",
            tier="core",
            talos=talos,
        ),
        _ext(
            "intel-ucode",
            f"2025{minor:02d}12",
            "This system extension provides Intel microcode binaries.",
            tier="core",
            talos=talos,
        ),
        _ext(
            "gvisor",
            f"20250{minor % 10}01.0",
            "This system extension provides gVisor using containerd's runtime handler.",
            tier="extra",
            talos=talos,
        ),
        _ext(
            "iscsi-tools", "v0.1.6", "This system extension provides iscsi-tools.", tier="core", talos=talos
        ),
        _ext(
            "util-linux-tools",
            "2.40.4",
            "This system extension provides util-linux tools.",
            tier="core",
            talos=talos,
        ),
        _ext(
            "qemu-guest-agent",
            "9.2.0",
            "This system extension provides the QEMU Guest Agent service.",
            tier="extra",
            talos=talos,
        ),
        _ext(
            "gasket-driver",
            f"97aeba5-{talos}",
            "This system extension provides the gasket driver kernel modules (Google Coral).",
            tier="extra",
            talos=talos,
        ),
        _ext(
            "zfs",
            f"2.3.3-{talos}",
            "This system extension provides the ZFS kernel module and tools.",
            tier="extra",
            talos=talos,
        ),
        _ext(
            "drbd",
            f"9.2.14-{talos}",
            "This system extension provides the DRBD kernel module.",
            tier="extra",
            talos=talos,
        ),
    ]


# ------------------------------------------------------------------------------------------------ faults


def factory_faults(state_dir: Path | str) -> dict[str, Any]:
    """The ``"factory"`` section of ``faults.json`` (empty when absent or unreadable mid-write)."""
    path = Path(state_dir) / "faults.json"
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    section = data.get("factory", {}) if isinstance(data, dict) else {}
    return section if isinstance(section, dict) else {}


def available_extensions(state_dir: Path | str, talos_version: str) -> list[ExtensionInfo]:
    """:func:`official_extensions` minus the ones a test made "missing" for that version."""
    canonical = _canonical(talos_version)
    missing_spec = factory_faults(state_dir).get("missing_extensions", {})
    missing: set[str] = set()
    if isinstance(missing_spec, dict):
        for key in (canonical, "*"):
            names = missing_spec.get(key, [])
            if isinstance(names, list):
                missing.update(str(n) for n in names)
    out = [e for e in official_extensions(canonical) if e.name not in missing]
    built_for = factory_faults(state_dir).get("kmod_built_for", {})
    other = built_for.get(canonical) if isinstance(built_for, dict) else None
    if other:
        out = [_rebuilt_for(e, canonical, str(other)) for e in out]
    return out


def _rebuilt_for(info: ExtensionInfo, talos_version: str, other: str) -> ExtensionInfo:
    """A kernel-module entry whose tag names another Talos release (the fault ``kmod_built_for``)."""
    if "kernel-modules" not in info.name and "kmod-nvidia" not in info.name:
        return info
    ref = info.ref.removesuffix(talos_version) + other
    return ExtensionInfo(info.name, ref, _digest(ref), info.author, info.description)


class ExtensionUnavailable(PermanentError):
    """The factory cannot build an image: an official extension does not exist for that Talos version."""


def installer_extensions(state_dir: Path | str, schematic_id: str, talos_version: str) -> list[ExtensionInfo]:
    """The extensions an installer ``<factory>/…/<schematic_id>:<talos_version>`` carries, in schematic order.

    Raises :class:`ExtensionUnavailable` with the factory's own wording when one does not exist for that
    version, and :class:`PermanentError` for an unknown schematic (the registry answers 404).
    """
    schematic = schematic_store(state_dir).get_schematic(schematic_id)
    if schematic is None:
        raise PermanentError(f"schematic {schematic_id} not found")
    canonical = _canonical(talos_version)
    by_name = {e.name: e for e in available_extensions(state_dir, canonical)}
    out: list[ExtensionInfo] = []
    for name in schematic.official_extensions:
        if name not in by_name:
            # siderolabs/image-factory internal/profile/profile.go
            raise ExtensionUnavailable(
                f'official extension "{name}" is not available for Talos version {canonical}'
            )
        out.append(by_name[name])
    return out


# ------------------------------------------------------------------------------------------ schematic store


class SchematicStore:
    """Registered schematics, one canonical YAML file per ID under ``state_dir/schematics/``.

    Content-addressed, so concurrent ``put`` of the same schematic from several processes is harmless.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, schematic_id: str) -> Path | None:
        if len(schematic_id) != 64 or any(c not in "0123456789abcdef" for c in schematic_id):
            return None
        return self.root / f"{schematic_id}.yaml"

    def put(self, schematic_yaml: bytes | str) -> str:
        """Register a schematic (YAML or JSON, any formatting); returns its ID.  Raises ``SchematicInvalid``."""
        schematic = parse_schematic(schematic_yaml)
        return self.put_schematic(schematic)

    def put_schematic(self, schematic: Schematic) -> str:
        schematic_id = schematic.id
        path = self.root / f"{schematic_id}.yaml"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            # JSON first: go-yaml's canonical text is not always readable back (a multi-line value starting
            # with a space inside a list gets a wrong indentation indicator), the JSON always is.
            atomic_write(self.root / f"{schematic_id}.json", json.dumps(schematic.to_json_dict()))
            atomic_write(path, schematic.canonical_bytes())
        return schematic_id

    def get_yaml(self, schematic_id: str) -> str | None:
        """The canonical YAML of a registered schematic (the vanilla one is always known)."""
        if schematic_id == VANILLA_SCHEMATIC_ID:
            return Schematic().canonical_yaml()
        path = self._path(schematic_id)
        if path is None:
            return None
        try:
            return path.read_text()
        except FileNotFoundError:
            return None

    def get_schematic(self, schematic_id: str) -> Schematic | None:
        if schematic_id == VANILLA_SCHEMATIC_ID:
            return Schematic()
        path = self._path(schematic_id)
        if path is None:
            return None
        try:
            return parse_schematic(path.with_suffix(".json").read_text())
        except FileNotFoundError:
            text = self.get_yaml(schematic_id)  # stored by an older version: YAML only
            return parse_schematic(text) if text is not None else None

    def get(self, schematic_id: str) -> dict[str, Any] | None:
        """The schematic as plain data (``{"customization": {...}}``), or ``None`` when unknown."""
        schematic = self.get_schematic(schematic_id)
        return schematic.to_json_dict() if schematic is not None else None


def schematic_store(state_dir: Path | str) -> SchematicStore:
    return SchematicStore(Path(state_dir) / "schematics")
