"""Redaction of secret material in tool output, before anything is shown, journalled or recorded.

Why here and not "be careful": a machine-config diff's context lines, ``talosctl get machineconfig``
output and a kubeconfig all carry keys and tokens, and change records are shared widely.  Every text that
leaves a client passes through :func:`redact`, which blanks the values of secret-bearing keys in YAML
(``key: value``, also with diff prefixes ``+``/``-``) and JSON (``"key": "value"``) forms.
"""

from __future__ import annotations

import re

#: Keys whose values are secrets in Talos machine configs, talosconfigs and kubeconfigs.
SECRET_KEYS = (
    "secret",
    "token",
    "key",
    "password",
    "bootstraptoken",
    "secretboxEncryptionSecret",
    "aescbcEncryptionSecret",
    "client-key-data",
    "client-certificate-data",
    "certificate-authority-data",
    "id-token",
    "refresh-token",
    "crt",
    "ca",
)
MASK = "***REDACTED***"
_KEYS = "|".join(re.escape(k) for k in sorted(SECRET_KEYS, key=len, reverse=True))
_YAML = re.compile(
    rf"^(?P<lead>[ \t+\-]*(?:- )?(?P<key>{_KEYS}):[ \t]+)(?P<value>(?![|>]\s*$)[^\s#{{\[].*?)[ \t]*$",
    re.MULTILINE | re.IGNORECASE,
)
_JSON = re.compile(rf'(?P<lead>"(?P<key>{_KEYS})"\s*:\s*)"(?P<value>[^"]*)"', re.IGNORECASE)
#: YAML embedded in a JSON string (``"spec": "machine:\\n    token: abc\\n"``), as ``talosctl -o json`` prints it.
_ESCAPED = re.compile(
    rf"(?P<lead>\\n[ \t]*(?:- )?(?P<key>{_KEYS}):[ \t]+)(?P<value>[^\s\\\"|>][^\\\"]*)", re.IGNORECASE
)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")


def redact(text: str) -> str:
    """The text with every secret-bearing value replaced by a mask; structure and line count unchanged."""
    if not text:
        return text
    text = _YAML.sub(
        lambda m: m.group("lead") + MASK if m.group("value") not in ('""', "''") else m.group(0), text
    )
    text = _JSON.sub(lambda m: m.group("lead") + f'"{MASK}"' if m.group("value") else m.group(0), text)
    text = _ESCAPED.sub(lambda m: m.group("lead") + MASK, text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)
