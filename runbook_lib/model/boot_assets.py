"""Where the installer and boot media for a schematic live (Image Factory paths, facts §2.1).

Why: ``talosctl upgrade`` needs the *installer image* of the GPU schematic (never the default image, which
drops the NVIDIA extensions), and new GPU machines need an ISO / disk image / PXE script with the same
extensions.  The spelling of these references changed over time (``installer/`` in the Talos 1.6–1.9 docs,
``metal-installer/`` from 1.10; no factory before Talos 1.5, where ``ghcr.io/siderolabs/installer`` is the
only choice), works against self-hosted factories (a URL parameter), and has secureboot variants.  Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runbook_lib.errors import PermanentError

from .versions import TalosVersion

PUBLIC_FACTORY_URL = "https://factory.talos.dev"
PUBLIC_PXE_URL = "https://pxe.factory.talos.dev"
GHCR_INSTALLER = "ghcr.io/siderolabs/installer"

#: Disk image suffix per platform (factory paths ``<platform>-<arch>[-secureboot].<suffix>``).
DISK_IMAGE_SUFFIX: dict[str, str] = {
    "metal": "raw.xz",
    "nocloud": "raw.xz",
    "openstack": "raw.xz",
    "aws": "raw.xz",
    "gcp": "raw.tar.gz",
    "azure": "vhd.xz",
    "vmware": "ova",
}
ARCHES = ("amd64", "arm64")

# The model layer stays free of I/O modules (urllib included), so URLs are split with a regex.
_URL_RE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://)?(?:[^@/\s]*@)?(?P<host>[^/\s?#@]+)")
_INSTALLER_RE = re.compile(
    r"^(?P<host>[^/]+)/(?:(?P<platform>[a-z0-9]+(?:-[a-z0-9]+)*)-)?installer(?P<secureboot>-secureboot)?/"
    r"(?P<id>[0-9a-f]{64}):(?P<version>\S+)$"
)


def _release(talos_version: TalosVersion | str) -> TalosVersion:
    talos = talos_version if isinstance(talos_version, TalosVersion) else TalosVersion.parse(talos_version)
    if not talos.is_release:
        raise PermanentError(
            f"installers and boot images need an exact Talos release, not the minor line {talos}",
            hint=f"use e.g. {talos}.0",
        )
    return talos


def factory_has_images(talos_version: TalosVersion | str) -> bool:
    """The Image Factory builds Talos 1.5 and later; older releases install extensions another way."""
    return _release(talos_version).at_least(1, 5)


def factory_host(factory_url: str) -> str:
    """The registry host of a factory URL (``https://factory.talos.dev`` → ``factory.talos.dev``)."""
    match = _URL_RE.match(factory_url.strip())
    if not match:
        raise PermanentError(f"{factory_url!r} is not a URL", hint="e.g. https://factory.talos.dev")
    return match["host"]


#: An Image Factory URL the runbook accepts (the parameters' ``image_factory_url``, ``runbook diagnose``'s flag).
_FACTORY_URL_RE = re.compile(r"^https?://[^\s/]+")
#: Its parts a printed command may show: scheme, host (with port) and path; not credentials, query or fragment.
_SHOWN_URL_RE = re.compile(r"^(?P<scheme>https?)://(?:[^@/\s]*@)?(?P<host>[^/\s?#@]+)(?P<path>[^\s?#]*)")


def is_factory_url(url: str) -> bool:
    """An http(s) URL with a host: what ``image_factory_url`` must be."""
    return bool(_FACTORY_URL_RE.match(url))


def schematics_url(factory_url: str) -> str:
    """Where to POST a schematic, as a fix prints it: the factory URL without credentials, query or fragment (a
    fix is printed and recorded; ``https://user:pass@factory/`` must not be)."""
    match = _SHOWN_URL_RE.match(factory_url.strip())
    shown = (
        f"{match['scheme']}://{match['host']}{match['path']}"
        if match
        else f"https://{factory_host(factory_url)}"
    )
    return f"{shown.rstrip('/')}/schematics"


def _base(factory_url: str) -> str:
    url = factory_url if "://" in factory_url else f"https://{factory_url}"
    return url.rstrip("/")


#: An image repository path component (OCI distribution spec): lowercase letters and digits, '-' inside.
_PLATFORM_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def installer_kind(talos_version: TalosVersion | str, platform: str = "metal") -> str:
    """``installer`` (Talos 1.5–1.9 docs) or ``<platform>-installer`` (1.10 and later), facts §2.1.

    The platform is the node's (``talosctl get platformmetadata``): the factory serves any
    ``<platform>-installer`` (image-factory internal/frontend/http/registry.go:74-100), e.g.
    ``aws-installer`` as the docs upgrade AWS nodes with (docs v1.12 boot-assets.mdx:243-249).
    """
    talos = _release(talos_version)
    if not talos.at_least(1, 10):
        return "installer"
    if not _PLATFORM_RE.match(platform):
        raise PermanentError(
            f"no Image Factory installer can be named for platform {platform!r}: an image name has only "
            "lowercase letters, digits and '-'",
            hint="upgrade this node by hand with the installer its platform documents",
        )
    return f"{platform}-installer"


def installer_image(
    factory_url: str | None,
    schematic_id: str,
    talos_version: TalosVersion | str,
    *,
    secureboot: bool = False,
    platform: str = "metal",
) -> str:
    """The installer image to pass to ``talosctl upgrade --image`` for this schematic and release.

    ``factory_url=None`` or a Talos release older than 1.5 gives ``ghcr.io/siderolabs/installer:<ver>``
    (no schematic: extensions then come from ``machine.install.extensions``).
    """
    talos = _release(talos_version)
    if factory_url is None or not talos.at_least(1, 5):
        if secureboot:
            raise PermanentError(
                f"no secureboot installer exists for Talos {talos} without the Image Factory",
                hint="secureboot installers come from the Image Factory (Talos 1.5 and later)",
            )
        if talos.at_least(1, 14):
            raise PermanentError(
                f"{GHCR_INSTALLER} is no longer published for Talos {talos}",
                hint="use the Image Factory installer (factory.talos.dev/metal-installer/<schematic>)",
            )
        return f"{GHCR_INSTALLER}:{talos}"
    _check_id(schematic_id)
    suffix = "-secureboot" if secureboot else ""
    return f"{factory_host(factory_url)}/{installer_kind(talos, platform)}{suffix}/{schematic_id}:{talos}"


def _check_id(schematic_id: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{64}", schematic_id):
        raise PermanentError(
            f"{schematic_id!r} is not a schematic ID", hint="a schematic ID is 64 hex digits"
        )


def boot_asset_urls(
    factory_url: str,
    schematic_id: str,
    talos_version: TalosVersion | str,
    *,
    arch: str = "amd64",
    platform: str = "metal",
    secureboot: bool = False,
    pxe_url: str | None = None,
) -> dict[str, str]:
    """Download URLs for the schematic's boot media, keyed ``iso``, ``disk_image``, ``pxe``, ``kernel``,
    ``initramfs``, ``cmdline``, ``installer`` (and ``uki`` for secureboot).

    PXE is served from ``pxe.factory.talos.dev`` for the public factory; a self-hosted factory serves
    ``/pxe/`` itself unless ``pxe_url`` says otherwise.
    """
    talos = _release(talos_version)
    if not talos.at_least(1, 5):
        raise PermanentError(
            f"the Image Factory does not build boot media for Talos {talos}",
            hint="boot media for Talos before 1.5 come from the GitHub release assets",
        )
    if arch not in ARCHES:
        raise PermanentError(f"unknown architecture {arch!r}", hint=f"one of: {', '.join(ARCHES)}")
    _check_id(schematic_id)
    base = _base(factory_url)
    sb = "-secureboot" if secureboot else ""
    image = f"{base}/image/{schematic_id}/{talos}"
    if pxe_url is None:
        pxe_url = PUBLIC_PXE_URL if factory_host(factory_url) == factory_host(PUBLIC_FACTORY_URL) else base
    urls = {
        "iso": f"{image}/{platform}-{arch}{sb}.iso",
        "disk_image": f"{image}/{platform}-{arch}{sb}.{DISK_IMAGE_SUFFIX.get(platform, 'raw.xz')}",
        "pxe": f"{pxe_url.rstrip('/')}/pxe/{schematic_id}/{talos}/{platform}-{arch}{sb}",
        "kernel": f"{image}/kernel-{arch}",
        "initramfs": f"{image}/initramfs-{arch}.xz",
        "cmdline": f"{image}/cmdline-{platform}-{arch}{sb}",
        "installer": installer_image(
            factory_url, schematic_id, talos, secureboot=secureboot, platform=platform
        ),
    }
    if secureboot:
        urls["uki"] = f"{image}/{platform}-{arch}{sb}-uki.efi"
    return urls


@dataclass(frozen=True)
class InstallerRef:
    """A parsed installer image reference."""

    host: str
    kind: str
    """``installer``, ``<platform>-installer``, or ``ghcr`` for ``ghcr.io/siderolabs/installer``."""
    secureboot: bool
    schematic_id: str | None
    """``None`` for the ghcr.io installer (the vanilla image before Talos 1.14)."""
    version: str


def parse_installer_image(image: str) -> InstallerRef:
    """Split an installer reference; raises :class:`PermanentError` for anything else."""
    image = image.strip()
    if image.startswith(GHCR_INSTALLER + ":"):
        return InstallerRef(
            host="ghcr.io", kind="ghcr", secureboot=False, schematic_id=None, version=image.split(":", 1)[1]
        )
    match = _INSTALLER_RE.match(image)
    if not match:
        raise PermanentError(
            f"{image!r} is not an installer image",
            hint="expected <factory host>/[<platform>-]installer[-secureboot]/<schematic id>:<talos version>",
        )
    platform = match["platform"]
    return InstallerRef(
        host=match["host"],
        kind=f"{platform}-installer" if platform else "installer",
        secureboot=bool(match["secureboot"]),
        schematic_id=match["id"],
        version=match["version"],
    )


_LABELS = {
    "iso": "ISO",
    "disk_image": "Disk image",
    "pxe": "PXE (iPXE script)",
    "kernel": "Kernel",
    "initramfs": "Initramfs",
    "cmdline": "Kernel command line",
    "uki": "Unified kernel image (secureboot)",
}


def boot_assets_markdown(urls: dict[str, str]) -> str:
    """Boot media as Markdown: clickable links, then every URL and the installer as copyable text.

    Notebooks render this with ``IPython.display.Markdown``; the CLI can print it as it is.
    """
    lines = ["| Asset | Link |", "|---|---|"]
    for key, label in _LABELS.items():
        if key in urls:
            lines.append(f"| {label} | [{urls[key].rsplit('/', 1)[-1]}]({urls[key]}) |")
    copy = [f"{key}: {url}" for key, url in urls.items() if key != "installer"]
    lines += ["", "Installer image (for `talosctl upgrade --image`):", "", "```", urls["installer"], "```"]
    lines += ["", "All URLs:", "", "```", *copy, "```", ""]
    return "\n".join(lines)
