"""``runbook schematic id|show``: schematic IDs computed offline, exactly as the Image Factory computes them.

Why a command: users keep schematics in git and want to know the ID (and so the installer image) without
posting to a factory, e.g. to compare with what ``talosctl get extensions`` shows for ``schematic``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runbook_lib.errors import PermanentError
from runbook_lib.model.boot_assets import boot_asset_urls, installer_image
from runbook_lib.model.params import load_params
from runbook_lib.model.plan import node_extensions, node_schematic
from runbook_lib.model.schematic import Schematic, parse_schematic

from .cmd_params import add_params_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("schematic", help="Image Factory schematics: canonical form and ID, offline")
    actions = group.add_subparsers(dest="schematic_command", metavar="ACTION", required=True)

    ident = actions.add_parser(
        "id", help="print the schematic ID of a schematic file (YAML or JSON; '-' reads stdin)"
    )
    ident.add_argument("file", metavar="FILE")
    ident.set_defaults(handler=_id)

    show = actions.add_parser(
        "show", help="print the canonical YAML, ID and installer image of the plan's GPU schematic"
    )
    add_params_args(show)
    show.add_argument("--node", metavar="NAME", help="the schematic of one node (with its overrides)")
    show.add_argument("--format", choices=["yaml", "json"], default="yaml")
    show.add_argument(
        "--assets", action="store_true", help="also list ISO, disk image and PXE URLs (always in JSON)"
    )
    show.set_defaults(handler=_show)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise PermanentError(f"cannot read {path}: {exc.strerror}") from None


def _id(args: argparse.Namespace) -> int:
    sys.stdout.write(parse_schematic(_read(args.file)).id + "\n")
    return 0


def _show(args: argparse.Namespace) -> int:
    params = load_params(args.params, args.overrides)
    node = None
    if args.node:
        matches = [n for n in params.nodes if args.node in (n.name, n.address)]
        if not matches:
            names = ", ".join(n.name for n in params.nodes)
            raise PermanentError(f"no node {args.node!r} in {args.params}", hint=f"nodes: {names}")
        node = matches[0]
    extensions = node_extensions(
        params, params.profile(node), node.overrides.extra_extensions if node else ()
    )
    found = node_schematic(params, node)
    if found is None:
        raise PermanentError(
            f"Talos {params.talos} predates the Image Factory: there is no schematic",
            hint="extensions are installed through machine.install.extensions and the stock installer "
            f"({installer_image(None, '', params.talos)}); see `runbook plan`",
        )
    schematic: Schematic = found
    factory = params.image_factory_url
    installer = installer_image(factory, schematic.id, params.talos, secureboot=params.secureboot)
    assets = boot_asset_urls(factory, schematic.id, params.talos, secureboot=params.secureboot)
    if args.format == "json":
        data = {
            "id": schematic.id,
            "schematic": schematic.canonical_yaml(),
            "extensions": extensions,
            "installer_image": installer,
            "boot_assets": assets,
        }
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    # Comments only after the YAML: the output stays a valid schematic (`... | runbook schematic id -`).
    sys.stdout.write(schematic.canonical_yaml())
    sys.stdout.write(f"# id: {schematic.id}\n# installer: {installer}\n")
    if args.assets:
        sys.stdout.writelines(f"# {key}: {url}\n" for key, url in assets.items() if key != "installer")
    return 0
