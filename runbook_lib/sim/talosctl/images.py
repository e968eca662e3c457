"""What a node boots into after ``talosctl upgrade --image …``: the schematic's extensions at the tag's version.

Installer references are resolved the way Image Factory serves them (``<host>/[<platform>-]installer[-secureboot]/
<schematic>:<version>``), ``ghcr.io/siderolabs/installer:<v>`` is the vanilla schematic (which is how a plain
upgrade silently drops the NVIDIA extensions).  Extension versions come from the image-creation room's
catalog (``runbook_lib.sim.catalog``), the same one the simulated factory serves: that
room is the single source of truth, as the real factory is for real nodes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.sim import catalog
from runbook_lib.sim.state import (
    VANILLA_SCHEMATIC,
    InstalledExtension,
    minor_of,
    normalize_talos_version,
    v1alpha1_doc,
)

_FACTORY_PATH = re.compile(r"^(?:[a-z0-9]+-)?installer(?:-secureboot)?$")


class ImageError(Exception):
    """The installer image cannot be pulled; the message is the node's error text."""


@dataclass(frozen=True)
class InstallerRef:
    image: str
    schematic_id: str
    version: str


def parse_installer(image: str) -> InstallerRef:
    ref, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        ref, tag = image, "latest"
    parts = ref.split("/")
    not_found = ImageError(
        f'failed to pull installer image "{image}": failed to resolve reference "{image}": {image}: not found'
    )
    if ref.endswith("siderolabs/installer"):
        schematic = VANILLA_SCHEMATIC
    elif len(parts) >= 3 and _FACTORY_PATH.match(parts[-2]) and re.fullmatch(r"[0-9a-f]{64}", parts[-1]):
        schematic = parts[-1]
    else:
        raise not_found
    if not re.fullmatch(r"v\d+\.\d+\.\d+(?:-[0-9A-Za-z.\-]+)?", tag):
        raise not_found
    return InstallerRef(image=image, schematic_id=schematic, version=tag)


def official_extensions(version: str, state_dir: Path | None = None) -> list[dict[str, str]]:
    """``GET /version/<v>/extensions/official`` as dicts (name, ref, digest, author, description).

    With a state dir, extensions a test made "missing" in the factory room are left out.
    """
    infos = (
        catalog.available_extensions(state_dir, version)
        if state_dir
        else catalog.official_extensions(version)
    )
    return [
        {k: str(getattr(i, k, "") or "") for k in ("name", "ref", "digest", "author", "description")}
        for i in infos
    ]


def schematic(state_dir: Path, schematic_id: str) -> dict[str, Any] | None:
    return catalog.schematic_store(state_dir).get(schematic_id)


def schematic_extension_names(doc: dict[str, Any]) -> list[str]:
    customization = doc.get("customization") or {}
    system = customization.get("systemExtensions") or {}
    return [str(n) for n in system.get("officialExtensions") or []]


def to_installed(info: dict[str, str]) -> InstalledExtension:
    return InstalledExtension(
        name=info["name"].split("/", 1)[-1],
        version=info["ref"].rpartition(":")[2],
        image=info["ref"],
        author=info.get("author") or "Sidero Labs",
        description=info.get("description") or "",
    )


def resolve(
    state_dir: Path, image: str, faults: dict[str, Any]
) -> tuple[InstallerRef, list[InstalledExtension]]:
    """Installer reference → (parsed ref, extensions the node will run), applying extension faults."""
    ref = parse_installer(image)
    doc = schematic(state_dir, ref.schematic_id)
    if doc is None:
        raise ImageError(
            f'failed to pull installer image "{image}": failed to resolve reference "{image}": '
            f"unexpected status from HEAD request: 404 Not Found (schematic {ref.schematic_id} not found)"
        )
    available = {e["name"]: e for e in official_extensions(ref.version, state_dir)}
    installed: list[InstalledExtension] = []
    for name in schematic_extension_names(doc):
        info = available.get(name)
        if info is None:
            raise ImageError(
                f'failed to pull installer image "{image}": official extension "{name}" '
                f"is not available for Talos version {ref.version}"
            )
        installed.append(to_installed(info))
    return ref, apply_extension_faults(installed, ref.version, faults)


