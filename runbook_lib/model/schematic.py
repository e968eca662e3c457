"""Image Factory schematics: strict parsing, the factory's canonical YAML, and the offline schematic ID.

Why this module exists: a node's schematic ID decides which system extensions its installer carries, and the
factory computes it as ``hex(sha256(yaml.Marshal(schematic)))`` with Go's YAML emitter (facts §2.3).  To
know the ID *before* talking to a factory (dry runs, plans, comparing with what a node reports), and to
notice when a factory disagrees, we must produce the very same bytes.  PyYAML's emitter differs from
go-yaml's in indentation of nested sequences and in quoting (``'true'`` vs ``"true"``), so the small part of
go-yaml that a schematic exercises is reproduced here: the struct field order and ``omitempty`` rules of
``pkg/schematic/schematic.go``, go-yaml's implicit-type resolution (which strings need quotes), its scalar
analysis (plain / single / double / literal choice) and its "regular" indentation rule.

Parsing mirrors the factory too: YAML or JSON in any formatting, unknown fields rejected
(``dec.KnownFields(true)``), Go field types enforced (META keys are ``uint8``), errors worded like go-yaml's so
the simulated factory can return them verbatim.  Pure: no I/O.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cmp_to_key
from typing import Any

import yaml

from runbook_lib.errors import PermanentError

#: The ID of ``customization: {}`` (the "vanilla" Talos image, what ``talosctl upgrade`` without ``--image``
#: installs from Talos 1.14 on).
VANILLA_SCHEMATIC_ID = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

#: Allowed values the factory documents (facts §2.2).
BOOTLOADERS = ("auto", "dual-boot", "grub", "sd-boot")
ENROLL_KEYS = ("off", "manual", "if-safe", "force")
SECTOR_SIZES = (512, 4096)

_BEST_INDENT = 4


class SchematicInvalid(PermanentError):
    """The schematic text is not one the factory would accept (the factory answers 400 with this text)."""


# --------------------------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class MetaValue:
    """One initial META entry; ``key`` is a ``uint8`` in the factory (e.g. 10 = network config)."""

    key: int
    value: str


@dataclass(frozen=True)
class Overlay:
    """An SBC overlay (e.g. ``siderolabs/sbc-raspberrypi`` / ``rpi_generic``)."""

    image: str = ""
    name: str = ""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def is_zero(self) -> bool:
        return not self.image and not self.name and not self.options


@dataclass(frozen=True)
class Schematic:
    """The factory's ``Schematic`` struct, flattened; field order here is irrelevant, emission order is fixed."""

    official_extensions: tuple[str, ...] = ()
    extra_kernel_args: tuple[str, ...] = ()
    meta: tuple[MetaValue, ...] = ()
    overlay: Overlay = field(default_factory=Overlay)
    embedded_machine_configuration: str = ""
    bootloader: str = ""
    secureboot_enroll_keys: str = ""
    secureboot_include_well_known_certificates: bool = False
    disk_image_sector_size: int = 0
    owner: str = ""
    """Set only by authenticated Enterprise factories; community instances reject it."""

    def to_tree(self) -> dict[str, Any]:
        """The value go-yaml marshals: struct order, zero values omitted, ``customization`` always present."""
        tree: dict[str, Any] = {}
        if self.owner:
            tree["owner"] = self.owner
        if not self.overlay.is_zero:
            overlay: dict[str, Any] = {"image": self.overlay.image, "name": self.overlay.name}
            if self.overlay.options:
                overlay["options"] = _go_value(self.overlay.options)
            tree["overlay"] = overlay
        custom: dict[str, Any] = {}
        if self.embedded_machine_configuration:
            custom["embeddedMachineConfiguration"] = self.embedded_machine_configuration
        if self.extra_kernel_args:
            custom["extraKernelArgs"] = list(self.extra_kernel_args)
        if self.meta:
            custom["meta"] = [{"key": m.key, "value": m.value} for m in self.meta]
        if self.official_extensions:
            custom["systemExtensions"] = {"officialExtensions": list(self.official_extensions)}
        if self.bootloader:
            custom["bootloader"] = self.bootloader
        secureboot: dict[str, Any] = {}
        if self.secureboot_enroll_keys:
            secureboot["enrollKeys"] = self.secureboot_enroll_keys
        if self.secureboot_include_well_known_certificates:
            secureboot["includeWellKnownCertificates"] = True
        if secureboot:
            custom["secureboot"] = secureboot
        if self.disk_image_sector_size:
            custom["diskImage"] = {"sectorSize": self.disk_image_sector_size}
        tree["customization"] = custom
        return tree

    def canonical_yaml(self) -> str:
        """The exact text the factory stores and hashes."""
        return go_yaml_marshal(self.to_tree())

    def canonical_bytes(self) -> bytes:
        return self.canonical_yaml().encode("utf-8")

    @property
    def id(self) -> str:
        """The schematic ID, computed offline exactly as the factory does."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (same content as the YAML): what a record or a notebook shows."""
        plain: dict[str, Any] = _plain(self.to_tree())
        return plain


