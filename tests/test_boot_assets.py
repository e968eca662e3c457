"""Installer images and boot-media URLs for a schematic (facts §2.1)."""

from __future__ import annotations

import pytest

from runbook_lib.errors import PermanentError
from runbook_lib.model.boot_assets import (
    boot_asset_urls,
    boot_assets_markdown,
    installer_image,
    parse_installer_image,
)
from runbook_lib.model.schematic import VANILLA_SCHEMATIC_ID, schematic_for

PUBLIC = "https://factory.talos.dev"
GPU = schematic_for(
    ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/nvidia-container-toolkit-lts"]
).id


@pytest.mark.parametrize(
    ("version", "path"),
    [
        ("v1.6.7", "installer"),
        ("v1.9.6", "installer"),
        ("v1.10.0", "metal-installer"),
        ("v1.14.0", "metal-installer"),
    ],
)
def test_installer_path_depends_on_talos_version(version: str, path: str) -> None:
    assert installer_image(PUBLIC, GPU, version) == f"factory.talos.dev/{path}/{GPU}:{version}"


def test_secureboot_and_platform_variants() -> None:
    assert installer_image(PUBLIC, GPU, "v1.12.7", secureboot=True) == (
        f"factory.talos.dev/metal-installer-secureboot/{GPU}:v1.12.7"
    )
    assert installer_image(PUBLIC, GPU, "v1.12.7", platform="aws").startswith(
        "factory.talos.dev/aws-installer/"
    )
    assert installer_image(PUBLIC, GPU, "v1.8.4", secureboot=True).startswith(
        "factory.talos.dev/installer-secureboot/"
    )


def test_self_hosted_factory_host_keeps_its_port() -> None:
    assert (
        installer_image("http://127.0.0.1:8085/", GPU, "v1.12.7")
        == f"127.0.0.1:8085/metal-installer/{GPU}:v1.12.7"
    )


def test_no_factory_before_talos_1_5_uses_ghcr_installer() -> None:
    assert installer_image(PUBLIC, GPU, "v1.4.8") == "ghcr.io/siderolabs/installer:v1.4.8"
    assert installer_image(None, GPU, "v1.9.0") == "ghcr.io/siderolabs/installer:v1.9.0"
    with pytest.raises(PermanentError, match="no longer published"):
        installer_image(None, GPU, "v1.14.0")
    with pytest.raises(PermanentError, match="secureboot"):
        installer_image(None, GPU, "v1.4.8", secureboot=True)


def test_minor_line_or_bad_id_is_refused() -> None:
    with pytest.raises(PermanentError, match="exact Talos release"):
        installer_image(PUBLIC, GPU, "v1.12")
    with pytest.raises(PermanentError, match="not a schematic ID"):
        installer_image(PUBLIC, "abc", "v1.12.7")


def test_boot_asset_urls_public_factory() -> None:
    urls = boot_asset_urls(PUBLIC, GPU, "v1.12.7")
    assert urls["iso"] == f"https://factory.talos.dev/image/{GPU}/v1.12.7/metal-amd64.iso"
    assert urls["disk_image"] == f"https://factory.talos.dev/image/{GPU}/v1.12.7/metal-amd64.raw.xz"
    assert urls["pxe"] == f"https://pxe.factory.talos.dev/pxe/{GPU}/v1.12.7/metal-amd64"
    assert urls["kernel"].endswith("/kernel-amd64")
    assert urls["initramfs"].endswith("/initramfs-amd64.xz")
    assert urls["installer"] == f"factory.talos.dev/metal-installer/{GPU}:v1.12.7"
    assert "uki" not in urls


def test_boot_asset_urls_secureboot_arm64_self_hosted() -> None:
    urls = boot_asset_urls("http://factory.internal:8080", GPU, "v1.13.2", arch="arm64", secureboot=True)
    assert urls["iso"] == f"http://factory.internal:8080/image/{GPU}/v1.13.2/metal-arm64-secureboot.iso"
    assert urls["uki"].endswith("/metal-arm64-secureboot-uki.efi")
    assert urls["pxe"] == f"http://factory.internal:8080/pxe/{GPU}/v1.13.2/metal-arm64-secureboot"
    assert urls["installer"] == f"factory.internal:8080/metal-installer-secureboot/{GPU}:v1.13.2"


def test_parse_installer_image_round_trips() -> None:
    for version in ("v1.8.4", "v1.12.7"):
        for secureboot in (False, True):
            ref = parse_installer_image(installer_image(PUBLIC, GPU, version, secureboot=secureboot))
            assert (ref.schematic_id, ref.version, ref.secureboot, ref.host) == (
                GPU,
                version,
                secureboot,
                "factory.talos.dev",
            )
    ghcr = parse_installer_image("ghcr.io/siderolabs/installer:v1.11.6")
    assert ghcr.schematic_id is None and ghcr.kind == "ghcr"
    assert parse_installer_image(
        f"factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC_ID}:v1.14.0"
    ).kind == ("metal-installer")
    with pytest.raises(PermanentError):
        parse_installer_image("docker.io/library/busybox:latest")


def test_markdown_has_links_and_copyable_installer() -> None:
    urls = boot_asset_urls(PUBLIC, GPU, "v1.12.7")
    text = boot_assets_markdown(urls)
    assert f"[metal-amd64.iso]({urls['iso']})" in text
    assert f"```\n{urls['installer']}\n```" in text
    assert f"pxe: {urls['pxe']}" in text


def test_parse_installer_image_with_a_dashed_platform() -> None:
    """``digital-ocean`` is a Talos platform name (talos@v1.13.0:internal/app/machined/pkg/runtime/v1alpha1/
    platform/digitalocean/digitalocean.go:35) and the factory serves ``digital-ocean-installer``
    (image-factory@26b95ca:internal/profile/profile.go:54-56)."""
    image = installer_image(PUBLIC, GPU, "v1.12.7", platform="digital-ocean", secureboot=True)
    ref = parse_installer_image(image)
    assert (ref.kind, ref.secureboot, ref.schematic_id) == ("digital-ocean-installer", True, GPU)
