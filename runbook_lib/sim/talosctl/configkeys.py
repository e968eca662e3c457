"""Strict decoding of a v1alpha1 config patch, as talosctl decodes it: a key the release's types lack is refused.

The real talosctl loads each strategic-merge patch with Talos's config decoder, which walks the YAML against the
Go types (siderolabs/gen ``xyaml.CheckUnknownKeys``, called from talos@v1.12.0
pkg/machinery/config/configloader/internal/decoder/decoder.go:177) and fails the whole command with
``unknown keys found during decoding:`` and the unknown part of the document, before any node is called
(reality-gaps.md §2 row 4; seen from the real talosctl v1.11-v1.13 in tests/sim/test_fake_vs_real_talosctl.py).

The key sets are the client's release's (``configkeys.json``, generated from the Go types by ``gen_configkeys``).
What this does not check (lenient, as the runbook's patches never need it): documents other than v1alpha1,
types from other packages (certificates, ``meta.Unstructured``) and types with their own ``UnmarshalYAML``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

_DATA = Path(__file__).with_name("configkeys.json")
_SCALARS = frozenset({"string", "bool", "int", "uint32", "uint64", "int64", "float64", "byte"})


@functools.cache
def _releases() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_DATA.read_text())["releases"]
    return data


def _types(minor: tuple[int, int]) -> dict[str, Any] | None:
    """The key sets of ``minor``, else of the nearest release below it that has them (none below 1.3)."""
    releases = _releases()
    known = sorted((tuple(int(p) for p in k.split(".")), k) for k in releases)
    below = [key for version, key in known if version <= minor]
    return releases[below[-1]] if below else None


def _walk(types: dict[str, Any], typ: str, value: Any) -> Any:
    """The part of ``value`` that ``typ`` does not know (None when all is known), as xyaml builds it."""
    typ = typ.lstrip("*")
    if typ.startswith("[]"):
        if not isinstance(value, list):
            return None
        inner = [u for item in value if (u := _walk(types, typ[2:], item)) is not None]
        return inner or None
    if typ.startswith("map[string]"):
        if not isinstance(value, dict):
            return None
        found = {
            k: u for k, v in value.items() if (u := _walk(types, typ[len("map[string]") :], v)) is not None
        }
        return found or None
    if typ in types["named"]:
        return _walk(types, types["named"][typ], value)
    fields = types["structs"].get(typ)
    if not fields or typ in types["custom"] or not isinstance(value, dict) or "$patch" in value:
        return None  # a scalar, another package's type, a custom decoder, or a `$patch: delete` node: not checked
    keys = dict(fields)
    unknown: dict[str, Any] = {}
    for key, item in value.items():
        if key not in keys:
            unknown[key] = item
        elif (inner := _walk(types, keys[key], item)) is not None:
            unknown[key] = inner
    return unknown or None


def is_v1alpha1(doc: dict[str, Any]) -> bool:
    """No ``kind``: the v1alpha1 document (decoder.go ``decode``: ``cmp.Or(kind, "v1alpha1")``)."""
    return "kind" not in doc and "apiVersion" not in doc


def unknown_keys(
    documents: list[dict[str, Any]], client_minor: tuple[int, int]
) -> tuple[int, dict[str, Any]] | None:
    """The index and unknown keys of the first v1alpha1 document that has some (the decoder stops at the first
    error)."""
    types = _types(client_minor)
    if types is None:
        return None
    for index, doc in enumerate(documents):
        if isinstance(doc, dict) and is_v1alpha1(doc):
            found = _walk(types, "Config", doc)
            if found is not None:
                return index, found
    return None


def _sorted(value: Any) -> Any:
    """Go's yaml.Marshal of a ``map[string]any`` writes the keys sorted."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def error_text(index: int, unknown: dict[str, Any], client_minor: tuple[int, int]) -> str:
    """``unknown keys found during decoding:`` and the unknown part as go-yaml writes it (4-space indent).

    From 1.13 the decoder names the document and its line (talos@v1.13.0
    pkg/machinery/config/configloader/internal/decoder/decoder.go:135). The line is exact for the first document
    only: the patch's later documents' lines are not kept by the simulator (it prints the index plus one).
    """
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    text = "unknown keys found during decoding:\n" + patching.dump_yaml(_sorted(unknown))
    if client_minor >= (1, 13):
        text = f"error decoding document /v1alpha1/ (line {index + 1}): {text}"
    return text