def schematic_for(
    extensions: Iterable[str],
    extra_kernel_args: Iterable[str] = (),
    meta: Iterable[MetaValue | tuple[int, str] | Mapping[str, Any]] = (),
    overlay: Overlay | Mapping[str, Any] | None = None,
) -> Schematic:
    """The schematic of a plan: official extensions in the given order (order changes the ID, facts §2.3).

    Extension names are taken as given (``siderolabs/…``); a name without the ``siderolabs/`` prefix is a
    mistake users make, so it is rejected here rather than producing an installer that lacks it.
    """
    names = tuple(extensions)
    for name in names:
        if "/" not in name:
            raise SchematicInvalid(
                f"extension name {name!r} lacks its publisher",
                hint=f"official extensions are named like siderolabs/{name}",
            )
    metas: list[MetaValue] = []
    for item in meta:
        if isinstance(item, MetaValue):
            metas.append(item)
        elif isinstance(item, tuple):
            metas.append(MetaValue(int(item[0]), str(item[1])))
        else:
            metas.append(MetaValue(int(item["key"]), str(item["value"])))
    for m in metas:
        if not 0 <= m.key <= 255:
            raise SchematicInvalid(f"META key {m.key} is out of range", hint="META keys are 0–255 (uint8)")
    if overlay is None:
        ov = Overlay()
    elif isinstance(overlay, Overlay):
        ov = overlay
    else:
        ov = Overlay(
            image=str(overlay.get("image", "")),
            name=str(overlay.get("name", "")),
            options=dict(overlay.get("options") or {}),
        )
    return Schematic(
        official_extensions=names,
        extra_kernel_args=tuple(extra_kernel_args),
        meta=tuple(metas),
        overlay=ov,
    )


@dataclass(frozen=True)
class ExtensionInfo:
    """One entry of ``GET /version/{v}/extensions/official`` (the factory's ``ExtensionInfo`` struct)."""

    name: str
    """``siderolabs/nvidia-container-toolkit-lts``"""
    ref: str
    """``ghcr.io/siderolabs/nvidia-container-toolkit-lts:580.105.08-v1.18.1``"""
    digest: str
    author: str = ""
    description: str = ""

    @property
    def tag(self) -> str:
        """The image tag (``580.105.08-v1.18.1``): what ``talosctl get extensions`` shows as VERSION."""
        return self.ref.rsplit(":", 1)[1] if ":" in self.ref.rsplit("/", 1)[-1] else ""

    @property
    def short_name(self) -> str:
        """The name without the publisher: the extension manifest's ``metadata.name``."""
        return self.name.split("/", 1)[-1]

    def to_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "ref": self.ref,
            "digest": self.digest,
            "author": self.author,
            "description": self.description,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExtensionInfo:
        """Read one factory entry; ``author``/``description`` are absent on factories older than v0.2.2."""
        try:
            return cls(
                name=str(data["name"]),
                ref=str(data["ref"]),
                digest=str(data.get("digest", "")),
                author=str(data.get("author", "")),
                description=str(data.get("description", "")),
            )
        except (KeyError, TypeError) as exc:
            raise PermanentError(f"malformed extension entry from the Image Factory: {data!r}") from exc


# ------------------------------------------------------------------------------------------------ parsing


