"""The simulated Image Factory speaks the real protocol (facts §2.1) and its faults can be switched on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from runbook_lib.model.schematic import parse_schematic
from runbook_lib.model.versions import TalosVersion, check_extension_tags
from runbook_lib.sim import catalog, factory
from runbook_lib.sim.state import LATEST_PATCH

LTS = ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/nvidia-container-toolkit-lts"]
GPU_YAML = yaml.safe_dump({"customization": {"systemExtensions": {"officialExtensions": LTS}}}).encode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[factory.FactoryServer]:
    with factory.running(tmp_path) as srv:
        yield srv


def _post(server: factory.FactoryServer, body: bytes) -> requests.Response:
    return requests.post(
        f"{server.url}/schematics", data=body, headers={"Content-Type": "application/yaml"}, timeout=5
    )


def test_post_schematic_answers_201_with_id_and_canonical_yaml(server: factory.FactoryServer) -> None:
    response = _post(server, GPU_YAML)
    assert response.status_code == 201
    assert response.headers["Content-Type"] == "application/json"
    data = response.json()
    assert data["id"] == parse_schematic(GPU_YAML).id
    assert data["schematic"] == parse_schematic(GPU_YAML).canonical_yaml()
    again = requests.get(f"{server.url}/schematics/{data['id']}", timeout=5)
    assert again.status_code == 200
    assert again.headers["Content-Type"] == "application/yaml"
    assert again.text == data["schematic"]


def test_json_body_gets_the_same_id(server: factory.FactoryServer) -> None:
    as_json = json.dumps(yaml.safe_load(GPU_YAML)).encode()
    assert _post(server, as_json).json()["id"] == _post(server, GPU_YAML).json()["id"]


def test_invalid_schematic_is_400_plain_text(server: factory.FactoryServer) -> None:
    response = _post(server, b"customization:\n  systemExtension: {}\n")
    assert response.status_code == 400
    assert response.headers["Content-Type"].startswith("text/plain")
    assert response.text.endswith("\n")
    assert "field systemExtension not found in type schematic.Customization" in response.text


def test_unknown_names_are_accepted_at_post_but_fail_at_build(server: factory.FactoryServer) -> None:
    body = b"customization:\n  systemExtensions:\n    officialExtensions: [siderolabs/nvidia-open-gpu-kernel-modules]\n"
    schematic_id = _post(server, body).json()["id"]
    image = requests.get(f"{server.url}/image/{schematic_id}/v1.12.7/metal-amd64.iso", timeout=5)
    assert image.status_code == 400
    assert image.text == (
        'official extension "siderolabs/nvidia-open-gpu-kernel-modules" is not available for Talos version v1.12.7\n'
    )


def test_unknown_schematic_and_version_are_404(server: factory.FactoryServer) -> None:
    missing = requests.get(f"{server.url}/schematics/{'0' * 64}", timeout=5)
    assert missing.status_code == 404
    assert missing.text.endswith("\n")
    assert requests.get(f"{server.url}/version/v9.9.9/extensions/official", timeout=5).status_code == 404


def test_vanilla_schematic_is_always_known(server: factory.FactoryServer) -> None:
    vanilla = requests.get(f"{server.url}/schematics/{catalog.VANILLA_SCHEMATIC_ID}", timeout=5)
    assert vanilla.text == "customization: {}\n"


def test_versions_list_factory_releases(server: factory.FactoryServer) -> None:
    versions = requests.get(f"{server.url}/versions", timeout=5).json()
    assert "v1.5.0" in versions and "v1.12.7" in versions and "v1.14.0" in versions
    assert "v1.4.8" not in versions  # the factory builds Talos 1.5 and later
    # of the pre-releases only the newest line's alpha and beta (image-factory internal/artifacts/versions.go)
    assert "v1.12.0-beta.0" not in versions and "v1.14.0-rc.1" not in versions
    assert (
        requests.get(f"{server.url}/version/v1.14.0-rc.1/extensions/official", timeout=5).status_code == 200
    )
    assert requests.get(f"{server.url}/versions?broken=true", timeout=5).json() == []


@pytest.mark.parametrize(
    "version", ["v1.5.5", "v1.7.7", "v1.8.4", "v1.11.6", "v1.12.7", "v1.13.2", "v1.14.0"]
)
def test_catalog_nvidia_tags_are_consistent_per_version(server: factory.FactoryServer, version: str) -> None:
    """Kernel modules carry the release, kmod and toolkit share the driver: what the facts tables say."""
    entries = requests.get(f"{server.url}/version/{version}/extensions/official", timeout=5).json()
    by_name = {e["name"]: e for e in entries}
    assert set(by_name["siderolabs/amd-ucode"]) == {"name", "ref", "digest", "author", "description"}
    modern = TalosVersion.parse(version).at_least(1, 8)
    suffixes = ["-lts", "-production"] if modern else [""]
    for suffix in suffixes:
        kmod = by_name[f"siderolabs/nvidia-open-gpu-kernel-modules{suffix}"]
        toolkit = by_name[f"siderolabs/nvidia-container-toolkit{suffix}"]
        assert kmod["ref"].startswith(f"ghcr.io/siderolabs/nvidia-open-gpu-kernel-modules{suffix}:")
        result = check_extension_tags(
            kmod["ref"].rsplit(":", 1)[1], toolkit["ref"].rsplit(":", 1)[1], version
        )
        assert result.ok, result.problems
    if not modern:
        assert "siderolabs/nvidia-open-gpu-kernel-modules-lts" not in by_name
    else:
        assert "siderolabs/nvidia-open-gpu-kernel-modules" not in by_name


def test_facts_example_versions() -> None:
    """Spot values straight from the facts tables (§1.2): 1.12.0 LTS driver and toolkit, 1.12.7 production; 1.12.7's
    LTS driver from siderolabs/extensions@v1.12.7 nvidia-gpu/vars.yaml (580.126.20, not 1.12.0's 580.105.08)."""
    tags = {e.name: e.tag for e in catalog.official_extensions("v1.12.0")}
    assert tags["siderolabs/nvidia-container-toolkit-lts"] == "580.105.08-v1.18.1"
    assert tags["siderolabs/nvidia-open-gpu-kernel-modules-lts"] == "580.105.08-v1.12.0"
    tags = {e.name: e.tag for e in catalog.official_extensions("v1.12.7")}
    assert tags["siderolabs/nvidia-container-toolkit-production"] == "570.211.01-v1.18.2"
    assert tags["siderolabs/nvidia-fabricmanager-lts"] == "580.126.20"
    assert tags["siderolabs/nvidia-open-gpu-kernel-modules-lts"] == "580.126.20-v1.12.7"


EXTENSIONS_MIRROR = Path("/work/.mirror/siderolabs+extensions/repo")


def test_the_patch_a_bare_minor_means_carries_its_tag_s_nvidia_versions() -> None:
    """The simulated factory gave v1.13.9 (what ``1.13`` means) v1.13.0's drivers, 580.126.20 / 595.58.03, where
    siderolabs/extensions@v1.13.9 nvidia-gpu/vars.yaml has 580.178.04 / 595.91.07 (simulator audit, stop 52). Read
    from a git mirror of siderolabs/extensions (the project's ``fetch`` tool makes one); skipped without it."""
    import re
    import subprocess

    if not EXTENSIONS_MIRROR.is_dir():
        pytest.skip(
            f"no siderolabs/extensions mirror at {EXTENSIONS_MIRROR}: the tags' vars.yaml cannot be read"
        )
    checked = []
    for tag in LATEST_PATCH.values():
        shown = subprocess.run(
            ["git", "-C", str(EXTENSIONS_MIRROR), "show", f"{tag}:nvidia-gpu/vars.yaml"],
            capture_output=True,
            check=False,
            text=True,
        )
        if shown.returncode != 0:
            continue  # a tag the mirror does not have (v1.14.0: none here)

        def value(key: str, text: str = shown.stdout) -> str | None:
            found = re.search(rf"^{key}: (\S+)", text, re.M)
            return found[1] if found else None

        lts = value("NVIDIA_DRIVER_LTS_VERSION") or value("NVIDIA_DRIVER_VERSION")
        assert catalog.nvidia_versions(tag) == (
            lts,
            value("NVIDIA_DRIVER_PRODUCTION_VERSION"),
            value("CONTAINER_TOOLKIT_VERSION"),
        ), tag
        checked.append(tag)
    assert "v1.13.9" in checked, checked


def test_image_pxe_and_registry_endpoints(server: factory.FactoryServer) -> None:
    schematic_id = _post(server, GPU_YAML).json()["id"]
    base = f"{server.url}/image/{schematic_id}/v1.12.7"
    assert requests.head(f"{base}/metal-amd64.iso", timeout=5).status_code == 200
    assert requests.get(f"{base}/metal-arm64-secureboot.raw.xz", timeout=5).status_code == 200
    assert requests.get(f"{base}/not-an-asset", timeout=5).status_code == 404
    pxe = requests.get(f"{server.url}/pxe/{schematic_id}/v1.12.7/metal-amd64", timeout=5)
    assert pxe.text.startswith("#!ipxe\n") and f"{base}/kernel-amd64" in pxe.text
    manifest = f"{server.url}/v2/metal-installer/{schematic_id}/manifests/v1.12.7"
    assert requests.head(manifest, timeout=5).status_code == 200


def test_fault_5xx_for_n_requests_then_recovers(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, http_5xx={"count": 2, "status": 503})
    codes = [requests.get(f"{server.url}/versions", timeout=5).status_code for _ in range(3)]
    assert codes == [503, 503, 200]


def test_fault_missing_extension_for_one_version(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, missing_extensions={"v1.12.7": [LTS[1]]})
    names = {
        e["name"] for e in requests.get(f"{server.url}/version/v1.12.7/extensions/official", timeout=5).json()
    }
    assert LTS[1] not in names and LTS[0] in names
    names = {
        e["name"] for e in requests.get(f"{server.url}/version/v1.12.6/extensions/official", timeout=5).json()
    }
    assert LTS[1] in names


def test_fault_delay_makes_clients_time_out(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, delay_seconds=0.5, delay_count=1)
    with pytest.raises(requests.Timeout):
        requests.get(f"{server.url}/versions", timeout=0.1)
    assert requests.get(f"{server.url}/versions", timeout=5).status_code == 200


def test_fault_legacy_response_and_drop(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, legacy_response=True)
    assert set(_post(server, GPU_YAML).json()) == {"id"}
    factory.set_faults(tmp_path, drop={"count": 1})
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.url}/versions", timeout=5)
    assert requests.get(f"{server.url}/versions", timeout=5).status_code == 200


