"""Redaction of secret material in tool output, before anything is shown, journalled or recorded.

Why here and not "be careful": a machine-config diff's context lines, ``talosctl get machineconfig``
output and a kubeconfig all carry keys and tokens, and change records are shared widely.  Every text that
leaves a client passes through :func:`redact`, which blanks the values of secret-bearing keys in YAML
(``key: value``, also with diff prefixes ``+``/``-``), JSON (``"key": "value"``) and ``key=value`` forms.
"""

from __future__ import annotations

import re

#: Keys whose values are secrets in Talos machine configs, talosconfigs and kubeconfigs: any key ending in one
#: of these words (``privateKey``, ``presharedKey``, ``bootstraptoken``, ``aescbcEncryptionSecret``, ...) ...
SECRET_SUFFIXES = ("key", "token", "secret", "password", "passphrase")
#: ... and these exact keys (certificates, registry ``auth``, kubeconfig data fields).
SECRET_KEYS = (
    "crt",
    "ca",
    "auth",
    "client-key-data",
    "client-certificate-data",
    "certificate-authority-data",
    "id-token",
    "refresh-token",
)
MASK = "***REDACTED***"
#: Line-start characters before a key: indentation, diff prefixes, and U+00A0, with which go-cmp indents a random
#: half of its reports on purpose (google/go-cmp cmp/report_text.go ``appendIndent``); Talos 1.7's dry run prints one.
_LEAD = "[ \t\u00a0+\\-]"
_KEYS = r"[A-Za-z0-9_.-]*(?:" + "|".join(SECRET_SUFFIXES) + ")|" + "|".join(re.escape(k) for k in SECRET_KEYS)
_YAML = re.compile(
    rf"^(?P<lead>{_LEAD}*(?:- )?(?P<key>{_KEYS}):[ \t]+)(?P<value>(?![|>][-+]?\s*$)[^\s#{{\[].*?)[ \t]*$",
    re.MULTILINE | re.IGNORECASE,
)
#: A secret key introducing a block scalar (``key: |``): its more-indented lines are the secret.
_BLOCK = re.compile(
    rf"^(?P<indent>{_LEAD}*?)(?P<pad>[ \t]*)(?:- )?(?:{_KEYS}):[ \t]*[|>][-+]?[ \t]*$", re.IGNORECASE
)
#: Flow mappings: ``ca: {crt: abc, key: def}``.
_FLOW = re.compile(rf"(?P<lead>[{{,][ \t]*(?P<key>{_KEYS}):[ \t]*)(?P<value>[^,}}\s][^,}}]*)", re.IGNORECASE)
_JSON = re.compile(rf'(?P<lead>"(?P<key>{_KEYS})"\s*:\s*)"(?P<value>[^"]*)"', re.IGNORECASE)
#: JSON inside a JSON string (``\"token\": \"abc\"``), e.g. kubectl's last-applied-configuration annotation.
_NESTED_JSON = re.compile(
    rf'(?P<lead>(?P<q>\\+)"(?P<key>{_KEYS})(?P=q)"\s*:\s*(?P=q)")(?P<value>(?:(?!(?P=q)").)+)(?P<end>(?P=q)")',
    re.IGNORECASE,
)
#: YAML embedded in a JSON string (``"spec": "machine:\\n    token: abc\\n"``), as ``talosctl -o json`` prints it.
_ESCAPED = re.compile(
    rf"(?P<lead>\\n[ \t]*(?:- )?(?P<key>{_KEYS}):[ \t]+)(?P<value>[^\s\\\"|>][^\\\"]*)", re.IGNORECASE
)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
#: ``token=…``, ``--token=…``, ``?access_token=…``: how a credential plugin's debug line, a flag or a URL says it.
#: Why: an exec credential plugin logging ``token=<the API token>`` on stderr put it into a sealed record, its
#: token being in no file the record's scrubber reads (attack re-run, 7 Dec 2026).
_ASSIGN = re.compile(rf"(?<![A-Za-z0-9_])(?P<lead>(?:{_KEYS})=[\"']?)(?P<value>[^\s&\"',;]+)", re.IGNORECASE)


#: A URL's authority (RFC 3986: up to the first ``/``, ``?`` or ``#``; here also up to a quote, comma, bracket or
#: white space, so JSON around a URL stays whole): its user information, before the last ``@``, is a credential
#: when it is a password (``ci:s3cret@``) or a token used as the user (``ghp_…@``).
_AUTHORITY = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s\"',(){}\[\]]+)")


def _userinfo(match: re.Match[str]) -> str:
    authority = match.group("authority")
    if "@" not in authority:
        return match.group(0)
    info, host = authority.rsplit("@", 1)
    user = info.split(":", 1)[0] + ":" if ":" in info else ""
    return f"{match.group('scheme')}{user}{MASK}@{host}"


def redact(text: str) -> str:
    """The text with every secret-bearing value replaced by a mask; structure and line count unchanged."""
    if not text:
        return text
    text = _YAML.sub(
        lambda m: m.group("lead") + MASK if m.group("value") not in ('""', "''") else m.group(0), text
    )
    text = _mask_blocks(text)
    text = _FLOW.sub(lambda m: m.group("lead") + MASK, text)
    text = _JSON.sub(lambda m: m.group("lead") + f'"{MASK}"' if m.group("value") else m.group(0), text)
    text = _NESTED_JSON.sub(lambda m: m.group("lead") + MASK + m.group("end"), text)
    text = _ESCAPED.sub(lambda m: m.group("lead") + MASK, text)
    text = _ASSIGN.sub(lambda m: m.group("lead") + MASK, text)
    text = _AUTHORITY.sub(_userinfo, text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def _indent_of(line: str) -> int:
    body = line[1:] if line[:1] in "+- " and line[1:2] == " " else line  # unified-diff prefix
    return len(body) - len(body.lstrip(" \t"))


def _mask_blocks(text: str) -> str:
    """Mask the lines of block scalars under secret keys (PEM keys written as ``key: |``)."""
    lines = text.split("\n")
    out: list[str] = []
    block_indent: int | None = None
    for line in lines:
        if block_indent is not None:
            if line.strip() and _indent_of(line) > block_indent:
                prefix = re.match(r"^[+\- ]?[ \t]*", line)
                out.append((prefix.group(0) if prefix else "") + MASK)
                continue
            block_indent = None
        if _BLOCK.match(line):
            block_indent = _indent_of(line)
        out.append(line)
    return "\n".join(out)