class _Problems:
    """go-yaml collects type errors and reports them together ("yaml: unmarshal errors: …")."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.lines: list[int] = []

    def add(self, node: yaml.Node, text: str) -> None:
        self.lines.append(node.start_mark.line + 1)
        self.items.append(f"line {node.start_mark.line + 1}: {text}")

    def report(self) -> str:
        ordered = [item for _, item in sorted(zip(self.lines, self.items, strict=True), key=lambda p: p[0])]
        return "yaml: unmarshal errors:\n" + "\n".join(f"  {p}" for p in ordered)

    def cannot(self, node: yaml.Node, into: str) -> None:
        if isinstance(node, yaml.ScalarNode):
            tag = _node_short_tag(node)
            value = node.value
            shown = f" `{value[:7]}...`" if len(value) > 10 else f" `{value}`"
        else:
            tag = "!!seq" if isinstance(node, yaml.SequenceNode) else "!!map"
            shown = ""
        self.add(node, f"cannot unmarshal {tag}{shown} into {into}")


def _is_plain(node: yaml.ScalarNode) -> bool:
    return not node.style


def _node_short_tag(node: yaml.ScalarNode) -> str:
    if not _is_plain(node):
        return "!!str"
    tag, _ = go_resolve(node.value)
    return {"timestamp": "!!timestamp", "merge": "!!merge"}.get(tag, f"!!{tag}")


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and _is_plain(node) and go_resolve(node.value)[0] == "null"


def _compose(text: str) -> yaml.Node | None:
    try:
        for node in yaml.compose_all(text, Loader=yaml.SafeLoader):
            return node  # like go-yaml's Decoder.Decode: the first document only
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}: " if mark is not None else ""
        # JSON with tab indentation is valid JSON but not valid YAML for PyYAML; accept it as JSON.
        try:
            data = json.loads(text)
        except ValueError:
            raise SchematicInvalid(f"yaml: {line}{exc.problem or exc}") from None
        return yaml.compose(yaml.safe_dump(data, sort_keys=False), Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise SchematicInvalid(f"yaml: {exc}") from None
    return None


def _mapping_items(node: yaml.MappingNode, problems: _Problems) -> list[tuple[str, yaml.Node, yaml.Node]]:
    seen: dict[str, int] = {}
    items: list[tuple[str, yaml.Node, yaml.Node]] = []
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
        if key in seen:
            raise SchematicInvalid(
                f'yaml: line {key_node.start_mark.line + 1}: mapping key "{key}" already defined '
                f"at line {seen[key]}"
            )
        seen[key] = key_node.start_mark.line + 1
        items.append((key, key_node, value_node))
    return items


def _struct(
    node: yaml.Node, type_name: str, fields: Sequence[str], problems: _Problems
) -> dict[str, yaml.Node]:
    if _is_null(node):
        return {}
    if not isinstance(node, yaml.MappingNode):
        problems.cannot(node, type_name)
        return {}
    out: dict[str, yaml.Node] = {}
    for key, key_node, value_node in _mapping_items(node, problems):
        if key not in fields:
            problems.add(key_node, f"field {key} not found in type {type_name}")
            continue
        out[key] = value_node
    return out


def _string(node: yaml.Node, problems: _Problems) -> str:
    if isinstance(node, yaml.ScalarNode):
        return "" if _is_null(node) else str(node.value)
    problems.cannot(node, "string")
    return ""


def _string_list(node: yaml.Node, problems: _Problems) -> tuple[str, ...]:
    if _is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        problems.cannot(node, "[]string")
        return ()
    return tuple(_string(item, problems) for item in node.value)


def _uint(node: yaml.Node, bits: int, type_name: str, problems: _Problems) -> int:
    if _is_null(node):
        return 0
    if isinstance(node, yaml.ScalarNode) and _is_plain(node):
        tag, value = go_resolve(node.value)
        if tag == "int" and isinstance(value, int) and 0 <= value < (1 << bits):
            return value
    problems.cannot(node, type_name)
    return 0


def _bool(node: yaml.Node, problems: _Problems) -> bool:
    if _is_null(node):
        return False
    if isinstance(node, yaml.ScalarNode) and _is_plain(node):
        tag, value = go_resolve(node.value)
        if tag == "bool":
            return bool(value)
        if node.value in _OLD_BOOLS:  # go-yaml v3 still decodes YAML 1.1 booleans into bool fields
            return node.value.lower() in ("y", "yes", "on")
    problems.cannot(node, "bool")
    return False


def _any(node: yaml.Node) -> Any:
    """Decode into Go's ``any`` the way go-yaml does (timestamps stay strings for ``any`` targets)."""
    if isinstance(node, yaml.ScalarNode):
        if not _is_plain(node):
            return node.value
        tag, value = go_resolve(node.value)
        return node.value if tag in ("timestamp", "merge") else value
    if isinstance(node, yaml.SequenceNode):
        return [_any(item) for item in node.value]
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        out[_any(key_node)] = _any(value_node)
    return out


