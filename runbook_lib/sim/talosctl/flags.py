"""A cobra/pflag-compatible command-line parser driven by the real talosctl flag tables.

The library builds talosctl argv by hand; the only way to catch a flag that the installed talosctl does not
know (or knows under another name) before it reaches a real cluster is to reject it here exactly as pflag
does, with pflag's messages, for the client version being simulated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.sim.talosctl.flagtables import TABLES


class UsageError(Exception):
    """A cobra/pflag error: talosctl prints the message, a blank line and the command's usage."""

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message)
        self.command = command


@dataclass(frozen=True)
class FlagSpec:
    short: str
    name: str
    type: str
    help: str
    default: str | None

    @property
    def takes_value(self) -> bool:
        return self.type != ""

    @property
    def is_list(self) -> bool:
        return self.type in ("strings", "stringArray")


@dataclass
class Parsed:
    command: str
    args: list[str]
    values: dict[str, Any] = field(default_factory=dict)
    set_flags: set[str] = field(default_factory=set)

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


def table_version(client_minor: tuple[int, int]) -> str:
    """Which reference table describes a client: 1.10 for anything older (the oldest reference we have)."""
    if client_minor <= (1, 10):
        return "1.10"
    if client_minor >= (1, 13):
        return "1.13"
    return f"{client_minor[0]}.{client_minor[1]}"


def command_table(command: str, client_minor: tuple[int, int]) -> dict[str, Any] | None:
    table: dict[str, Any] | None = TABLES[table_version(client_minor)].get(command)
    return table


#: Flags the real binary registers but hides from its help, so the CLI reference (and the tables) omit
#: them: accepted, never listed.  ``upgrade --preserve``: ``MarkHidden`` from talos@v1.8.0 to v1.12,
#: ``MarkDeprecated`` (also hidden) from v1.13 (cmd/talosctl/cmd/talos/upgrade.go); visible before 1.8.
HIDDEN_FLAGS: dict[str, list[tuple[str, str, str, str | None]]] = {"upgrade": [("p", "preserve", "", None)]}
#: From 1.13 the legacy-only upgrade flags are ``MarkDeprecated`` (hidden, and pflag prints
#: ``Flag --<name> has been deprecated, <message>`` on stderr when one is used): talos@v1.13.0
#: cmd/talosctl/cmd/talos/upgrade.go:368-376; seen from the real talosctl v1.13.0.
DEPRECATED_113: dict[str, tuple[list[tuple[str, str, str, str | None]], str]] = {
    "upgrade": (
        [
            ("f", "force", "", None),
            ("", "insecure", "", None),
            ("p", "preserve", "", None),
            ("s", "stage", "", None),
        ],
        "legacy flag for MachineService.Upgrade fallback, to be removed in Talos 1.18",
    )
}


def hidden_flags(command: str, client_minor: tuple[int, int]) -> list[tuple[str, str, str, str | None]]:
    """The command's hidden flags for this client (deprecated ones from 1.13 included)."""
    if client_minor >= (1, 13) and command in DEPRECATED_113:
        return DEPRECATED_113[command][0]
    return HIDDEN_FLAGS.get(command, [])


def deprecation_lines(parsed: Parsed, client_minor: tuple[int, int]) -> list[str]:
    """pflag's notice for each deprecated flag the command line set (before the command runs)."""
    if client_minor < (1, 13) or parsed.command not in DEPRECATED_113:
        return []
    flags, message = DEPRECATED_113[parsed.command]
    return [
        f"Flag --{name} has been deprecated, {message}"
        for _s, name, _t, _d in flags
        if name in parsed.set_flags
    ]


def flag_specs(command: str, client_minor: tuple[int, int]) -> tuple[list[FlagSpec], list[FlagSpec]]:
    table = command_table(command, client_minor)
    if table is None:
        return [], []
    local = [FlagSpec(short, name, typ, "", default) for short, name, typ, default in table["flags"]]
    inherited = [FlagSpec(short, name, typ, "", default) for short, name, typ, default in table["inherited"]]
    return local, inherited


