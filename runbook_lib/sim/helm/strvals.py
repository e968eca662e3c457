"""Helm's ``--set`` syntax (``a.b=c,d[0].e=f``) with its typing rules (ints, bools, null), as in helm's strvals."""

from __future__ import annotations

import re
from typing import Any

_IDX = re.compile(r"^(.*?)\[(\d+)\]$")


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, i, depth = [], "", 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur += text[i + 1]
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    return parts


def typed(value: str) -> Any:
    if value == "true":
        return True
    if value == "false":
        return False
    if value == "null":
        return None
    if re.fullmatch(r"-?[1-9][0-9]*|0", value):
        return int(value)
    return value


def _split_key(key: str) -> list[str]:
    out, cur, i = [], "", 0
    while i < len(key):
        if key[i] == "\\" and i + 1 < len(key):
            cur += key[i + 1]
            i += 2
            continue
        if key[i] == ".":
            out.append(cur)
            cur = ""
        else:
            cur += key[i]
        i += 1
    out.append(cur)
    return out


def set_path(target: dict[str, Any], key: str, value: Any) -> None:
    cur: Any = target
    parts = _split_key(key)
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        m = _IDX.match(part)
        name, idx = (m.group(1), int(m.group(2))) if m else (part, None)
        if idx is None:
            if last:
                cur[name] = value
            else:
                if not isinstance(cur.get(name), dict):
                    cur[name] = {}
                cur = cur[name]
            continue
        lst = cur.get(name) if isinstance(cur.get(name), list) else []
        cur[name] = lst
        while len(lst) <= idx:
            lst.append(None)  # helm pads skipped indexes with null
        if last:
            lst[idx] = value
        else:
            if not isinstance(lst[idx], dict):
                lst[idx] = {}
            cur = lst[idx]


def parse_set(expr: str, target: dict[str, Any], *, as_string: bool = False) -> None:
    for item in _split_unescaped(expr, ","):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f'failed parsing --set data: key "{item}" has no value')
        key, value = item.split("=", 1)
        if value.startswith("{") and value.endswith("}"):
            val: Any = [
                typed(v) if not as_string else v for v in _split_unescaped(value[1:-1], ",") if v != ""
            ]
        else:
            val = value if as_string else typed(value)
        set_path(target, key, val)
