"""YAML for text we did not write: parameter files and pasted ``talosctl`` outputs.

Why not ``yaml.safe_load``: it is safe against code execution only.  It silently keeps the *last* of two
equal keys (so a file whose reviewer sees ``apply: false`` can apply, attack report F3), and it builds
whatever an alias graph describes: a 1 KB "billion laughs" file expands to gigabytes as soon as anything
walks it, and a deeply nested one ends in ``RecursionError`` (attack report F11).  YAML itself says keys
are unique ("each of the keys is unique", YAML 1.2.2 §3.2.1.1, https://yaml.org/spec/1.2.2/).

This loader refuses (the size and depth limits while composing, before anything is constructed or
expanded; repeated keys are all collected and reported together):

- a key repeated in one mapping (merge keys ``<<`` excepted: overriding them is their purpose);
- nesting deeper than :data:`MAX_DEPTH`, counted through aliases;
- more than :data:`MAX_NODES` nodes per stream, counted as if every alias were expanded (this bounds both
  the alias bomb and the memory a merely huge file costs);
- an alias to the node that contains it (a cycle);
- an integer literal longer than :data:`MAX_NUMBER_CHARS` characters.

Every refusal is a :class:`yaml.MarkedYAMLError`, so callers that already report ``YAMLError`` with its
line keep working.
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass
from typing import Any, cast

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
"""Deepest nesting accepted; talosctl resources and parameter files need fewer than 10 levels."""
MAX_NODES = 2_000_000
"""Nodes per stream with aliases expanded; 32 MiB of real talosctl YAML is about 1.5 million."""

MAX_NUMBER_CHARS = 64
"""Longest integer literal accepted; no talosctl field or parameter comes close."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlRefused(yaml.MarkedYAMLError):
    """Well-formed YAML this loader will not build (duplicate key, too deep, too big, cyclic)."""


@dataclass(frozen=True)
class Duplicate:
    """One repeated key: ``path`` (keys and list indexes, ending in the key) and the ``lines`` of both."""

    path: tuple[str | int, ...]
    lines: tuple[int, int]

    def __str__(self) -> str:
        where = f" in {'.'.join(map(str, self.path[:-1]))}" if len(self.path) > 1 else ""
        return f"duplicate key {self.path[-1]!r}{where} on lines {self.lines[0]} and {self.lines[1]}"