def test_set_faults_keeps_other_rooms_sections(tmp_path: Path) -> None:
    (tmp_path / "faults.json").write_text(json.dumps({"kube": {"x": 1}}))
    factory.set_faults(tmp_path, wrong_id=True)
    data = json.loads((tmp_path / "faults.json").read_text())
    assert data == {"kube": {"x": 1}, "factory": {"wrong_id": True}}


def test_installer_extensions_for_the_simulated_upgrade(tmp_path: Path) -> None:
    schematic_id = catalog.schematic_store(tmp_path).put(GPU_YAML)
    exts = catalog.installer_extensions(tmp_path, schematic_id, "v1.12.7")
    assert [e.name for e in exts] == LTS  # schematic order
    assert exts[0].tag == "580.126.20-v1.12.7"
    factory.set_faults(tmp_path, missing_extensions={"*": [LTS[0]]})
    with pytest.raises(catalog.ExtensionUnavailable, match=r"is not available for Talos version v1\.12\.7"):
        catalog.installer_extensions(tmp_path, schematic_id, "v1.12.7")


def test_factory_knows_every_release_the_simulated_cluster_defaults_to() -> None:
    """A simulated node created with a bare minor (``1.12``) must be upgradable through the factory."""
    known = set(catalog.talos_versions())
    for release in LATEST_PATCH.values():
        assert release in known
        assert catalog.official_extensions(release)