def parse_schematic(text: str | bytes) -> Schematic:
    """Parse a schematic as the factory does; raises :class:`SchematicInvalid` with go-yaml-worded errors.

    Every problem is collected before raising, in the order go-yaml meets them (field by field, as the parts
    below are called), so the report reads like the factory's.
    """
    root = _compose(_schematic_text(text))
    if root is None:
        raise SchematicInvalid("EOF")
    problems = _Problems()
    top = _struct(root, "schematic.Schematic", ("owner", "overlay", "customization"), problems)
    owner = _string(top["owner"], problems) if "owner" in top else ""
    overlay = _overlay(top["overlay"], problems) if "overlay" in top else Overlay()
    custom = (
        _struct(top["customization"], "schematic.Customization", _CUSTOM_FIELDS, problems)
        if "customization" in top
        else {}
    )
    metas = _metas(custom["meta"], problems) if "meta" in custom else ()
    extensions = _extensions(custom["systemExtensions"], problems) if "systemExtensions" in custom else ()
    enroll, well_known = (
        _secureboot(custom["secureboot"], problems) if "secureboot" in custom else ("", False)
    )
    sector = _sector_size(custom["diskImage"], problems) if "diskImage" in custom else 0
    schematic = Schematic(
        owner=owner,
        overlay=overlay,
        embedded_machine_configuration=(
            _string(custom["embeddedMachineConfiguration"], problems)
            if "embeddedMachineConfiguration" in custom
            else ""
        ),
        extra_kernel_args=_string_list(custom["extraKernelArgs"], problems)
        if "extraKernelArgs" in custom
        else (),
        meta=metas,
        official_extensions=extensions,
        bootloader=_string(custom["bootloader"], problems) if "bootloader" in custom else "",
        secureboot_enroll_keys=enroll,
        secureboot_include_well_known_certificates=well_known,
        disk_image_sector_size=sector,
    )
    if problems.items:
        raise SchematicInvalid(problems.report())
    validate(schematic)
    return schematic


_CUSTOM_FIELDS = (
    "embeddedMachineConfiguration",
    "extraKernelArgs",
    "meta",
    "systemExtensions",
    "bootloader",
    "secureboot",
    "diskImage",
)


