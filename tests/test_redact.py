"""Secrets never reach a record: the redactor blanks them in every form talosctl/kubectl print them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.clients.proc import CommandResult, Journal
from runbook_lib.model.redact import MASK, redact

SAMPLE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "reference"
    / "talos"
    / "worker-machineconfig.sample.yaml"
)


def test_yaml_diff_context_lines_lose_their_secret_values():
    diff = " cluster:\n     secret: 2H8cxe06HiYBm/S0wbWZYxlX=\n+    kernel:\n-    token: abc.def\n"
    out = redact(diff)
    assert "2H8cxe06" not in out and "abc.def" not in out
    assert out.count("\n") == diff.count("\n") and "+    kernel:" in out


def test_json_and_embedded_yaml_and_bearer_tokens():
    text = json.dumps({"token": "tok123", "spec": "machine:\n    token: 2z19nz.e8oe\n    type: worker\n"})
    out = redact(text + "\nAuthorization: Bearer abcdefghijklmnopq")
    for secret in ("tok123", "2z19nz.e8oe", "abcdefghijklmnopq"):
        assert secret not in out
    assert "type: worker" in out


def test_non_secret_values_are_kept():
    text = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n  sysctls:\n    net.core.bpf_jit_harden: '1'\n"
    assert redact(text) == text


def test_real_sample_machine_config_keeps_no_key_material():
    if not SAMPLE.exists():
        pytest.skip(f"{SAMPLE} not present (../shared is not beside the project)")
    text = SAMPLE.read_text()
    out = redact(text)
    assert "2z19nz.e8oeemr4l3caw64b" in text and "2z19nz.e8oeemr4l3caw64b" not in out
    assert "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t" not in out
    assert MASK in out


def test_journal_redacts_output_and_diffs():
    journal = Journal()
    result = CommandResult(
        ("talosctl", "patch"), 0, "", "     secret: s3cr3tvalue\n", 0.1, changes_cluster=True
    )
    journal.record_command(result, diff="token: t0ken\n")
    (entry,) = journal.entries
    assert "s3cr3tvalue" not in entry.stderr and "t0ken" not in (entry.diff or "")
    assert journal.changes() == [entry]


def test_talos_secret_fields_beyond_the_obvious_ones():
    text = (
        "            - wireguard:\n                privateKey: ABCDEF123=\n"
        "                    - presharedKey: PSK999=\n                    passphrase: hunter2\n"
        "                    auth: dXNlcjpwYXNz\n                    identityToken: idtok\n"
        "    ca: {crt: LS0tCRT, key: LS0tKEY}\n"
        "+   key: |\n+       -----BEGIN PRIVATE KEY-----\n+       MIIEvQ\n    kernel:\n        modules: []\n"
    )
    out = redact(text)
    for secret in (
        "ABCDEF123",
        "PSK999",
        "hunter2",
        "dXNlcjpwYXNz",
        "idtok",
        "LS0tCRT",
        "LS0tKEY",
        "MIIEvQ",
        "BEGIN",
    ):
        assert secret not in out, secret
    assert "    kernel:\n        modules: []" in out and out.count("\n") == text.count("\n")


def test_json_inside_a_json_string_loses_its_secret_values() -> None:
    """``kubectl apply`` keeps the object as JSON in the ``kubectl.kubernetes.io/last-applied-configuration``
    annotation (kubernetes/kubernetes staging/src/k8s.io/api/core/v1/annotation_key_constants.go,
    LastAppliedConfigAnnotation), so an object printed as JSON holds JSON-in-JSON: ``\\"token\\":\\"...\\"``."""
    applied = json.dumps({"kind": "Secret", "stringData": {"token": "nested-t0ken-value", "user": "bob"}})
    text = json.dumps(
        {"metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied}}}, indent=2
    )
    out = redact(text)
    assert "nested-t0ken-value" not in out and "bob" in out
    assert json.loads(
        json.loads(out)["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    )


def test_a_go_cmp_diff_indented_with_non_breaking_spaces_is_masked() -> None:
    """Talos 1.7's dry run prints go-cmp's report after ``Config diff:`` (talos@v1.7.0
    internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:221-240), and go-cmp indents its lines with
    U+00A0 instead of U+0020 in a random half of processes, on purpose (google/go-cmp cmp/report_text.go,
    ``appendIndent``): a secret on a line of its own must be masked with either indent."""
    nbsp = "\u00a0"
    diff = (
        f"{nbsp}{nbsp}&v1alpha1.MachineConfig{{\n"
        f'{nbsp}{nbsp}\tMachineToken: "abcdef.0123456789abcdef",\n'
        f'-{nbsp}\tClusterSecret: "c2VjcmV0LXZhbHVlLTEyMzQ1",\n'
        f'+{nbsp}\tClusterSecret: "bmV3LXNlY3JldC12YWx1ZQ==",\n'
        f"{nbsp}{nbsp}}}\n"
    )
    out = redact(diff)
    for secret in ("abcdef.0123456789abcdef", "c2VjcmV0LXZhbHVlLTEyMzQ1", "bmV3LXNlY3JldC12YWx1ZQ=="):
        assert secret not in out, out
    assert out.count(MASK) == 3 and out.count("\n") == diff.count("\n")


def test_key_equals_value_forms_are_masked_and_ordinary_assignments_kept() -> None:
    """Attack re-run (7 Dec 2026): an exec credential plugin whose debug line said ``token=<the API token>`` on
    stderr put the live token into a sealed record (helm's journalled stderr): that token is in no file the
    record's scrubber reads. ``key=value`` forms of secret keys are masked: a log line, a ``--token=`` flag and a
    URL's ``access_token=``; helm's ``--set`` values and kernel arguments are not secrets and stay."""
    token = "9f7b8d2af343e224ff3d9be863872ba3472a00ff113d1ec9"
    lines = [
        f"debug: exec plugin: token={token}",
        f"kubectl get nodes --token={token}",
        f"GET https://api.example/v1?access_token={token}&x=1",
        f"client_secret={token}, password='{token}'",
    ]
    out = redact("\n".join(lines))
    assert token not in out, out
    assert out.count(MASK) == 5 and "&x=1" in out, out
    kept = (
        "helm upgrade --set runtimeClassName=nvidia --set gfd.enabled=true talos.platform=metal console=ttyS0"
    )
    assert redact(kept) == kept


def test_a_password_in_a_url_is_masked_but_the_user_and_host_kept() -> None:
    """A URL's userinfo password (``https://ci:<password>@host``) was shown as it was (walkthrough, stop 54)."""
    from runbook_lib.model.redact import redact

    said = redact("helm repo add nvidia http://ci:hunter2secret@charts.example.com/nvidia failed")
    assert said == "helm repo add nvidia http://ci:***REDACTED***@charts.example.com/nvidia failed"
    assert (
        redact("see https://factory.talos.dev/image/abc@sha256:1234")
        == "see https://factory.talos.dev/image/abc@sha256:1234"
    )
    assert (
        redact("ghcr.io/siderolabs/installer:v1.12.0@sha256:ab12")
        == "ghcr.io/siderolabs/installer:v1.12.0@sha256:ab12"
    )
    # review of 629f0b5: a token used as the user, and a raw @ inside the password (URL parsers split at the last)
    assert (
        redact("https://ghp_abcdef123456@charts.example.com/x")
        == "https://***REDACTED***@charts.example.com/x"
    )
    assert redact("https://ci:p@ss@charts.example.com") == "https://ci:***REDACTED***@charts.example.com"
    # an @ after the authority, and JSON around a URL, stay as they are
    assert redact("https://host:443?email=a@b.c") == "https://host:443?email=a@b.c"
    compact = '{"server":"https://10.5.0.2:6443"},"user":"admin@talos"'
    assert redact(compact) == compact