_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go ``time.ParseDuration`` → seconds (raises ValueError with Go's message)."""
    if text == "0":
        return 0.0
    if not _DURATION_RE.match(text):
        raise ValueError(f'time: invalid duration "{text}"')
    return sum(float(n) * _UNIT[u] for n, u in _DURATION_PART.findall(text))


_BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _default_value(spec: FlagSpec) -> Any:
    if not spec.takes_value:
        return spec.default == "true"
    if spec.is_list:
        return []
    if spec.type == "duration":
        return parse_duration(spec.default) if spec.default else 0.0
    if spec.default is None:
        return ""
    d = spec.default
    return d[1:-1] if d.startswith('"') and d.endswith('"') else d


def _flag_label(spec: FlagSpec) -> str:
    return f"-{spec.short}, --{spec.name}" if spec.short else f"--{spec.name}"


def _set(spec: FlagSpec, raw: str, parsed: Parsed) -> None:
    try:
        if not spec.takes_value:
            if raw in _BOOL_TRUE:
                value: Any = True
            elif raw in _BOOL_FALSE:
                value = False
            else:
                raise ValueError(f'strconv.ParseBool: parsing "{raw}": invalid syntax')
        elif spec.type == "duration":
            value = parse_duration(raw)
        elif spec.type == "strings":
            items = [v.strip() for v in raw.split(",") if v.strip()]
            value = [*parsed.values[spec.name], *items] if spec.name in parsed.set_flags else items
        elif spec.type == "stringArray":
            value = [*parsed.values.get(spec.name, []), raw] if spec.name in parsed.set_flags else [raw]
        elif "," in spec.type:  # an enum such as the apply mode
            options = [o.strip() for o in spec.type.split(",")]
            if raw not in options:
                raise ValueError(f"possible options are: {', '.join(options)}")
            value = raw
        else:
            value = raw
    except ValueError as exc:
        raise UsageError(f'invalid argument "{raw}" for "{_flag_label(spec)}" flag: {exc}') from None
    parsed.values[spec.name] = value
    parsed.set_flags.add(spec.name)


def parse(command: str, argv: list[str], client_minor: tuple[int, int]) -> Parsed:
    """Parse flags anywhere in ``argv`` (pflag interspersed mode); positional arguments are kept in order."""
    local, inherited = flag_specs(command, client_minor)
    hidden = [
        FlagSpec(s, name, typ, "", default) for s, name, typ, default in hidden_flags(command, client_minor)
    ]
    specs = local + hidden + inherited
    by_name = {s.name: s for s in specs}
    by_short = {s.short: s for s in specs if s.short}
    parsed = Parsed(command=command, args=[])
    for s in specs:
        parsed.values[s.name] = _default_value(s)
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            parsed.args.extend(argv[i:])
            break
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            spec = by_name.get(name)
            if spec is None:
                raise UsageError(f"unknown flag: --{name}", command)
            if eq:
                _set(spec, value, parsed)
            elif not spec.takes_value:
                _set(spec, "true", parsed)
            elif i < len(argv):
                _set(spec, argv[i], parsed)
                i += 1
            else:
                raise UsageError(f"flag needs an argument: --{name}", command)
        elif arg.startswith("-") and len(arg) > 1:
            shorts = arg[1:]
            j = 0
            while j < len(shorts):
                c = shorts[j]
                spec = by_short.get(c)
                if spec is None:
                    raise UsageError(f"unknown shorthand flag: '{c}' in -{shorts}", command)
                rest = shorts[j + 1 :]
                if not spec.takes_value:
                    if rest.startswith("="):
                        _set(spec, rest[1:], parsed)
                        break
                    _set(spec, "true", parsed)
                    j += 1
                    continue
                if rest:
                    _set(spec, rest[1:] if rest.startswith("=") else rest, parsed)
                elif i < len(argv):
                    _set(spec, argv[i], parsed)
                    i += 1
                else:
                    raise UsageError(f"flag needs an argument: '{c}' in -{c}", command)
                break
        else:
            parsed.args.append(arg)
    return parsed


def strip_flags_for_lookup(argv: list[str], client_minor: tuple[int, int]) -> list[str]:
    """Positional words, skipping flag values, as cobra's ``stripFlags`` does to find the subcommand."""
    value_flags: set[str] = set()
    for table in TABLES[table_version(client_minor)].values():
        for short, name, typ, _default in table["flags"] + table["inherited"]:
            if typ:
                value_flags.add(f"--{name}")
                if short:
                    value_flags.add(f"-{short}")
    words: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--":
            break
        if a.startswith("-"):
            if "=" not in a and a in value_flags:
                i += 1
            continue
        words.append(a)
    return words


def format_flag_usages(specs: list[FlagSpec]) -> str:
    """pflag's ``FlagUsages``: aligned columns, help, and ``(default X)``."""
    lines: list[tuple[str, str]] = []
    for s in sorted(specs, key=lambda s: s.name):
        left = f"  -{s.short}, --{s.name}" if s.short else f"      --{s.name}"
        if s.type:
            left += f" {s.type}"
        right = s.help
        if s.default is not None:
            right += f" (default {s.default})"
        lines.append((left, right))
    width = max((len(left) for left, _ in lines), default=0)
    return "\n".join(f"{left.ljust(width)}   {right}" for left, right in lines)


def usage(command: str, client_minor: tuple[int, int]) -> str:
    """cobra's default usage template for a command."""
    table = command_table(command, client_minor) or {}
    local, inherited = flag_specs(command, client_minor)
    out = "Usage:\n"
    if command == "":
        out += "  talosctl [command]\n\nAvailable Commands:\n"
        subs = table.get("subcommands", [])
        width = max((len(s) for s in subs), default=0)
        out += "".join(f"  {s.ljust(width)}\n" for s in subs)
    else:
        out += f"  {table.get('use', 'talosctl ' + command)}\n"
    if local:
        out += "\nFlags:\n" + format_flag_usages(local) + "\n"
    if inherited:
        out += "\nGlobal Flags:\n" + format_flag_usages(inherited) + "\n"
    if command == "":
        out += '\nUse "talosctl [command] --help" for more information about a command.\n'
    return out