def _schematic_text(text: str | bytes) -> str:
    """The schematic as text; invalid UTF-8 and an empty file are refused with go-yaml's words."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchematicInvalid(f"yaml: invalid UTF-8: {exc}") from None
    if not text.strip():
        raise SchematicInvalid(
            "EOF", hint="the schematic is empty; the vanilla schematic is `customization: {}`"
        )
    return text


def _overlay(node: yaml.Node, problems: _Problems) -> Overlay:
    """``overlay``: its options are free-form (the overlay's own), but must be a map."""
    ov = _struct(node, "schematic.Overlay", ("image", "name", "options"), problems)
    options: dict[str, Any] = {}
    if "options" in ov and not _is_null(ov["options"]):
        if isinstance(ov["options"], yaml.MappingNode):
            options = {str(k): v for k, v in _any(ov["options"]).items()}
        else:
            problems.cannot(ov["options"], "map[string]interface {}")
    return Overlay(
        image=_string(ov["image"], problems) if "image" in ov else "",
        name=_string(ov["name"], problems) if "name" in ov else "",
        options=options,
    )


def _metas(node: yaml.Node, problems: _Problems) -> tuple[MetaValue, ...]:
    """``customization.meta``: a list of key (uint8) and value pairs; null is an empty list, as in Go."""
    if _is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        problems.cannot(node, "[]schematic.MetaValue")
        return ()
    metas = []
    for item in node.value:
        mv = _struct(item, "schematic.MetaValue", ("key", "value"), problems)
        key = _uint(mv["key"], 8, "uint8", problems) if "key" in mv else 0
        metas.append(MetaValue(key=key, value=_string(mv["value"], problems) if "value" in mv else ""))
    return tuple(metas)


def _extensions(node: yaml.Node, problems: _Problems) -> tuple[str, ...]:
    """``customization.systemExtensions.officialExtensions``: the extensions' names."""
    se = _struct(node, "schematic.SystemExtensions", ("officialExtensions",), problems)
    return _string_list(se["officialExtensions"], problems) if "officialExtensions" in se else ()


def _secureboot(node: yaml.Node, problems: _Problems) -> tuple[str, bool]:
    """``customization.secureboot``: the enrolment mode and whether the well-known certificates are included."""
    fields = ("enrollKeys", "includeWellKnownCertificates")
    sb = _struct(node, "schematic.SecureBoot", fields, problems)
    enroll = _string(sb["enrollKeys"], problems) if "enrollKeys" in sb else ""
    well_known = "includeWellKnownCertificates" in sb and _bool(sb["includeWellKnownCertificates"], problems)
    return enroll, well_known


def _sector_size(node: yaml.Node, problems: _Problems) -> int:
    """``customization.diskImage.sectorSize``: Go's ``uint``, 64 bits here."""
    di = _struct(node, "schematic.DiskImage", ("sectorSize",), problems)
    return _uint(di["sectorSize"], 64, "uint", problems) if "sectorSize" in di else 0


def validate(schematic: Schematic) -> None:
    """Reject values outside the enumerations the factory documents (facts §2.2)."""
    if schematic.bootloader and schematic.bootloader not in BOOTLOADERS:
        raise SchematicInvalid(
            f"invalid bootloader {schematic.bootloader!r}", hint=f"one of: {', '.join(BOOTLOADERS)}"
        )
    if schematic.secureboot_enroll_keys and schematic.secureboot_enroll_keys not in ENROLL_KEYS:
        raise SchematicInvalid(
            f"invalid secureboot.enrollKeys {schematic.secureboot_enroll_keys!r}",
            hint=f"one of: {', '.join(ENROLL_KEYS)}",
        )
    if schematic.disk_image_sector_size and schematic.disk_image_sector_size not in SECTOR_SIZES:
        raise SchematicInvalid(
            f"invalid diskImage.sectorSize {schematic.disk_image_sector_size}",
            hint="one of: 512, 4096",
        )


def schematic_id(text: str | bytes) -> str:
    """The ID the factory would assign to this schematic text (YAML or JSON, any formatting)."""
    return parse_schematic(text).id


# ------------------------------------------------------------------------ go-yaml implicit type resolution

_OLD_BOOLS = frozenset(
    ("y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF")
)
_RESOLVE_MAP: dict[str, tuple[str, Any]] = {
    **{s: ("bool", True) for s in ("true", "True", "TRUE")},
    **{s: ("bool", False) for s in ("false", "False", "FALSE")},
    **{s: ("null", None) for s in ("", "~", "null", "Null", "NULL")},
    **{s: ("float", math.nan) for s in (".nan", ".NaN", ".NAN")},
    **{s: ("float", math.inf) for s in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{s: ("float", -math.inf) for s in ("-.inf", "-.Inf", "-.INF")},
    "<<": ("merge", "<<"),
}
_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_BASE60_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_TIMESTAMPS = (
    re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})[Tt](\d{1,2}):(\d{1,2}):(\d{1,2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$"),
    re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2}) (\d{1,2}):(\d{1,2}):(\d{1,2})(\.\d+)?$"),
    re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$"),
)
_DIGITS = "0123456789abcdef"


