"""A realistic generated worker machine config per Talos version.

Patches are only meaningful against a config shaped like the real one (the runbook's idempotence checks
read ``machine.kernel.modules``, ``machine.sysctls``, ``machine.files``), so the simulator starts every
node from what ``talosctl gen config`` would emit for a worker of that version: the fields appear as the
version introduced them.  Secrets are random per cluster and mean nothing outside the simulator.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from runbook_lib.sim.state import KUBERNETES_FOR_TALOS, VANILLA_SCHEMATIC, minor_of


def _token(seed: str, label: str, size: int) -> str:
    return hashlib.sha256(f"{seed}/{label}".encode()).hexdigest()[:size]


def _b64(seed: str, label: str) -> str:
    return base64.b64encode(hashlib.sha256(f"{seed}/{label}".encode()).digest()).decode()


def _fake_cert(seed: str, label: str) -> str:
    body = base64.b64encode(hashlib.sha512(f"{seed}/{label}".encode()).digest() * 4).decode()
    pem = f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"
    return base64.b64encode(pem.encode()).decode()


def installer_image(talos_version: str) -> str:
    """Default installer: ghcr.io up to 1.13, the vanilla factory metal-installer from 1.14."""
    if minor_of(talos_version) >= (1, 14):
        return f"factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC}:{talos_version}"
    return f"ghcr.io/siderolabs/installer:{talos_version}"


def worker_config(
    talos_version: str,
    *,
    cluster_name: str = "talos-gpu-sim",
    endpoint: str = "https://10.5.0.1:6443",
    seed: str = "sim",
) -> list[dict[str, Any]]:
    """The multi-document worker config (a list of documents; only the v1alpha1 one for now)."""
    minor = minor_of(talos_version)
    k8s = KUBERNETES_FOR_TALOS.get(f"{minor[0]}.{minor[1]}", "1.35.0")
    kubelet: dict[str, Any] = {
        "image": f"ghcr.io/siderolabs/kubelet:v{k8s}",
        "defaultRuntimeSeccompProfileEnabled": True,
    }
    if minor >= (1, 5):
        kubelet["disableManifestsDirectory"] = True
    features: dict[str, Any] = {}
    if minor < (1, 12):  # these three became always-on and left the schema in 1.12
        features["rbac"] = True
        if minor >= (1, 5):
            features["stableHostname"] = True
        features["apidCheckExtKeyUsage"] = True
    if minor >= (1, 5):
        features["diskQuotaSupport"] = True
    if minor >= (1, 6):
        features["kubePrism"] = {"enabled": True, "port": 7445}
    if minor >= (1, 7):
        host_dns: dict[str, Any] = {"enabled": True}
        if minor >= (1, 8):
            host_dns["forwardKubeDNSToHost"] = True
        features["hostDNS"] = host_dns
    install: dict[str, Any] = {"disk": "/dev/sda", "image": installer_image(talos_version), "wipe": False}
    if minor >= (1, 12):  # the 1.12 contract turns it on (talos@v1.12.0:.../config/generate/worker.go:58-59)
        install["grubUseUKICmdline"] = True
    machine: dict[str, Any] = {
        "type": "worker",
        "token": f"{_token(seed, 'mt', 6)}.{_token(seed, 'mt2', 16)}",
        "ca": {"crt": _fake_cert(seed, "os-ca"), "key": ""},
        "certSANs": [],
        "kubelet": kubelet,
        "network": {},
        "install": install,
        "registries": {},
        "features": features,
    }
    # Moved to their own documents (RegistryMirrorConfig…, network docs) and out of the v1alpha1 schema.
    if minor >= (1, 12):
        del machine["registries"]
    if minor >= (1, 13):
        del machine["network"]
    cluster: dict[str, Any] = {
        "id": _b64(seed, "cluster-id"),
        "secret": _b64(seed, "cluster-secret"),
        "controlPlane": {"endpoint": endpoint},
        "clusterName": cluster_name,
        "network": {
            "dnsDomain": "cluster.local",
            "podSubnets": ["10.244.0.0/16"],
            "serviceSubnets": ["10.96.0.0/12"],
        },
        "token": f"{_token(seed, 'ct', 6)}.{_token(seed, 'ct2', 16)}",
        "ca": {"crt": _fake_cert(seed, "k8s-ca"), "key": ""},
        "discovery": {"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}},
    }
    # `persist` is gone from the published schemas (it was always true), so it is not emitted.
    return [{"version": "v1alpha1", "debug": False, "machine": machine, "cluster": cluster}]