class DuplicateKeys(YamlRefused):
    """Mappings repeat keys; ``found`` lists every one, so a file is fixed in one pass."""

    def __init__(self, found: list[Duplicate], mark: Any) -> None:
        self.found = found
        super().__init__(problem="; ".join(map(str, found)), problem_mark=mark)


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` with the refusals of the module docstring, checked in ``compose_node``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str | int] = []
        self._depth: dict[int, int] = {}
        self._weight: dict[int, int] = {}
        self._total = 0
        self.duplicates: list[Duplicate] = []
        self._first_duplicate: Any = None
        self.top_keys: frozenset[str] = frozenset()
        # (mapping, pair index) of each key or value written as an alias (``*k : true``, ``apply: *t``)
        self._aliased: set[tuple[int, int]] = set()

    def compose_document(self) -> Node | None:
        self._depth, self._weight = {}, {}
        node: Node | None = super().compose_document()
        if isinstance(node, MappingNode):
            self.top_keys = frozenset(
                str(key.value)
                for index, (key, _) in enumerate(node.value)
                if isinstance(key, ScalarNode)
                and key.tag != _MERGE_TAG
                and (id(node), index) not in self._aliased
            )
        return node

    def _mark(self) -> Any:
        """Where the next event starts (for the error's line and column)."""
        return self.peek_event().start_mark  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self._mark()
        if self.check_event(yaml.AliasEvent):
            target: Node | None = super().compose_node(parent, index)
            if target is None or id(target) not in self._weight:
                raise YamlRefused(problem="an alias refers to a node that contains it", problem_mark=mark)
            if isinstance(parent, MappingNode):  # the pair being composed: PyYAML appends it after its value
                self._aliased.add((id(parent), len(parent.value)))
            self._count(self._weight[id(target)], self._depth[id(target)], mark)
            return target
        label = index.value if isinstance(index, ScalarNode) else index
        if label is not None:
            self._path.append(label if isinstance(label, int) else str(label))
        if len(self._path) > MAX_DEPTH:
            raise YamlRefused(problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=mark)
        node = cast(Node, super().compose_node(parent, index))
        if isinstance(node, MappingNode):
            self._check_unique(node)
        if label is not None:
            self._path.pop()
        children = _children(node)
        self._depth[id(node)] = 1 + max((self._depth[id(c)] for c in children), default=0)
        self._weight[id(node)] = 1 + sum(self._weight[id(c)] for c in children)
        self._count(1, self._depth[id(node)], mark)
        return node

    def _check_unique(self, node: MappingNode) -> None:
        seen: dict[tuple[str, str], Node] = {}
        for key, _value in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                lines = (first.start_mark.line + 1, key.start_mark.line + 1)
                self.duplicates.append(Duplicate((*self._path, key.value), lines))
                self._first_duplicate = self._first_duplicate or key.start_mark

    def raise_duplicates(self) -> None:
        if self.duplicates:
            raise DuplicateKeys(self.duplicates, self._first_duplicate)

    def construct_bounded_int(self, node: ScalarNode) -> int:
        """An integer of at most :data:`MAX_NUMBER_CHARS` characters: Python refuses ``int()`` of more than
        4,300 digits and ``repr()`` of a bigger hex value, which would surface as a traceback."""
        if len(node.value) > MAX_NUMBER_CHARS:
            raise YamlRefused(
                problem=f"a number of {len(node.value)} characters (at most {MAX_NUMBER_CHARS})",
                problem_mark=node.start_mark,
            )
        value: int = self.construct_yaml_int(node)
        return value

    def _count(self, weight: int, depth: int, mark: Any) -> None:
        self._total += weight
        if self._total > MAX_NODES:
            raise YamlRefused(
                problem=f"more than {MAX_NODES} values (aliases expanded): refused as too big",
                problem_mark=mark,
            )
        if depth + len(self._path) > MAX_DEPTH:
            raise YamlRefused(
                problem=f"nested deeper than {MAX_DEPTH} levels (aliases expanded)",
                problem_mark=mark,
            )


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_bounded_int)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load(text: str) -> Any:
    """One YAML document, with the refusals of the module docstring."""
    return load_with_keys(text)[0]


def load_with_keys(text: str) -> tuple[Any, frozenset[str]]:
    """:func:`load`, and the keys the document's top-level mapping writes out in place: key and value, not
    through a merge key (``<<: *defaults``) nor an alias (``cluster: &k apply`` then ``*k : true``; ``apply: *t``).

    Why: a value that only a merge key gives is easy to miss in review (``grep '^apply:'`` finds nothing), so
    a caller can insist that a key which approves a change is written where a reviewer reads it.
    """
    loader = _StrictLoader(text)
    try:
        data = loader.get_single_data()
        loader.raise_duplicates()
        return data, loader.top_keys
    finally:
        loader.dispose()


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream (``talosctl get -o yaml`` prints one per resource)."""
    loader = _StrictLoader(text)
    try:
        docs: list[Any] = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            docs.append(loader.get_data())
        loader.raise_duplicates()
        return docs
    finally:
        loader.dispose()


def _near(path: str) -> str:
    """``"; did you mean …"`` naming a file of the same folder with a close name (``params/x.yml`` for ``x.yaml``:
    operator walkthrough, stop 52), or ""."""
    folder, name = os.path.split(path)
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return ""
    # not the name itself: a dangling symlink is listed, and not found (review)
    close = difflib.get_close_matches(name, [n for n in names if n != name], n=1, cutoff=0.8)
    return f"; did you mean {os.path.join(folder, close[0])}?" if close else ""


class NotReadable(Exception):
    """A file that is not a regular file, cannot be opened, or is larger than the caller accepts."""


def read_regular_file(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file; anything else is :class:`NotReadable`, never a hang.

    Opened non-blocking and checked with ``fstat`` on the open descriptor: a FIFO with no writer would
    block ``open`` forever, ``/dev/zero`` would fill memory, and a check before ``open`` could be raced.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise NotReadable("file not found" + _near(path)) from None
    except OSError as exc:
        raise NotReadable(f"cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
            raise NotReadable(f"not a regular file ({kind})")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise NotReadable(f"larger than {_size(limit)}; refused")
    return data


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"