def _go_parse_int(text: str) -> int | None:
    """``strconv.ParseInt(s, 0, 64)``, falling back to ``ParseUint`` as go-yaml does."""
    sign, body = 1, text
    if body[:1] in ("+", "-"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    base = 10
    if len(body) > 1 and body[0] == "0":
        prefix = body[1].lower()
        if prefix in "xob":
            base = {"x": 16, "o": 8, "b": 2}[prefix]
            body = body[2:]
        else:
            base, body = 8, body[1:]
    if not body or any(c not in _DIGITS[:base] for c in body.lower()):
        return None
    value = sign * int(body, base)
    if -(1 << 63) <= value < (1 << 63):
        return value
    if text[0] not in "+-" and value < (1 << 64):
        return value
    return None


def _is_timestamp(text: str) -> bool:
    for pattern in _TIMESTAMPS:
        match = pattern.match(text)
        if match:
            year, month, day = (int(g) for g in match.groups()[:3])
            try:
                _dt.date(year, month, day)
            except ValueError:
                return False
            if len(match.groups()) > 3:
                hour, minute, second = (int(g) for g in match.groups()[3:6])
                return hour < 24 and minute < 60 and second < 60
            return True
    return False


def go_resolve(text: str) -> tuple[str, Any]:
    """What go-yaml reads an unquoted scalar as: (``str``/``int``/``float``/``bool``/``null``/…, value)."""
    if text in _RESOLVE_MAP:
        return _RESOLVE_MAP[text]
    first = text[:1]
    if first and (first in "+-" or "0" <= first <= "9"):
        if _is_timestamp(text):
            return "timestamp", text
        plain = text.replace("_", "")
        as_int = _go_parse_int(plain) if plain else None
        if as_int is not None:
            return "int", as_int
        if _YAML_FLOAT.match(plain):
            value = float(plain)
            if not math.isinf(value):
                return "float", value
    elif first == "." and re.fullmatch(r"\.[0-9]+(?:[eE][-+]?[0-9]+)?", text):
        return "float", float(text)
    return "str", text


def _needs_quotes(text: str) -> bool:
    """go-yaml's ``stringv``: a string that would read back as another type is double-quoted."""
    tag, _ = go_resolve(text)
    return tag != "str" or bool(_BASE60_FLOAT.match(text)) or text in _OLD_BOOLS or text == "<<"


# ---------------------------------------------------------------------------------- go-yaml emitter (subset)


class _GoMap(dict[Any, Any]):
    """A Go ``map`` (as opposed to a struct): go-yaml sorts its keys when marshalling."""


def _go_value(value: Any) -> Any:
    """Free-form data (overlay options) as Go holds it: every mapping is a map, sorted on output."""
    if isinstance(value, Mapping):
        return _GoMap({k: _go_value(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return [_go_value(v) for v in value]
    return value


def _go_key_less(a: Any, b: Any) -> bool:
    """go-yaml's ``keyList.Less``: natural ordering where digit runs compare as numbers."""
    if not isinstance(a, str) or not isinstance(b, str):
        num_a = isinstance(a, int | float)
        num_b = isinstance(b, int | float)
        if num_a and num_b:
            return bool(float(a) < float(b))
        return _kind_rank(a) < _kind_rank(b)
    ar, br = list(a), list(b)
    digits = False
    for i in range(min(len(ar), len(br))):
        if ar[i] == br[i]:
            digits = unicodedata.category(ar[i]) == "Nd"
            continue
        al, bl = ar[i].isalpha(), br[i].isalpha()
        if al and bl:
            return ar[i] < br[i]
        if al or bl:
            return al if digits else bl
        an = bn = 0
        if ar[i] == "0" or br[i] == "0":
            j = i - 1
            while j >= 0 and unicodedata.category(ar[j]) == "Nd":
                if ar[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(ar) and unicodedata.category(ar[ai]) == "Nd":
            an = an * 10 + int(ar[ai])
            ai += 1
        bi = i
        while bi < len(br) and unicodedata.category(br[bi]) == "Nd":
            bn = bn * 10 + int(br[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return ar[i] < br[i]
    return len(ar) < len(br)


def _kind_rank(value: Any) -> int:
    # reflect.Kind order: Bool < Int < Float < String (others after)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 2
    if isinstance(value, float):
        return 14
    if isinstance(value, str):
        return 24
    return 99


def _sorted_keys(mapping: Mapping[Any, Any]) -> list[Any]:
    def compare(x: Any, y: Any) -> int:
        if _go_key_less(x, y):
            return -1
        if _go_key_less(y, x):
            return 1
        return 0

    return sorted(mapping, key=cmp_to_key(compare))


def _go_format_float(value: float) -> str:
    """``strconv.FormatFloat(f, 'g', -1, 64)`` with go-yaml's ``.inf``/``.nan`` spellings."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    sign, digit_tuple, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(str(d) for d in digit_tuple).lstrip("0")
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    neg = "-" if sign else ""
    if not digits:
        return neg + "0"
    nd = len(digits)
    dp = nd + exponent  # position of the decimal point relative to the digit string
    exp = dp - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if nd > 1 else "")
        return f"{neg}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{digits}"
    if dp >= nd:
        return neg + digits + "0" * (dp - nd)
    return f"{neg}{digits[:dp]}.{digits[dp:]}"


def _is_break(ch: str) -> bool:
    return ch in "\r\n\x85\u2028\u2029"


def _is_printable(ch: str) -> bool:
    o = ord(ch)
    return o == 0x0A or 0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF or (0xE000 <= o <= 0xFFFD and o != 0xFEFF)


@dataclass
class _Analysis:
    multiline: bool
    block_plain_allowed: bool
    single_quoted_allowed: bool
    block_allowed: bool


def _analyze(value: str) -> _Analysis:
    """``yaml_emitter_analyze_scalar`` (block context only: no flow collections are ever non-empty here)."""
    if not value:
        return _Analysis(False, True, True, False)
    block_indicators = line_breaks = special = tabs = False
    leading_space = leading_break = trailing_space = trailing_break = False
    break_space = space_break = previous_space = previous_break = False
    if value.startswith(("---", "...")):
        block_indicators = True
    preceded_by_ws = True
    n = len(value)
    for i, ch in enumerate(value):
        followed_by_ws = i + 1 >= n or value[i + 1] in " \t"
        if i == 0:
            if ch in "#,[]{}&*!|>'\"%@`" or (ch in "?:-" and followed_by_ws):
                block_indicators = True
        elif (ch == ":" and followed_by_ws) or (ch == "#" and preceded_by_ws):
            block_indicators = True
        if ch == "\t":
            tabs = True
        elif not _is_printable(ch):
            special = True
        if ch == " ":
            leading_space = leading_space or i == 0
            trailing_space = trailing_space or i == n - 1
            break_space = break_space or previous_break
            previous_space, previous_break = True, False
        elif _is_break(ch):
            line_breaks = True
            leading_break = leading_break or i == 0
            trailing_break = trailing_break or i == n - 1
            space_break = space_break or previous_space
            previous_space, previous_break = False, True
        else:
            previous_space = previous_break = False
        preceded_by_ws = ch in " \t\0" or _is_break(ch)
    plain = single = block = True
    if leading_space or leading_break or trailing_space or trailing_break:
        plain = False
    if trailing_space:
        block = False
    if break_space:
        plain = single = False
    if space_break or tabs or special:
        plain = single = False
    if space_break or special:
        block = False
    if line_breaks:
        plain = False
    if block_indicators:
        plain = False
    return _Analysis(line_breaks, plain, single, block)


_ESCAPES = {
    "\0": "0",
    "\a": "a",
    "\b": "b",
    "\t": "t",
    "\n": "n",
    "\v": "v",
    "\f": "f",
    "\r": "r",
    "\x1b": "e",
    '"': '"',
    "\\": "\\",
    "\x85": "N",
    "\xa0": "_",
    "\u2028": "L",
    "\u2029": "P",
}


class _Emitter:
    """The block-style subset of go-yaml's emitter: enough for any schematic, byte-for-byte."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.column = 0
        self.indent = -1
        self.indents: list[int] = []
        self.whitespace = True
        self.indention = True
        self.open_ended = False

    # -- low-level writers (emitterc.go) --
    def put(self, text: str) -> None:
        self.out.append(text)
        self.column += len(text)

    def put_break(self) -> None:
        self.out.append("\n")
        self.column = 0
        self.indention = True

    def write_indent(self) -> None:
        indent = max(self.indent, 0)
        if not self.indention or self.column > indent or (self.column == indent and not self.whitespace):
            self.put_break()
        if self.column < indent:
            self.put(" " * (indent - self.column))
        self.whitespace = True

    def write_indicator(self, text: str, need_ws: bool, is_ws: bool, is_indention: bool) -> None:
        if need_ws and not self.whitespace:
            self.put(" ")
        self.put(text)
        self.whitespace = is_ws
        self.indention = self.indention and is_indention
        self.open_ended = False

    def increase_indent(self, flow: bool, in_sequence_item: bool) -> None:
        self.indents.append(self.indent)
        if self.indent < 0:
            self.indent = _BEST_INDENT if flow else 0
        elif in_sequence_item:
            self.indent += 2
        else:
            self.indent = _BEST_INDENT * ((self.indent + _BEST_INDENT) // _BEST_INDENT)

    def pop_indent(self) -> None:
        self.indent = self.indents.pop()

    # -- nodes --
    def node(self, value: Any, *, in_sequence_item: bool, simple_key: bool = False) -> None:
        if isinstance(value, Mapping):
            if not value:
                self.write_indicator("{", True, True, False)
                self.write_indicator("}", False, False, False)
                return
            self.increase_indent(False, in_sequence_item)
            keys = _sorted_keys(value) if isinstance(value, _GoMap) else list(value)
            for key in keys:
                _require_simple_key(key)
                self.write_indent()
                self.scalar(key, simple_key=True, in_sequence_item=False)
                self.write_indicator(":", False, False, False)
                self.node(value[key], in_sequence_item=False)
            self.pop_indent()
        elif isinstance(value, list | tuple):
            if not value:
                self.write_indicator("[", True, True, False)
                self.write_indicator("]", False, False, False)
                return
            self.increase_indent(False, in_sequence_item)
            for item in value:
                self.write_indent()
                self.write_indicator("-", True, False, True)
                self.node(item, in_sequence_item=True)
            self.pop_indent()
        else:
            self.scalar(value, simple_key=simple_key, in_sequence_item=in_sequence_item)

    def scalar(self, value: Any, *, simple_key: bool, in_sequence_item: bool) -> None:
        if value is None:
            text, style = "null", "plain"
        elif isinstance(value, bool):
            text, style = ("true" if value else "false"), "plain"
        elif isinstance(value, int):
            text, style = str(value), "plain"
        elif isinstance(value, float):
            text, style = _go_format_float(value), "plain"
        else:
            text = str(value)
            if "\n" in text:
                literal_ok = len(text.encode()) >= 2 and not text.isspace()
                style = "literal" if literal_ok else "double"
            else:
                style = "double" if _needs_quotes(text) else "plain"
        analysis = _analyze(text)
        if simple_key and analysis.multiline:
            style = "double"
        if style == "plain" and (not analysis.block_plain_allowed or (not text and simple_key)):
            style = "single"
        if style == "single" and not analysis.single_quoted_allowed:
            style = "double"
        if style == "literal" and (not analysis.block_allowed or simple_key):
            style = "double"
        self.increase_indent(True, in_sequence_item)
        if style == "plain":
            if text and not self.whitespace:
                self.put(" ")
            self.put(text)
            if text:
                self.whitespace = False
            self.indention = False
        elif style == "single":
            self.write_indicator("'", True, False, False)
            self.put(text.replace("'", "''"))
            self.write_indicator("'", False, False, False)
            self.whitespace = self.indention = False
        elif style == "double":
            self.write_indicator('"', True, False, False)
            self.put("".join(_escape(ch) for ch in text))
            self.write_indicator('"', False, False, False)
            self.whitespace = self.indention = False
        else:
            self.literal(text)
        self.pop_indent()

    def literal(self, text: str) -> None:
        self.write_indicator("|", True, False, False)
        if text[0] == " " or _is_break(text[0]):
            self.write_indicator(str(_BEST_INDENT), False, False, False)
        self.open_ended = False
        chomp = ""
        if not _is_break(text[-1]):
            chomp = "-"
        elif len(text) == 1 or _is_break(text[-2]):
            chomp = "+"
            self.open_ended = True
        if chomp:
            self.write_indicator(chomp, False, False, False)
            self.open_ended = chomp == "+"
        self.put_break()
        self.whitespace = True
        breaks = True
        for ch in text:
            if _is_break(ch):
                if ch == "\n":
                    self.put_break()
                else:
                    self.out.append(ch)
                    self.column = 0
                    self.indention = True
                breaks = True
            else:
                if breaks:
                    self.write_indent()
                self.put(ch)
                self.indention = False
                breaks = False

    def document(self, value: Any) -> str:
        self.node(value, in_sequence_item=False)
        self.indent = -1
        self.write_indent()
        if self.open_ended:
            self.write_indicator("...", True, False, False)
            self.write_indent()
        return "".join(self.out)


def _require_simple_key(key: Any) -> None:
    """go-yaml writes keys over 128 bytes or spanning lines as ``? key`` (complex keys), which this emitter
    does not reproduce; refuse rather than compute an ID the factory would not."""
    text = key if isinstance(key, str) else str(key)
    if len(text.encode()) > 128 or any(_is_break(ch) for ch in text):
        raise SchematicInvalid(
            f"overlay option key {text[:40]!r}… is too long or spans lines for an offline schematic ID",
            hint="POST the schematic to the Image Factory and use the ID it returns",
        )


def _escape(ch: str) -> str:
    if not _is_printable(ch) or ch == "\ufeff" or _is_break(ch) or ch in '"\\':
        if ch in _ESCAPES:
            return "\\" + _ESCAPES[ch]
        o = ord(ch)
        if o <= 0xFF:
            return f"\\x{o:02X}"
        if o <= 0xFFFF:
            return f"\\u{o:04X}"
        return f"\\U{o:08X}"
    return ch


def go_yaml_marshal(value: Any) -> str:
    """``yaml.Marshal`` of go-yaml (v3/v4 defaults: 4-space indent, no line wrapping) for block values.

    Python ``dict`` stands for a Go struct (order kept); wrap a ``dict`` in :class:`_GoMap` for a Go map
    (keys sorted the go-yaml way).
    """
    return _Emitter().document(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