def with_install_extensions(
    state_dir: Path,
    ref: InstallerRef,
    installed: list[InstalledExtension],
    config: list[dict[str, Any]],
    faults: dict[str, Any],
) -> list[InstalledExtension]:
    """The installer also pulls the images ``machine.install.extensions`` lists
    (talos@v1.3.0:internal/pkg/install/install.go:58, still at v1.5.0:60): before the Image Factory (Talos
    1.3-1.4) that is how extensions reach a node.  An image the registry does not have fails the upgrade
    (the wording is modelled on the installer-pull error above, not taken from a capture)."""
    machine = v1alpha1_doc(config).get("machine") or {}
    listed = (machine.get("install") or {}).get("extensions") or []
    wanted = [str(e.get("image", "")) for e in listed if isinstance(e, dict)]
    if not wanted:
        return installed
    by_ref = {e["ref"]: e for e in official_extensions(ref.version, state_dir)}
    names = {e.name for e in installed}
    added: list[InstalledExtension] = []
    for image in wanted:
        info = by_ref.get(image)
        if info is None:
            raise ImageError(
                f'failed to pull extension image "{image}": failed to resolve reference "{image}": {image}: not found'
            )
        ext = to_installed(info)
        if ext.name not in names:
            added.append(ext)
            names.add(ext.name)
    return installed + apply_extension_faults(added, ref.version, faults)


def apply_extension_faults(
    installed: list[InstalledExtension], version: str, faults: dict[str, Any]
) -> list[InstalledExtension]:
    """``toolkit_missing`` drops the toolkit; ``driver_mismatch`` takes it from the other track."""
    out = list(installed)
    if faults.get("toolkit_missing"):
        out = [e for e in out if not e.name.startswith("nvidia-container-toolkit")]
    if faults.get("driver_mismatch"):
        available = {e["name"].split("/", 1)[-1]: e for e in official_extensions(version)}
        for i, ext in enumerate(out):
            if not ext.name.startswith("nvidia-container-toolkit"):
                continue
            other = _other_track(ext.name)
            if other in available and driver(available[other]["ref"]) != driver(ext.image):
                out[i] = to_installed(available[other])
            else:
                older = _older_toolkit(ext, version)
                if older is not None:
                    out[i] = older
    return out


def _older_toolkit(ext: InstalledExtension, version: str) -> InstalledExtension | None:
    """Single-track releases (≤1.7): a mismatch means a toolkit left over from an older release."""
    major, minor = minor_of(version)
    for m in range(minor - 1, 2, -1):
        try:
            older = official_extensions(normalize_talos_version(f"{major}.{m}"))
        except ValueError:
            continue
        for info in older:
            if info["name"].split("/", 1)[-1] == ext.name and driver(info["ref"]) != driver(ext.image):
                return to_installed(info)
    return None


def driver(ref: str) -> str:
    return ref.rpartition(":")[2].split("-", 1)[0]


def _other_track(name: str) -> str:
    if name.endswith("-lts"):
        return name[: -len("-lts")] + "-production"
    if name.endswith("-production"):
        return name[: -len("-production")] + "-lts"
    return name


def default_installer(client_version: str) -> str:
    """``--image`` default of the client: ghcr.io installer up to 1.13, vanilla factory image from 1.14."""
    if minor_of(client_version) >= (1, 14):
        return f"factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC}:{client_version}"
    return f"ghcr.io/siderolabs/installer:{client_version}"


def ext_to_dict(ext: InstalledExtension) -> dict[str, str]:
    return dataclasses.asdict(ext)


def to_installed_ext(data: dict[str, str]) -> InstalledExtension:
    return InstalledExtension(**data)