def test_store_survives_schematics_go_yaml_cannot_read_back(tmp_path: Path) -> None:
    store = catalog.schematic_store(tmp_path)
    body = json.dumps({"customization": {"extraKernelArgs": [" lead\nline"], "systemExtensions": {}}})
    schematic_id = store.put(body)
    assert store.get(schematic_id) == {"customization": {"extraKernelArgs": [" lead\nline"]}}
    assert store.get_yaml(schematic_id) == parse_schematic(body).canonical_yaml()


def test_a_restarted_factory_keeps_its_address_unless_another_took_it(tmp_path: Path) -> None:
    """The installer a plan names contains the factory's address (the real one has one: factory.talos.dev); a
    simulated factory on a new port at each start made a plan and the run that applied it name different
    installers (operator walkthrough). A port taken meanwhile is replaced, not an error."""
    import socket

    with factory.running(tmp_path) as first:
        url = first.url
    with factory.running(tmp_path) as again:
        assert again.url == url
    with socket.create_server(("127.0.0.1", int(url.rsplit(":", 1)[1]))), factory.running(tmp_path) as moved:
        assert moved.url != url and requests.get(f"{moved.url}/versions", timeout=5).ok
    with factory.running(tmp_path) as last:
        assert last.url == moved.url  # the new port is the one remembered now


def test_the_proprietary_modules_are_offered_from_talos_1_5_as_the_extensions_repository_publishes_them() -> (
    None
):
    """extensions@v1.4.8 nvidia-gpu/ holds nvidia-container-toolkit, nvidia-fabricmanager and nvidia-modules only;
    nonfree/kmod-nvidia appears at v1.5.0 (simulator audit, stop 52: the catalog offered it from 1.4.8)."""
    assert "siderolabs/nonfree-kmod-nvidia" not in {e.name for e in catalog.official_extensions("v1.4.8")}
    assert "siderolabs/nonfree-kmod-nvidia" in {e.name for e in catalog.official_extensions("v1.5.0")}
