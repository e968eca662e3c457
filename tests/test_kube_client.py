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


def _status_error(message: str) -> object:
    """An HTTP 403 as the API server answers it: a Status with the refusal's message."""
    import json

    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": 403})
    return exc


def test_only_the_authorizer_s_403_is_forbidden_an_admission_denial_is_not() -> None:
    """A plan shows a write the kubeconfig's user may not make as "applying would be refused" (steps/dryrun.py).
    Admission answers 403 too, and a dry run did check that: a policy webhook's denial (k8s.io/apiserver@v0.35.0
    pkg/admission/plugin/webhook/errors/statuserror.go ``ToStatusErr``: "admission webhook %q denied the request:
    …", with the webhook's code, 403 from controller-runtime's ``Denied``) must fail the plan with its words, not
    be said to be unchecked (review, 6 Dec 2026). The authorizer's words: responsewriters/errors.go:60-80."""
    from runbook_lib.clients.kube import _api_error
    from runbook_lib.errors import Forbidden

    refused = _status_error(
        'runtimeclasses.node.k8s.io is forbidden: User "system:serviceaccount:default:gpu-runner" cannot create '
        'resource "runtimeclasses" in API group "node.k8s.io" at the cluster scope'
    )
    assert isinstance(_api_error(refused, "create runtimeclass nvidia"), Forbidden)  # type: ignore[arg-type]
    denied = _status_error('admission webhook "policy.example.com" denied the request: no RuntimeClass here')
    error = _api_error(denied, "create runtimeclass nvidia")  # type: ignore[arg-type]
    assert not isinstance(error, Forbidden) and "denied the request: no RuntimeClass here" in error.message
    terminating = _status_error(
        'namespaces "gpu-operator" is forbidden: unable to create new content in namespace'
    )
    assert not isinstance(_api_error(terminating, "create namespace"), Forbidden)  # type: ignore[arg-type]
