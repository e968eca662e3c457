"""Talos machine-config patching: patch loading and kind detection, strategic merge, JSON6902.

Mirrors ``pkg/machinery/config/configpatcher`` so that a patch behaves in the simulator as on a node:
detection order is "Talos config (strategic merge)" → JSON6902 JSON → YAML list of ops; strategic merge
merges maps and **appends** lists (the reason re-applying the NVIDIA module patch duplicates entries),
except the fields Talos replaces or merges by key; documents of a multi-doc config are matched by
apiVersion + kind + name; ``$patch: delete`` removes keys and documents.  JSON6902 goes through the
``jsonpatch`` library and, as in Talos, applies only to a single-document (v1alpha1) config.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any

import jsonpatch
import yaml

DELETE_KEY = "$patch"


class PatchError(Exception):
    """A patch that cannot be loaded or applied; the message is what talosctl would print."""


@dataclass
class StrategicPatch:
    documents: list[dict[str, Any]]


@dataclass
class JSONPatch:
    operations: list[dict[str, Any]]


Patch = StrategicPatch | JSONPatch

# Paths (dotted, from the v1alpha1 document root) whose lists Talos replaces instead of appending.
_REPLACE_PATHS = {
    "cluster.network.podSubnets",
    "cluster.network.serviceSubnets",
    "cluster.apiServer.auditPolicy",
}
# Lists merged by key: path → key field(s).
_MERGE_BY_KEY: dict[str, tuple[str, ...]] = {
    "machine.network.interfaces": ("interface", "deviceSelector"),
    "machine.network.interfaces[].vlans": ("vlanId",),
    "configFiles": ("mountPath",),
}


def _is_filename(arg: str, client_minor: tuple[int, int]) -> bool:
    """talosctl ≥1.12 takes a bare word with no space/newline and no leading ``[``/``{`` as a file name."""
    if client_minor < (1, 12) or not arg:
        return False
    return not any(c in arg for c in (" ", "\n")) and arg[0] not in "[{"


def read_patch_arg(arg: str, client_minor: tuple[int, int]) -> bytes:
    if arg.startswith("@"):
        path = arg[1:]
    elif _is_filename(arg, client_minor):
        path = arg
    else:
        return arg.encode()
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise PatchError(f"open {path}: no such file or directory") from None
    except IsADirectoryError:
        raise PatchError(f"read {path}: is a directory") from None
    except PermissionError:
        raise PatchError(f"open {path}: permission denied") from None


def _config_like(doc: Any) -> bool:
    """Would Talos's config loader accept this document (with patch deletes allowed)?"""
    if not isinstance(doc, dict):
        return False
    if "kind" in doc:
        return (isinstance(doc.get("kind"), str) and "apiVersion" in doc) or DELETE_KEY in doc
    return True  # a legacy v1alpha1 document (``version`` may be omitted in patches)


def load_patch(data: bytes) -> Patch:
    """Detect the patch kind as ``configpatcher.LoadPatch`` does and return it."""
    config_err: str | None = None
    try:
        docs = [d for d in yaml.safe_load_all(data.decode()) if d is not None]
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        docs = []
        config_err = f"failed to decode config: {str(exc).splitlines()[0]}"
    if docs and all(_config_like(d) for d in docs):
        return StrategicPatch(documents=docs)
    if config_err is None:
        config_err = (
            "missing kind" if docs and isinstance(docs[0], dict) else "error decoding document: not a map"
        )
    try:
        ops = json.loads(data)
        if isinstance(ops, list) and all(isinstance(o, dict) and "op" in o for o in ops):
            jsonpatch.JsonPatch(ops)
            return JSONPatch(operations=ops)
    except (ValueError, jsonpatch.JsonPatchException):
        pass
    if (
        len(docs) == 1
        and isinstance(docs[0], list)
        and all(isinstance(o, dict) and "op" in o for o in docs[0])
    ):
        return JSONPatch(operations=docs[0])
    raise PatchError(config_err)


def load_patches(args: list[str], client_minor: tuple[int, int]) -> list[Patch]:
    """``LoadPatches``: each arg read and detected; consecutive JSON patches are merged into one."""
    out: list[Patch] = []
    for arg in args:
        patch = load_patch(read_patch_arg(arg, client_minor))
        if isinstance(patch, StrategicPatch):
            for kind in unknown_kinds(patch.documents, client_minor):
                raise PatchError(f'unknown document kind "{kind}" (not registered in this talosctl version)')
        if isinstance(patch, JSONPatch) and out and isinstance(out[-1], JSONPatch):
            out[-1].operations.extend(patch.operations)
        else:
            out.append(patch)
    return out


# Multi-document kinds newer than the oldest supported version (Talos 1.14 "Kernel Multi-document Configuration").
KINDS_SINCE: dict[str, tuple[int, int]] = {
    "KernelModuleConfig": (1, 14),
    "SysctlConfig": (1, 14),
    "SysfsConfig": (1, 14),
    "CRICustomizationConfig": (1, 14),
}


def unknown_kinds(documents: list[dict[str, Any]], minor: tuple[int, int]) -> list[str]:
    """Document kinds a Talos/talosctl of this minor version cannot decode."""
    return [
        str(d["kind"]) for d in documents if "kind" in d and minor < KINDS_SINCE.get(str(d["kind"]), (0, 0))
    ]


def _doc_key(doc: dict[str, Any]) -> tuple[str, str, str]:
    if "kind" not in doc:
        return ("", "v1alpha1", "")
    return (str(doc.get("apiVersion", "")), str(doc["kind"]), str(doc.get("name", "")))


def _is_delete(value: Any) -> bool:
    return isinstance(value, dict) and value.get(DELETE_KEY) == "delete"


def _delete_items(path: str, items: list[Any], selectors: list[dict[str, Any]]) -> list[Any]:
    """Each ``$patch: delete`` list item is a selector on its first other key, in any list: the first item
    matching it goes, and none matching is an error (talos@v1.12.0 pkg/machinery/config/configloader/
    internal/decoder/delete.go ``makeSequenceSelector``, selector.go ``deleteStructFrom``)."""
    out = list(items)
    for selector in selectors:
        key, value = next(((k, v) for k, v in selector.items() if k != DELETE_KEY), ("", None))
        match = next(
            (i for i, item in enumerate(out) if isinstance(item, dict) and key and item.get(key) == value),
            None,
        )
        if match is None:
            raise PatchError(f"patch delete: failed to delete path '{path}' ({key}: {value}): lookup failed")
        out.pop(match)
    return out


def _merge_list(path: str, left: list[Any], right: list[Any]) -> list[Any]:
    left = _delete_items(path, left, [item for item in right if _is_delete(item)])
    right = [item for item in right if not _is_delete(item)]
    if path in _REPLACE_PATHS:
        return copy.deepcopy(right)
    keys = _MERGE_BY_KEY.get(path) or _MERGE_BY_KEY.get(path.rsplit(".", 1)[-1])
    if not keys:
        return [*left, *copy.deepcopy(right)]
    result = list(left)
    for item in right:
        match = None
        if isinstance(item, dict):
            for i, existing in enumerate(result):
                if isinstance(existing, dict) and any(
                    k in item and existing.get(k) == item.get(k) for k in keys
                ):
                    match = i
                    break
        if match is None:
            result.append(copy.deepcopy(item))
        else:
            result[match] = merge(result[match], item, f"{path}[]")
    return result


def merge(left: Any, right: Any, path: str = "") -> Any:
    """Talos strategic merge of ``right`` onto ``left`` (returns a new value)."""
    if isinstance(left, dict) and isinstance(right, dict):
        out = dict(left)
        for key, value in right.items():
            if key == DELETE_KEY:
                continue
            sub = f"{path}.{key}" if path else str(key)
            if _is_delete(value):
                out.pop(key, None)
            elif value is None:
                continue  # zero values in a patch do not override
            elif key in out:
                out[key] = merge(out[key], value, sub)
            else:
                out[key] = _strip_deletes(copy.deepcopy(value))
        return out
    if isinstance(left, list) and isinstance(right, list):
        return _merge_list(path, left, right)
    return copy.deepcopy(right)


def _strip_deletes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_deletes(v) for k, v in value.items() if k != DELETE_KEY and not _is_delete(v)}
    if isinstance(value, list):
        return [_strip_deletes(v) for v in value]
    return value


def apply_strategic(config: list[dict[str, Any]], patch: StrategicPatch) -> list[dict[str, Any]]:
    docs = [copy.deepcopy(d) for d in config]
    for pdoc in patch.documents:
        key = _doc_key(pdoc)
        idx = next((i for i, d in enumerate(docs) if _doc_key(d) == key), None)
        if pdoc.get(DELETE_KEY) == "delete" and len(pdoc) <= 4:
            if idx is not None:
                docs.pop(idx)
            continue
        if idx is None:
            docs.append(_strip_deletes(copy.deepcopy(pdoc)))
        else:
            docs[idx] = merge(docs[idx], pdoc)
    return docs


def apply_json6902(config: list[dict[str, Any]], patch: JSONPatch) -> list[dict[str, Any]]:
    if len(config) != 1:
        raise PatchError("JSON6902 patches are not supported for multi-document machine configuration")
    try:
        patched = jsonpatch.JsonPatch(patch.operations).apply(copy.deepcopy(config[0]))
    except jsonpatch.JsonPointerException as exc:
        raise PatchError(f"error applying JSON patch: {exc}") from None
    except jsonpatch.JsonPatchConflict as exc:
        raise PatchError(f"error applying JSON patch: {exc}") from None
    except jsonpatch.JsonPatchException as exc:
        raise PatchError(f"error applying JSON patch: {exc}") from None
    if not isinstance(patched, dict):
        raise PatchError("error applying JSON patch: result is not a document")
    return [patched]


def apply_patches(config: list[dict[str, Any]], patches: list[Patch]) -> list[dict[str, Any]]:
    for patch in patches:
        if isinstance(patch, StrategicPatch):
            config = apply_strategic(config, patch)
        else:
            config = apply_json6902(config, patch)
    return config


def _scalar(value: Any) -> str:
    """One scalar as go-yaml writes it (PyYAML agrees on quoting for the plain data configs hold)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, allow_unicode=True)
    text = text.rstrip("\n")
    return text[: -len("\n...")] if text.endswith("\n...") else text


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            _emit_entry(f"{pad}{_scalar(key)}:", item, indent, out)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out.extend(sub[1:])
            elif isinstance(item, list) and item:
                sub = []
                _emit(item, indent + 2, sub)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out.extend(sub[1:])
            else:
                _emit_entry(f"{pad}-", item, indent, out)


def _emit_entry(prefix: str, item: Any, indent: int, out: list[str]) -> None:
    if isinstance(item, dict | list) and item:
        out.append(prefix)
        _emit(item, indent + 4, out)
    elif isinstance(item, dict):
        out.append(f"{prefix} {{}}")
    elif isinstance(item, list):
        out.append(f"{prefix} []")
    elif isinstance(item, str) and "\n" in item.rstrip("\n"):
        out.append(f"{prefix} |" + ("" if item.endswith("\n") else "-"))
        body = item[:-1] if item.endswith("\n") else item
        out.extend((" " * (indent + 4) + line) if line else "" for line in body.split("\n"))
    else:
        out.append(f"{prefix} {_scalar(item)}")


def dump_yaml(value: Any) -> str:
    """YAML as Go's yaml encoder with 4-space indent writes it (Talos configs, talosctl ``-o yaml``)."""
    out: list[str] = []
    _emit(value, 0, out)
    return "\n".join(out) + "\n"


def encode_config(config: list[dict[str, Any]]) -> str:
    """The config as Talos encodes it (documents joined by ``---``)."""
    return "---\n".join(dump_yaml(doc) for doc in config)


def decode_config(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise PatchError("error decoding document: not a map")
    return docs


def patch_file_offline(path: str, patch_args: list[str], client_minor: tuple[int, int]) -> str:
    """``talosctl machineconfig patch FILE``: no node, no validation beyond decoding."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise PatchError(f"open {path}: no such file or directory") from None
    patches = load_patches(patch_args, client_minor)
    return encode_config(apply_patches(decode_config(text), patches))


def expand_path(p: str) -> str:
    return os.path.expanduser(p)
