"""The Talos admin kubeconfig the Python Kubernetes API writes for talosctl 1.14's drain: a failed ``openssl`` is
said, not swallowed, and the admin certificate follows its CA.

Before: ``openssl_keypair`` threw openssl's stderr away and ``write_talos_kubeconfig`` quietly deleted the file, so a
1.14 run failed later at the drain with no hint; and ``admin.crt`` was reused after the serving certificate (its CA)
was made again, so the API refused it (401). The failing openssl here is a stand-in that refuses ``req -CA`` as an
openssl without that option would (``-CA`` came with OpenSSL 3.0's ``req``); its wording is an example, not captured
from a real OpenSSL 1.1.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runbook_lib.sim import realtalos
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import talos_kubeconfig_error_path, talos_kubeconfig_path

URL = "https://127.0.0.1:6443"
REFUSED = "req: Unrecognized flag CA\nreq: Use -help for summary.\n"


@pytest.fixture
def openssl_without_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``openssl`` on PATH refuses ``req -CA`` (exit 1, ``REFUSED`` on stderr) and runs the real one otherwise."""
    real = shutil.which("openssl")
    if real is None:
        pytest.skip("no openssl on PATH")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "openssl"
    stand_in.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = -CA ] && { printf %s "$REFUSED" >&2; exit 1; }; done\n'
        f'exec {real} "$@"\n'
    )
    stand_in.chmod(0o700)
    monkeypatch.setenv("REFUSED", REFUSED)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("openssl_without_ca")
def test_a_failed_admin_certificate_is_logged_and_keeps_1_14_on_the_python_talosctl_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        realtalos.MODE_ENV, "auto"
    )  # the drain's reason comes before any built tool is looked for
    state = tmp_path / "state"
    assert server.serving_cert(state) is not None
    with caplog.at_level(logging.WARNING):
        assert server.write_talos_kubeconfig(state, URL) is None
    assert not talos_kubeconfig_path(state).exists()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "req: Unrecognized flag CA" in logged and "admin" in logged, logged
    choice = realtalos.choose("v1.14.0", None, "fresh", kube="python", state_dir=state)
    assert not choice.real and "req: Unrecognized flag CA" in choice.reason, choice.reason


def _verifies(ca: Path, cert: Path) -> bool:
    return (
        subprocess.run(
            ["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True, check=False
        ).returncode
        == 0
    )


def test_the_admin_certificate_is_made_again_when_its_ca_is_newer(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on PATH")
    state = tmp_path / "state"
    ca, _key = server.serving_cert(state) or pytest.fail("no serving certificate")
    assert server.write_talos_kubeconfig(state, URL) == talos_kubeconfig_path(state)
    admin = state / "kube" / "admin.crt"
    assert _verifies(ca, admin)
    ca.unlink()  # the serving certificate made again (a new CA key), one second later than the admin's
    server.serving_cert(state)
    later = admin.stat().st_mtime + 1
    os.utime(ca, (later, later))
    assert server.write_talos_kubeconfig(state, URL) == talos_kubeconfig_path(state)
    assert _verifies(ca, admin), "admin.crt was kept, signed by the old CA: the API would answer 401"
    assert not talos_kubeconfig_error_path(state).exists()
