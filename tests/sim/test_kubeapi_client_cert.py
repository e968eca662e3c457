"""The admin kubeconfig a simulated control-plane node hands out through the Talos API (issue 14).

talosctl 1.14's upgrade drain fetches the admin kubeconfig from its endpoint and refuses any that does not have
the structure Talos generates (talos@v1.14.1 pkg/kubeconfig/validate.go:29 ErrInvalidKubeconfig; validateAuthInfo
:149-176: a client certificate and its key, no token; validateContext :180-200: namespace "default"; exactly one
cluster, user and context :79-103). Talos generates it with a client certificate CN=admin, O=system:masters
(pkg/kubeconfig/generate.go:35-52, 80-93; pkg/machinery/constants/constants.go:268-275), which kube-apiserver's
--client-ca-file authenticates as a member of system:masters, the cluster admin. The Python API does the same.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from runbook_lib.notebook.records import secret_values
from runbook_lib.sim import cluster
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import talos_kubeconfig_path


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, server.KubeServer]]:
    state = tmp_path_factory.mktemp("client-cert")
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="1.14"))
    srv = server.serve_in_thread(state, start_controllers=False)
    try:
        yield state, srv
    finally:
        srv.shutdown()
        srv.server_close()


def _talos_kubeconfig(state: Path) -> dict[str, object]:
    doc = yaml.safe_load(talos_kubeconfig_path(state).read_text())
    assert isinstance(doc, dict)
    return doc


def _pem_files(tmp_path: Path, user: dict[str, str]) -> tuple[str, str]:
    crt, key = tmp_path / "c.crt", tmp_path / "c.key"
    crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    return str(crt), str(key)


def test_the_talos_kubeconfig_has_the_structure_talosctl_1_14_accepts(
    api: tuple[Path, server.KubeServer],
) -> None:
    """One cluster with its CA, one user with a client certificate and key and nothing else (validate.go
    rejects a token), one context in namespace default, current; the certificate says CN=admin, O=system:masters
    as Talos's (generate.go)."""
    state, srv = api
    doc = _talos_kubeconfig(state)
    clusters, users, contexts = doc["clusters"], doc["users"], doc["contexts"]
    assert isinstance(clusters, list) and isinstance(users, list) and isinstance(contexts, list)
    assert len(clusters) == len(users) == len(contexts) == 1
    assert clusters[0]["cluster"]["server"] == srv.url
    assert clusters[0]["cluster"]["certificate-authority-data"]
    assert set(users[0]["user"]) == {"client-certificate-data", "client-key-data"}
    assert contexts[0]["context"]["namespace"] == "default"
    assert doc["current-context"] == contexts[0]["name"]
    cert = base64.b64decode(users[0]["user"]["client-certificate-data"])
    subject = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253"],
        input=cert,
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert subject.strip() == "subject=CN=admin,O=system:masters", subject


def test_the_api_server_authenticates_the_client_certificate_as_the_admin(
    api: tuple[Path, server.KubeServer], tmp_path: Path
) -> None:
    """The certificate alone (no token) lists nodes; with no credentials the same request is 401."""
    state, srv = api
    user = _talos_kubeconfig(state)["users"][0]["user"]  # type: ignore[index]
    ca = str(state / "kube" / "apiserver.crt")
    url = f"{srv.url}/api/v1/nodes"
    with_cert = requests.get(url, cert=_pem_files(tmp_path, user), verify=ca, timeout=10)
    assert with_cert.status_code == 200, with_cert.text
    assert with_cert.json()["kind"] == "NodeList"
    assert requests.get(url, verify=ca, timeout=10).status_code == 401


def test_a_client_certificate_from_another_ca_is_not_the_admin(
    api: tuple[Path, server.KubeServer], tmp_path: Path
) -> None:
    """A certificate saying O=system:masters but signed by a CA the API server does not trust is refused at the
    handshake or answered 401, never served."""
    state, srv = api
    other = server.openssl_keypair(tmp_path, "other", ["-subj", "/O=system:masters/CN=admin"])
    assert other is not None
    crt, key = other
    ca = str(state / "kube" / "apiserver.crt")
    try:
        answer = requests.get(f"{srv.url}/api/v1/nodes", cert=(str(crt), str(key)), verify=ca, timeout=10)
    except requests.exceptions.SSLError:
        return
    assert answer.status_code == 401, answer.text


def test_the_bearer_token_kubeconfig_still_works(api: tuple[Path, server.KubeServer]) -> None:
    """Other clients (the runbook, kubectl, helm) keep the token kubeconfig."""
    state, srv = api
    user = yaml.safe_load(server.kubeconfig_path(state).read_text())["users"][0]["user"]
    ca = str(state / "kube" / "apiserver.crt")
    headers = {"Authorization": f"Bearer {user['token']}"}
    answer = requests.get(f"{srv.url}/api/v1/nodes", headers=headers, verify=ca, timeout=10)
    assert answer.status_code == 200, answer.text


def test_change_records_redact_the_client_key(api: tuple[Path, server.KubeServer]) -> None:
    """The key's PEM lines are among the secrets records scrub (records.secret_values) when this kubeconfig is
    one of the configured files."""
    state, _ = api
    user = _talos_kubeconfig(state)["users"][0]["user"]  # type: ignore[index]
    pem = base64.b64decode(user["client-key-data"]).decode().splitlines()
    body = {line for line in pem if not line.startswith("-----")}
    # counts only in the assertion: a failure must not print the key
    lines, unredacted = len(body), len(body - set(secret_values(talos_kubeconfig_path(state))))
    assert lines > 0 and unredacted == 0
