"""Generate ``configkeys.json``: the YAML keys each v1alpha1 config struct of a Talos release decodes.

Why: talosctl decodes a machine-config patch strictly (``KnownFields(true)`` and ``xyaml.CheckUnknownKeys``,
talos@v1.12.0 pkg/machinery/config/configloader/internal/decoder/decoder.go:71,177; configpatcher/load.go), so a
misspelt key is refused before any node is called (reality-gaps.md §2 row 4). The simulated talosctl needs the
same key sets; they come from the Go types, not the JSON schema, because the schema leaves out fields the decoder
still accepts (``machine.time``, ``machine.registries`` at v1.12.0).

Run by hand against a clone of siderolabs/talos (not at runtime; the output is committed)::

    python -m runbook_lib.sim.talosctl.gen_configkeys /path/to/talos > runbook_lib/sim/talosctl/configkeys.json

It reads ``pkg/machinery/config/types/v1alpha1/*.go`` at each tag of ``TAGS``: every ``type X struct`` with its
fields' ``yaml`` tags (an untagged field is its lower-cased name, as xyaml ``structKeys`` does), named slice and
map types, and the types with their own ``UnmarshalYAML`` (whose content xyaml does not check).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

TAGS = {
    "1.3": "v1.3.0",
    "1.4": "v1.4.0",
    "1.5": "v1.5.0",
    "1.6": "v1.6.0",
    "1.7": "v1.7.0",
    "1.8": "v1.8.0",
    "1.9": "v1.9.0",
    "1.10": "v1.10.0",
    "1.11": "v1.11.0",
    "1.12": "v1.12.0",
    "1.13": "v1.13.0",
    "1.14": "v1.14.0-rc.1",
}
PACKAGE = "pkg/machinery/config/types/v1alpha1"
_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
_FIELD = re.compile(r"^\t(\w+)\s+([^\s`]+)(?:\s+`([^`]*)`)?", re.M)
_NAMED = re.compile(r"^type (\w+) ((?:\[\]|map\[string\])\*?[\w.]+)\s*$", re.M)
_UNMARSHALER = re.compile(r"^func \(\w+ \*?(\w+)\) UnmarshalYAML\(", re.M)


def _sources(repo: str, tag: str) -> str:
    names = subprocess.run(
        ["git", "-C", repo, "ls-tree", "--name-only", f"{tag}:{PACKAGE}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = [n for n in names if n.endswith(".go") and not n.endswith("_test.go")]
    return "\n".join(
        subprocess.run(
            ["git", "-C", repo, "show", f"{tag}:{PACKAGE}/{n}"], capture_output=True, text=True, check=True
        ).stdout
        for n in files
    )


def _fields(body: str) -> list[list[str]]:
    out: list[list[str]] = []
    for name, typ, tags in _FIELD.findall(body):
        yaml_tag = re.search(r'yaml:"([^"]*)"', tags or "")
        key = yaml_tag.group(1).split(",")[0] if yaml_tag else name.lower()
        if key == "-" or (yaml_tag and yaml_tag.group(1).startswith(",")):
            continue  # skipped or inlined: the config structs inline no fields the runbook patches
        out.append([key, typ])
    return out


_INLINE_MAP = re.compile(r'^\t\w+\s+(map\[string\]\S+)\s+`yaml:",inline"`', re.M)


def release_types(source: str) -> dict[str, Any]:
    """{"structs": {name: [[key, go type], ...]}, "named": {name: go type}, "custom": [names]}.

    A struct that inlines a map (``Unstructured``) takes any key, as xyaml ``structKeys`` says: it is listed as
    that map type."""
    structs, named = {}, dict(_NAMED.findall(source))
    for name, body in _STRUCT.findall(source):
        inline = _INLINE_MAP.search(body)
        if inline:
            named[name] = inline.group(1)
        else:
            structs[name] = _fields(body)
    return {"structs": structs, "named": named, "custom": sorted(set(_UNMARSHALER.findall(source)))}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m runbook_lib.sim.talosctl.gen_configkeys TALOS_REPO\n")
        return 2
    data = {minor: release_types(_sources(argv[0], tag)) for minor, tag in TAGS.items()}
    sys.stdout.write(json.dumps({"tags": TAGS, "releases": data}, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
