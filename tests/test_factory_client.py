"""The Image Factory client against the simulated factory: success, retries, 4xx, unknown extension,
driver mismatch, stale kernel modules, self-hosted URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.clients.factory import (
    FactoryClient,
    FactoryRefused,
    SchematicRegistration,
    check_registration,
    resolve_against,
)
from runbook_lib.errors import CompatibilityError, PermanentError, RetryableError
from runbook_lib.model.boot_assets import installer_image
from runbook_lib.model.schematic import ExtensionInfo, schematic_for
from runbook_lib.sim import catalog, factory

LTS = ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/nvidia-container-toolkit-lts"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[factory.FactoryServer]:
    with factory.running(tmp_path) as srv:
        yield srv


def _client(server: factory.FactoryServer, **kwargs: float) -> FactoryClient:
    options: dict[str, float] = {"backoff": 0.0, "read_timeout": 5.0, "retries": 3}
    options.update(kwargs)
    return FactoryClient(server.url + "/", **options)  # type: ignore[arg-type]


def test_post_schematic_matches_offline_id(server: factory.FactoryServer) -> None:
    schematic = schematic_for(LTS, ["net.ifnames=0"])
    registration = _client(server).post_schematic(schematic)
    assert registration.id == schematic.id == registration.offline_id
    assert registration.server_canonical_yaml == schematic.canonical_yaml()
    assert _client(server).get_schematic(schematic.id) == schematic.canonical_yaml()
    assert _client(server).get_schematic("f" * 64) is None


def test_post_raw_json_text(server: factory.FactoryServer) -> None:
    text = '{"customization": {"systemExtensions": {"officialExtensions": ["siderolabs/gvisor"]}}}'
    assert _client(server).post_schematic(text).id == schematic_for(["siderolabs/gvisor"]).id


def test_older_factory_without_canonical_field_is_accepted(
    server: factory.FactoryServer, tmp_path: Path
) -> None:
    factory.set_faults(tmp_path, legacy_response=True)
    registration = _client(server).post_schematic(schematic_for(LTS))
    assert registration.server_canonical_yaml is None
    assert registration.id == schematic_for(LTS).id


def test_id_mismatch_is_reported_not_ignored(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, wrong_id=True)
    with pytest.raises(PermanentError) as caught:
        _client(server).post_schematic(schematic_for(LTS))
    assert schematic_for(LTS).id in str(caught.value)
    assert "disagrees" in str(caught.value)


def test_retries_5xx_with_backoff_then_succeeds(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, http_5xx={"count": 2, "status": 503})
    assert "v1.12.7" in _client(server).versions()
    assert [p for _, p in server.requests] == ["/versions"] * 3


def test_gives_up_after_retries_with_a_retryable_error(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, http_5xx={"count": 100, "status": 502})
    with pytest.raises(RetryableError, match="502"):
        _client(server, retries=2).versions()
    assert len(server.requests) == 3


def test_post_is_retried_too(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, http_5xx={"count": 1, "status": 500, "path": "/schematics"})
    assert _client(server).post_schematic(schematic_for(LTS)).id == schematic_for(LTS).id
    assert [m for m, _ in server.requests] == ["POST", "POST"]


def test_connection_errors_and_timeouts_are_retried(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, drop={"count": 2})
    assert _client(server).versions()
    factory.set_faults(tmp_path, delay_seconds=0.6, delay_count=1)
    assert _client(server, read_timeout=0.2).versions()


def test_4xx_is_not_retried_and_shows_the_factory_text(server: factory.FactoryServer) -> None:
    with pytest.raises(FactoryRefused) as caught:
        _client(server).post_schematic("owner: someone\ncustomization: {}\n")
    assert caught.value.status == 400
    assert "schematic owner is only supported on authenticated instances" in str(caught.value)
    assert len(server.requests) == 1
    with pytest.raises(FactoryRefused, match=r"version v1\.2\.0 not found") as refused:
        _client(server).official_extensions("v1.2.0")
    assert "builds nothing for Talos 1.2" in str(refused.value)
    with pytest.raises(FactoryRefused) as refused:
        _client(server).official_extensions("v1.12.99")
    assert "v1.12.11" in str(refused.value)  # the hint names releases of that line it does know


def test_unreachable_factory_is_retryable() -> None:
    client = FactoryClient("http://127.0.0.1:9", retries=1, backoff=0.0, connect_timeout=0.5)
    with pytest.raises(RetryableError, match="did not answer"):
        client.versions()


def test_resolve_extensions_gives_exact_refs(server: factory.FactoryServer) -> None:
    resolved = _client(server).resolve_extensions([*LTS, "siderolabs/iscsi-tools"], "v1.12.7")
    # extensions@v1.12.7 nvidia-gpu/vars.yaml: LTS driver 580.126.20, toolkit v1.18.2 (sim/catalog.py)
    assert resolved.refs[0] == "ghcr.io/siderolabs/nvidia-open-gpu-kernel-modules-lts:580.126.20-v1.12.7"
    assert resolved.refs[1] == "ghcr.io/siderolabs/nvidia-container-toolkit-lts:580.126.20-v1.18.2"
    assert resolved.refs[2].startswith("ghcr.io/siderolabs/iscsi-tools:")
    assert resolved.driver == "580.126.20"


def test_unknown_extension_fails_with_close_names(server: factory.FactoryServer) -> None:
    old_names = ["siderolabs/nvidia-open-gpu-kernel-modules", "siderolabs/nvidia-container-toolkit"]
    with pytest.raises(PermanentError) as caught:
        _client(server).resolve_extensions(old_names, "v1.12.7")
    message = str(caught.value)
    for name in old_names:  # both reported at once
        assert f"{name} does not exist for Talos v1.12.7" in message
    assert "siderolabs/nvidia-open-gpu-kernel-modules-lts" in message
    assert "siderolabs/nvidia-container-toolkit-production" in message
    assert (caught.value.hint or "").startswith(
        "choose a driver_flavor (and from Talos 1.8 a track) the release"
    )
    assert "extra_extensions" not in (caught.value.hint or "")


def test_a_misspelt_extra_extension_is_answered_with_the_parameter_to_correct(
    server: factory.FactoryServer,
) -> None:
    """A typo in extra_extensions got only "official names change with the Talos version", and the user looked
    at tracks (cloud-user walkthrough, 7 Dec 2026)."""
    with pytest.raises(PermanentError) as caught:
        _client(server).resolve_extensions([*LTS, "siderolabs/drdb"], "v1.12.7")
    assert (
        "siderolabs/drdb does not exist for Talos v1.12.7 (did you mean siderolabs/drbd"
        in caught.value.message
    )
    assert (caught.value.hint or "").startswith(
        "correct the name in extra_extensions or the node's overrides"
    )
    # close by the name after the publisher, which every official name shares (walkthrough, stop 52: the shared
    # "siderolabs/" made siderolabs/gvisor and siderolabs/amd-ucode "close" to siderolabs/nvidia-nope)
    with pytest.raises(PermanentError) as caught:
        resolve_against(catalog.official_extensions("v1.12.7"), ["siderolabs/nvidia-nope"], "v1.12.7")
    assert "gvisor" not in caught.value.message and "amd-ucode" not in caught.value.message, (
        caught.value.message
    )
    assert "(did you mean siderolabs/" in caught.value.message and "nvidia" in caught.value.message
    # a fabric manager is an extra extension, not a track's; with a toolkit missing too, both are said (review)
    with pytest.raises(PermanentError) as caught:
        _client(server).resolve_extensions(
            [LTS[0], "siderolabs/nvidia-container-toolkit-xx", "siderolabs/nvidia-fabricmanager"], "v1.12.7"
        )
    hint = caught.value.hint or ""
    assert "choose a driver_flavor" in hint and "correct the name in extra_extensions" in hint, hint


def test_extension_missing_for_that_version_only(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, missing_extensions={"v1.12.7": [LTS[1]]})
    with pytest.raises(
        PermanentError, match=r"nvidia-container-toolkit-lts does not exist for Talos v1\.12\.7"
    ):
        _client(server).resolve_extensions(LTS, "v1.12.7")
    assert _client(server).resolve_extensions(LTS, "v1.12.6").driver == "580.105.08"


def test_driver_mismatch_between_tracks_fails(server: factory.FactoryServer) -> None:
    mixed = [LTS[0], "siderolabs/nvidia-container-toolkit-production"]
    with pytest.raises(CompatibilityError, match="driver mismatch"):
        _client(server).resolve_extensions(mixed, "v1.12.7")


def test_kmod_built_for_another_release_fails(server: factory.FactoryServer, tmp_path: Path) -> None:
    factory.set_faults(tmp_path, kmod_built_for={"v1.12.7": "v1.12.6"})
    with pytest.raises(CompatibilityError, match=r"built for Talos v1\.12\.6"):
        _client(server).resolve_extensions(LTS, "v1.12.7")


def test_kmod_without_toolkit_is_refused() -> None:
    kmod = ExtensionInfo(LTS[0], f"ghcr.io/siderolabs/{LTS[0].split('/')[1]}:580.105.08-v1.12.7", "sha256:0")
    with pytest.raises(CompatibilityError, match="without the NVIDIA container toolkit"):
        resolve_against([kmod], [LTS[0]], "v1.12.7")


def test_self_hosted_factory_url_everywhere(server: factory.FactoryServer) -> None:
    """The URL parameter is all it takes: API calls and installer references use that host."""
    client = _client(server)
    schematic_id = client.post_schematic(schematic_for(LTS)).id
    image = installer_image(server.url, schematic_id, "v1.12.7")
    host = server.url.removeprefix("http://")
    assert image == f"{host}/metal-installer/{schematic_id}:v1.12.7"
    with pytest.raises(PermanentError, match="not an http"):
        FactoryClient("factory.internal")


def test_canonical_text_mismatch_alone_is_reported() -> None:
    schematic = schematic_for(LTS)
    registration = SchematicRegistration(
        id=schematic.id,
        offline_id=schematic.id,
        canonical_yaml=schematic.canonical_yaml(),
        server_canonical_yaml=schematic.canonical_yaml().replace("    ", "  "),
    )
    with pytest.raises(PermanentError, match="canonical schematic differs") as caught:
        check_registration("http://factory.example", registration)
    assert "+++ factory" in str(caught.value)


def _info(name: str, tag: str) -> ExtensionInfo:
    return ExtensionInfo(name, f"ghcr.io/{name}:{tag}", "sha256:0")


def test_fabric_manager_of_another_driver_is_refused_before_any_change() -> None:
    """The fabric manager "has to match with the NVIDIA driver version in use" (siderolabs/talos v1.9.0
    website/content/v1.9/talos-guides/configuration/nvidia-fabricmanager.md:13; the same in
    siderolabs/docs public/talos/v1.12/.../nvidia-fabricmanager.mdx).  Its tag is the driver alone
    (``VERSION: "{{ .NVIDIA_DRIVER_LTS_VERSION }}"``, siderolabs/extensions v1.13.0
    nvidia-gpu/nvidia-fabricmanager/lts/vars.yaml)."""
    kmod = _info(LTS[0], "580.105.08-v1.12.7")
    toolkit = _info(LTS[1], "580.105.08-v1.18.1")
    other = _info("siderolabs/nvidia-fabricmanager-production", "590.44.01")
    wanted = [LTS[0], LTS[1], other.name]
    with pytest.raises(CompatibilityError, match=r"nvidia-fabricmanager-production 590\.44\.01") as caught:
        resolve_against([kmod, toolkit, other], wanted, "v1.12.7")
    # the image step records the error's hint as its fix: it was empty (review of 1932525)
    assert "extra_extensions" in caught.value.hint and "driver_flavor and track" in caught.value.hint
    same = _info("siderolabs/nvidia-fabricmanager-lts", "580.105.08")
    resolved = resolve_against([kmod, toolkit, same], [LTS[0], LTS[1], same.name], "v1.12.7")
    assert resolved.driver == "580.105.08"
