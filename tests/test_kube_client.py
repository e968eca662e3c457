"""The Kubernetes client wrapper against failures a real cluster produces."""

from __future__ import annotations

import pytest

from runbook_lib.clients.kube import Kube
from runbook_lib.errors import RetryableError

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:1"}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


def test_an_unreachable_api_server_is_a_retryable_error_not_a_traceback(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = Kube.from_kubeconfig(str(path))
    kube.api.configuration.retries = 0
    with pytest.raises(RetryableError, match="did not answer"):
        kube.server_version()
    with pytest.raises(RetryableError):
        kube.runtime_class("nvidia")
