"""Command line of the simulated helm: cobra-style flag parsing, helm's messages and exit codes."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from runbook_lib.sim import charts
from runbook_lib.sim.helm.kube import Kube, KubeError
from runbook_lib.sim.helm.strvals import parse_set, set_path
from runbook_lib.sim.kubeapi import resources as rt

HELM_VERSION = "v3.18.0"
SECRETS = rt.BY_KEY["v1/secrets"]
NAMESPACES = rt.BY_KEY["v1/namespaces"]
POLL_S = 0.2


class HelmError(Exception):
    pass


# --- flag parsing -------------------------------------------------------------------------------------

GLOBAL_FLAGS: dict[str, tuple[str | None, bool]] = {
    # long name: (shorthand, takes value)
    "namespace": ("n", True),
    "kubeconfig": (None, True),
    "kube-context": (None, True),
    "debug": (None, False),
    "repository-config": (None, True),
    "repository-cache": (None, True),
    "registry-config": (None, True),
    "burst-limit": (None, True),
    "qps": (None, True),
    "kube-token": (None, True),
    "kube-apiserver": (None, True),
    "kube-as-user": (None, True),
    "kube-insecure-skip-tls-verify": (None, False),
    "kube-tls-server-name": (None, True),
    "kube-ca-file": (None, True),
    "content-cache": (None, True),
    "help": ("h", False),
}
INSTALL_FLAGS: dict[str, tuple[str | None, bool]] = {
    "version": (None, True),
    "set": (None, True),
    "set-string": (None, True),
    "set-file": (None, True),
    "set-json": (None, True),
    "set-literal": (None, True),
    "values": ("f", True),
    "create-namespace": (None, False),
    "wait": (None, False),
    "wait-for-jobs": (None, False),
    "timeout": (None, True),
    "atomic": (None, False),
    "dry-run": (None, False),
    "description": (None, True),
    "devel": (None, False),
    "skip-crds": (None, False),
    "no-hooks": (None, False),
    "disable-openapi-validation": (None, False),
    "render-subchart-notes": (None, False),
    "replace": (None, False),
    "output": ("o", True),
    "repo": (None, True),
    "username": (None, True),
    "password": (None, True),
    "verify": (None, False),
    "keyring": (None, True),
    "insecure-skip-tls-verify": (None, False),
    "plain-http": (None, False),
    "post-renderer": (None, True),
    "labels": ("l", True),
    "enable-dns": (None, False),
    "skip-schema-validation": (None, False),
    "take-ownership": (None, False),
    "hide-notes": (None, False),
    "dependency-update": (None, False),
    "ca-file": (None, True),
    "cert-file": (None, True),
    "key-file": (None, True),
    "pass-credentials": (None, False),
    "rollback-on-failure": (None, False),
    "force-replace": (None, False),
}
COMMANDS: dict[str, dict[str, tuple[str | None, bool]]] = {
    "install": {**INSTALL_FLAGS, "generate-name": ("g", False), "name-template": (None, True)},
    "upgrade": {
        **INSTALL_FLAGS,
        "install": ("i", False),
        "force": (None, False),
        "reuse-values": (None, False),
        "reset-values": (None, False),
        "reset-then-reuse-values": (None, False),
        "history-max": (None, True),
        "cleanup-on-fail": (None, False),
    },
    "uninstall": {
        "wait": (None, False),
        "timeout": (None, True),
        "keep-history": (None, False),
        "dry-run": (None, False),
        "no-hooks": (None, False),
        "ignore-not-found": (None, False),
        "cascade": (None, True),
        "description": (None, True),
    },
    "list": {
        "output": ("o", True),
        "all-namespaces": ("A", False),
        "all": ("a", False),
        "deployed": (None, False),
        "failed": (None, False),
        "pending": (None, False),
        "short": ("q", False),
        "filter": ("f", True),
        "max": ("m", True),
        "offset": (None, True),
        "reverse": ("r", False),
        "date": ("d", False),
        "time-format": (None, True),
        "no-headers": (None, False),
        "superseded": (None, False),
        "uninstalled": (None, False),
        "uninstalling": (None, False),
        "selector": ("l", True),
    },
    "status": {
        "output": ("o", True),
        "revision": (None, True),
        "show-desc": (None, False),
        "show-resources": (None, False),
    },
    "repo add": {
        "force-update": (None, False),
        "username": (None, True),
        "password": (None, True),
        "pass-credentials": (None, False),
        "insecure-skip-tls-verify": (None, False),
        "no-update": (None, False),
        "allow-deprecated-repos": (None, False),
        "ca-file": (None, True),
        "cert-file": (None, True),
        "key-file": (None, True),
        "password-stdin": (None, False),
        "timeout": (None, True),
    },
    "repo update": {"fail-on-repo-update-fail": (None, False), "timeout": (None, True)},
    "repo list": {"output": ("o", True)},
    "repo remove": {},
    "get values": {"all": ("a", False), "output": ("o", True), "revision": (None, True)},
    "get manifest": {"revision": (None, True)},
    "search repo": {
        "versions": (None, False),
        "version": (None, True),
        "output": ("o", True),
        "devel": (None, False),
        "regexp": ("r", False),
        "max-col-width": (None, True),
    },
    "version": {"short": (None, False), "template": (None, True)},
    "history": {"output": ("o", True), "max": (None, True)},
}
ALIASES = {
    "ls": "list",
    "un": "uninstall",
    "del": "uninstall",
    "delete": "uninstall",
    "remove": "uninstall",
    "rm": "uninstall",
    "hist": "history",
}
REPO_ALIASES = {"ls": "list", "rm": "remove", "up": "update"}


@dataclass
class Args:
    command: str
    positional: list[str] = field(default_factory=list)
    flags: dict[str, list[str]] = field(default_factory=dict)

    def one(self, name: str, default: str | None = None) -> str | None:
        vals = self.flags.get(name)
        return vals[-1] if vals else default

    def many(self, name: str) -> list[str]:
        return self.flags.get(name, [])

    def on(self, name: str) -> bool:
        val = self.one(name)
        return val is not None and val.lower() not in ("false", "0")


def parse(argv: list[str]) -> Args:
    words: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif (a.startswith("--") and "=" not in a and GLOBAL_FLAGS.get(a[2:], (None, False))[1]) or (
            a.startswith("-") and not a.startswith("--") and len(a) == 2 and a[1] in ("n",)
        ):
            skip = True
        elif not a.startswith("-"):
            words.append(a)
    if not argv or not words:
        raise HelmError("__usage__")
    # Identify the command (first non-flag words), allowing flags before it.
    first = ALIASES.get(words[0], words[0])
    if first in ("repo", "get", "search"):
        sub = words[1] if len(words) > 1 else ""
        sub = REPO_ALIASES.get(sub, sub) if first == "repo" else sub
        command = f"{first} {sub}"
        n_cmd_words = 2
    else:
        command, n_cmd_words = first, 1
    if command not in COMMANDS:
        raise HelmError(f'unknown command "{words[0]}" for "helm"\nRun \'helm --help\' for usage.')
    table = {**GLOBAL_FLAGS, **COMMANDS[command]}
    shorts = {s: long for long, (s, _) in table.items() if s}
    out = Args(command)
    i, skipped = 0, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out.positional += argv[i + 1 :]
            break
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            if name not in table:
                raise HelmError(f"unknown flag: --{name}")
            takes = table[name][1]
            if takes and not eq:
                if i + 1 >= len(argv):
                    raise HelmError(f"flag needs an argument: --{name}")
                val = argv[i + 1]
                i += 1
            out.flags.setdefault(name, []).append(val if (takes or eq) else "true")
        elif a.startswith("-") and len(a) > 1:
            ch = a[1]
            if ch not in shorts:
                raise HelmError(f"unknown shorthand flag: '{ch}' in {a}")
            name = shorts[ch]
            takes = table[name][1]
            rest = a[2:]
            if takes:
                if rest:
                    val = rest[1:] if rest.startswith("=") else rest
                else:
                    if i + 1 >= len(argv):
                        raise HelmError(f"flag needs an argument: '{ch}' in -{ch}")
                    val = argv[i + 1]
                    i += 1
                out.flags.setdefault(name, []).append(val)
            else:
                out.flags.setdefault(name, []).append("true")
        elif skipped < n_cmd_words:
            skipped += 1
        else:
            out.positional.append(a)
        i += 1
    return out


# --- repositories -------------------------------------------------------------------------------------


def repo_file(args: Args) -> Path:
    explicit = args.one("repository-config") or os.environ.get("HELM_REPOSITORY_CONFIG")
    if explicit:
        return Path(explicit)
    state = os.environ.get("RUNBOOK_SIM_STATE")
    if state:
        return Path(state) / "helm" / "repositories.yaml"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "helm" / "repositories.yaml"


def load_repos(args: Args) -> list[dict[str, Any]]:
    try:
        data = yaml.safe_load(repo_file(args).read_text()) or {}
    except FileNotFoundError:
        return []
    return list(data.get("repositories") or [])


def save_repos(args: Args, repos: list[dict[str, Any]]) -> None:
    path = repo_file(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"apiVersion": "", "generated": "0001-01-01T00:00:00Z", "repositories": repos}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=True))
    os.replace(tmp, path)


def cmd_repo_add(args: Args) -> int:
    if len(args.positional) != 2:
        raise HelmError('"helm repo add" requires 2 arguments\n\nUsage:  helm repo add [NAME] [URL] [flags]')
    name, url = args.positional
    repos = load_repos(args)
    existing = next((r for r in repos if r["name"] == name), None)
    if existing is not None and not args.on("force-update"):
        if existing["url"].rstrip("/") == url.rstrip("/"):
            print(f'"{name}" already exists with the same configuration, skipping')
            return 0
        raise HelmError(f"repository name ({name}) already exists, please specify a different name")
    if charts.repo_for(url) is None:
        raise HelmError(
            f'looks like "{url}" is not a valid chart repository or cannot be reached: failed to fetch '
            f"{url.rstrip('/')}/index.yaml : 404 Not Found"
        )
    entry = {
        "caFile": "",
        "certFile": "",
        "insecure_skip_tls_verify": False,
        "keyFile": "",
        "name": name,
        "pass_credentials_all": False,
        "password": "",
        "url": url,
        "username": "",
    }
    repos = [r for r in repos if r["name"] != name] + [entry]
    save_repos(args, repos)
    print(f'"{name}" has been added to your repositories')
    return 0


def cmd_repo_update(args: Args) -> int:
    repos = load_repos(args)
    if not repos:
        raise HelmError("no repositories found. You must add one before updating")
    names = args.positional or [r["name"] for r in repos]
    missing = [n for n in names if n not in {r["name"] for r in repos}]
    if missing:
        raise HelmError(f"no repositories found matching '{', '.join(missing)}'.  Nothing will be updated")
    print("Hang tight while we grab the latest from your chart repositories...")
    for r in repos:
        if r["name"] in names:
            print(f'...Successfully got an update from the "{r["name"]}" chart repository')
    print("Update Complete. ⎈Happy Helming!⎈")
    return 0


def cmd_repo_list(args: Args) -> int:
    repos = load_repos(args)
    if not repos:
        raise HelmError("no repositories to show")
    fmt = args.one("output", "table")
    if fmt == "json":
        print(json.dumps([{"name": r["name"], "url": r["url"]} for r in repos], separators=(",", ":")))
    elif fmt == "yaml":
        print(yaml.safe_dump([{"name": r["name"], "url": r["url"]} for r in repos]), end="")
    else:
        print(_table([["NAME", "URL"]] + [[r["name"], r["url"]] for r in repos]), end="")
    return 0


def cmd_repo_remove(args: Args) -> int:
    repos = load_repos(args)
    for name in args.positional:
        if name not in {r["name"] for r in repos}:
            raise HelmError(f'no repo named "{name}" found')
        repos = [r for r in repos if r["name"] != name]
        print(f'"{name}" has been removed from your repositories')
    save_repos(args, repos)
    return 0


def resolve_chart(args: Args, ref: str, verb: str) -> tuple[str, str, str]:
    """(chart name, version, repo url) for ``repo/chart`` + ``--version``, or helm's error."""
    if "/" not in ref or ref.startswith((".", "/")):
        raise HelmError(
            f"{verb}: repo {ref.split('/', maxsplit=1)[0]} not found"
            if "/" in ref
            else f"{verb}: non-absolute URLs should be in form of repo_name/path_to_chart, got: {ref}"
        )
    repo_name, chart = ref.split("/", 1)
    repo = next((r for r in load_repos(args) if r["name"] == repo_name), None)
    if repo is None:
        raise HelmError(f"{verb}: repo {repo_name} not found")
    info = charts.repo_for(repo["url"])
    if info is None or chart not in info.charts or not info.charts[chart]:
        raise HelmError(
            f"{verb}: chart \"{chart}\" not found in {repo_name} index. (try 'helm repo update'): no chart name found"
        )
    wanted = args.one("version")
    version = charts.pick_version(info.charts[chart], wanted)
    if version is None:
        raise HelmError(
            f"{verb}: chart \"{chart}\" matching {wanted} not found in {repo_name} index. (try 'helm repo update'): "
            f"no chart version found for {chart}-{wanted}"
        )
    return chart, version, repo["url"]


# --- values -------------------------------------------------------------------------------------------


def user_values(args: Args) -> dict[str, Any]:
    vals: dict[str, Any] = {}
    for f in args.many("values"):
        try:
            doc = yaml.safe_load(Path(f).read_text()) or {}
        except FileNotFoundError:
            raise HelmError(f"open {f}: no such file or directory") from None
        vals = charts.deep_merge(vals, doc) if isinstance(doc, dict) else vals
    for expr in args.many("set-json"):
        key, _, raw = expr.partition("=")
        set_path(vals, key, json.loads(raw))
    for expr in args.many("set"):
        try:
            parse_set(expr, vals)
        except ValueError as exc:
            raise HelmError(str(exc)) from None
    for expr in args.many("set-string"):
        parse_set(expr, vals, as_string=True)
    for expr in args.many("set-file"):
        key, _, path = expr.partition("=")
        try:
            content = Path(path).read_text()
        except FileNotFoundError:
            raise HelmError(
                f"failed parsing --set-file data: open {path}: no such file or directory"
            ) from None
        set_path(vals, key, content)
    return vals


# --- releases -----------------------------------------------------------------------------------------


def _go_time(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f") + "000 +0000 UTC"


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def encode_release(rel: dict[str, Any]) -> str:
    """Helm's storage encoding: base64(gzip(json)); the Secret's ``data`` base64-encodes it once more."""
    raw = base64.b64encode(gzip.compress(json.dumps(rel).encode())).decode()
    return base64.b64encode(raw.encode()).decode()


def decode_release(secret: dict[str, Any]) -> dict[str, Any]:
    raw = base64.b64decode(secret["data"]["release"]).decode()
    out: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(raw)))
    return out


def releases(kube: Kube, ns: str, name: str | None = None) -> list[dict[str, Any]]:
    sel = "owner=helm" + (f",name={name}" if name else "")
    secrets = kube.list(SECRETS, ns, sel) if ns else kube.list(SECRETS, "", sel)
    out = [decode_release(s) for s in secrets if s.get("type") == "helm.sh/release.v1"]
    return sorted(out, key=lambda r: (r["namespace"], r["name"], r["version"]))


def latest(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    rels = releases(kube, ns, name)
    return rels[-1] if rels else None


def store_release(kube: Kube, rel: dict[str, Any], *, create: bool) -> None:
    name = f"sh.helm.release.v1.{rel['name']}.v{rel['version']}"
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": rel["namespace"],
            "labels": {
                "name": rel["name"],
                "owner": "helm",
                "status": rel["info"]["status"],
                "version": str(rel["version"]),
                "modifiedAt": str(int(time.time())),
            },
        },
        "type": "helm.sh/release.v1",
        "data": {"release": encode_release(rel)},
    }
    if create:
        kube.create(SECRETS, rel["namespace"], body)
    else:
        kube.replace(SECRETS, rel["namespace"], name, body)


def _manifest(objs: list[dict[str, Any]]) -> str:
    return "".join("---\n# Source: simulated\n" + yaml.safe_dump(o, sort_keys=False) for o in objs)


def _objs(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if isinstance(d, dict)]


def _ns_of(obj: dict[str, Any], default: str) -> str:
    res = Kube.resource(obj)
    return str(obj.get("metadata", {}).get("namespace") or default) if res.namespaced else ""


def _ownership(obj: dict[str, Any], release: str, ns: str) -> str | None:
    meta = obj.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    errs = []
    if labels.get("app.kubernetes.io/managed-by") != "Helm":
        errs.append(
            'label validation error: missing key "app.kubernetes.io/managed-by": must be set to "Helm"'
        )
    if ann.get("meta.helm.sh/release-name") != release:
        have = ann.get("meta.helm.sh/release-name")
        errs.append(
            f'annotation validation error: key "meta.helm.sh/release-name" must equal "{release}": current value is "{have}"'
            if have
            else f'annotation validation error: missing key "meta.helm.sh/release-name": must be set to "{release}"'
        )
    if ann.get("meta.helm.sh/release-namespace") != ns:
        have = ann.get("meta.helm.sh/release-namespace")
        errs.append(
            f'annotation validation error: key "meta.helm.sh/release-namespace" must equal "{ns}": current value is "{have}"'
            if have
            else f'annotation validation error: missing key "meta.helm.sh/release-namespace": must be set to "{ns}"'
        )
    return "; ".join(errs) or None


def _annotate(obj: dict[str, Any], release: str, ns: str) -> None:
    meta = obj.setdefault("metadata", {})
    meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
    meta.setdefault("annotations", {}).update(
        {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": ns}
    )


def parse_duration(text: str) -> float:
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)", text):
        if m.start() != pos:
            break
        total += (
            float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]
        )
        pos = m.end()
    if pos != len(text) or not text:
        raise HelmError(f'invalid argument "{text}" for "--timeout" flag: time: invalid duration "{text}"')
    return total


def _ready(kube: Kube, obj: dict[str, Any], ns: str, wait_jobs: bool) -> bool:
    res = Kube.resource(obj)
    cur = kube.get(res, ns, obj["metadata"]["name"])
    if cur is None:
        return False
    st = cur.get("status") or {}
    kind = obj["kind"]
    if kind == "DaemonSet":
        desired = int(st.get("desiredNumberScheduled") or 0)
        return (
            int(st.get("observedGeneration") or 0) >= int(cur["metadata"].get("generation") or 1)
            and int(st.get("updatedNumberScheduled") or 0) >= desired
            and int(st.get("numberReady") or 0) >= desired
        )
    if kind == "Deployment":
        want = int((cur.get("spec") or {}).get("replicas", 1))
        return int(st.get("readyReplicas") or 0) >= want and int(st.get("observedGeneration") or 0) >= int(
            cur["metadata"].get("generation") or 1
        )
    if kind == "Job" and wait_jobs:
        return int(st.get("succeeded") or 0) >= int((cur.get("spec") or {}).get("completions") or 1)
    if kind == "Pod":
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return True


def wait_ready(kube: Kube, objs: list[dict[str, Any]], ns: str, timeout: float, wait_jobs: bool) -> bool:
    deadline = time.monotonic() + timeout
    pending = list(objs)
    while True:
        pending = [o for o in pending if not _ready(kube, o, _ns_of(o, ns), wait_jobs)]
        if not pending:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _print_release(rel: dict[str, Any], fmt: str | None, show_desc: bool = False) -> None:
    if fmt == "json":
        print(
            json.dumps(
                {k: v for k, v in rel.items() if k != "chart"}
                | {"chart": {"metadata": rel["chart"]["metadata"]}}
            )
        )
        return
    if fmt == "yaml":
        print(yaml.safe_dump({k: v for k, v in rel.items() if k != "chart"}, sort_keys=False), end="")
        return
    last = datetime.fromisoformat(rel["info"]["last_deployed"].rstrip("Z")).replace(tzinfo=UTC)
    print(f"NAME: {rel['name']}")
    print(f"LAST DEPLOYED: {last.strftime('%a %b %e %H:%M:%S %Y')}")
    print(f"NAMESPACE: {rel['namespace']}")
    print(f"STATUS: {rel['info']['status']}")
    print(f"REVISION: {rel['version']}")
    if show_desc:
        print(f"DESCRIPTION: {rel['info']['description']}")
    print("TEST SUITE: None")
    if rel["info"].get("notes"):
        print("NOTES:")
        print(rel["info"]["notes"])


def install_or_upgrade(args: Args, kube: Kube, *, upgrade: bool) -> int:
    verb = "UPGRADE FAILED" if upgrade else "INSTALLATION FAILED"
    ns = args.one("namespace") or kube.namespace
    pos = list(args.positional)
    if not upgrade and args.on("generate-name"):
        if len(pos) != 1:
            raise HelmError('"helm install" requires at most 2 arguments')
        pos.insert(0, "")
    if len(pos) < 2:
        if not upgrade and len(pos) == 1:
            raise HelmError(f"{verb}: must either provide a name or specify --generate-name")
        what = "upgrade [RELEASE] [CHART]" if upgrade else "install [NAME] [CHART]"
        raise HelmError(
            f'"helm {what.split(maxsplit=1)[0]}" requires 2 arguments\n\nUsage:  helm {what} [flags]'
        )
    name, ref = pos[0], pos[1]
    chart, version, _ = resolve_chart(args, ref, verb)
    if not name:
        name = f"{chart}-{int(time.time())}"
    if (
        not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)
        or len(name) > 53
    ):
        raise HelmError(
            f'{verb}: release name "{name}": invalid release name, must match regex '
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53"
        )
    timeout = parse_duration(args.one("timeout") or "5m0s")
    prev = latest(kube, ns, name)
    if upgrade and (prev is None or prev["info"]["status"] == "uninstalled"):
        if not args.on("install"):
            raise HelmError(f'{verb}: "{name}" has no deployed releases')
        print(f'Release "{name}" does not exist. Installing it now.')
        upgrade = False
        verb = "INSTALLATION FAILED"
    elif not upgrade and prev is not None and prev["info"]["status"] != "uninstalled":
        raise HelmError(f"{verb}: cannot re-use a name that is still in use")
    uvals = user_values(args)
    if upgrade and prev is not None and args.on("reuse-values"):
        uvals = charts.deep_merge(prev.get("config") or {}, uvals)
    try:
        _, objs = charts.render(chart, version, uvals, name, ns)
    except charts.ChartError as exc:
        raise HelmError(f"{verb}: {exc}") from None
    if args.on("dry-run"):
        print(
            f"NAME: {name}\nNAMESPACE: {ns}\nSTATUS: pending-{'upgrade' if upgrade else 'install'}\nREVISION: {(prev or {}).get('version', 0) + 1}\n"
            "TEST SUITE: None\nHOOKS:\nMANIFEST:"
        )
        print(_manifest(objs), end="")
        return 0
    if args.on("create-namespace") and kube.get(NAMESPACES, "", ns) is None:
        kube.create(
            NAMESPACES,
            "",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"name": ns}}},
        )
    now = datetime.now(UTC)
    revision = (prev["version"] + 1) if prev else 1
    rel: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "version": revision,
        "info": {
            "first_deployed": (prev or {}).get("info", {}).get("first_deployed", _iso(now)),
            "last_deployed": _iso(now),
            "deleted": "",
            "description": "Upgrade complete" if upgrade else "Install complete",
            "status": "pending-upgrade" if upgrade else "pending-install",
        },
        "chart": {
            "metadata": {
                "name": chart,
                "version": version,
                "appVersion": version,
                "apiVersion": "v2",
                "description": charts.DESCRIPTIONS.get(chart, ""),
                "type": "application",
            }
        },
        "config": uvals,
        "manifest": _manifest(objs),
    }
    try:
        store_release(kube, rel, create=True)
    except KubeError as exc:
        raise HelmError(f"{verb}: create: failed to create: {exc.message}") from None
    error: str | None = None
    try:
        for obj in objs:
            _annotate(obj, name, ns)
            res = Kube.resource(obj)
            ons = _ns_of(obj, ns)
            cur = kube.get(res, ons, obj["metadata"]["name"])
            if cur is not None:
                owner_err = _ownership(cur, name, ns)
                if owner_err:
                    kind_ns = f' in namespace "{ons}"' if ons else ' in namespace ""'
                    error = (
                        f'Unable to continue with {"update" if upgrade else "install"}: {obj["kind"]} "{obj["metadata"]["name"]}"{kind_ns} '
                        f"exists and cannot be imported into the current release: invalid ownership metadata; {owner_err}"
                    )
                    break
                obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                kube.replace(res, ons, obj["metadata"]["name"], obj)
            else:
                kube.create(res, ons, obj)
        if error is None and upgrade and prev is not None:
            keep = {(o["kind"], o["metadata"]["name"]) for o in objs}
            for old in _objs(prev.get("manifest") or ""):
                if (old["kind"], old["metadata"]["name"]) not in keep:
                    kube.delete(Kube.resource(old), _ns_of(old, ns), old["metadata"]["name"])
    except KubeError as exc:
        error = exc.message
    waits = args.on("wait") or args.on("atomic") or args.on("rollback-on-failure")
    if error is None and waits and not wait_ready(kube, objs, ns, timeout, args.on("wait-for-jobs")):
        error = "context deadline exceeded"
    if error is not None:
        rel["info"]["status"] = "failed"
        rel["info"]["description"] = f'Release "{name}" failed: {error}'
        store_release(kube, rel, create=False)
        if args.on("atomic") or args.on("rollback-on-failure"):
            if upgrade and prev is not None:
                _rollback(kube, prev, rel, ns)
                raise HelmError(
                    f"{verb}: release {name} failed, and has been rolled back due to atomic being set: {error}"
                )
            for obj in reversed(objs):
                kube.delete(Kube.resource(obj), _ns_of(obj, ns), obj["metadata"]["name"])
            kube.delete(SECRETS, ns, f"sh.helm.release.v1.{name}.v{rel['version']}")
            raise HelmError(
                f"{verb}: release {name} failed, and has been uninstalled due to atomic being set: {error}"
            )
        raise HelmError(f"{verb}: {error}")
    rel["info"]["status"] = "deployed"
    store_release(kube, rel, create=False)
    if prev is not None and upgrade:
        prev["info"]["status"] = "superseded"
        store_release(kube, prev, create=False)
    if upgrade:
        print(f'Release "{name}" has been upgraded. Happy Helming!')
    _print_release(rel, args.one("output"))
    return 0


def _rollback(kube: Kube, prev: dict[str, Any], failed: dict[str, Any], ns: str) -> None:
    """``--atomic`` on upgrade: re-apply the previous revision as a new one, as ``helm rollback`` does."""
    keep = {(o["kind"], o["metadata"]["name"]) for o in _objs(prev.get("manifest") or "")}
    for obj in _objs(failed.get("manifest") or ""):
        if (obj["kind"], obj["metadata"]["name"]) not in keep:
            kube.delete(Kube.resource(obj), _ns_of(obj, ns), obj["metadata"]["name"])
    for obj in _objs(prev.get("manifest") or ""):
        res, ons = Kube.resource(obj), _ns_of(obj, ns)
        cur = kube.get(res, ons, obj["metadata"]["name"])
        if cur is None:
            kube.create(res, ons, obj)
        else:
            obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            kube.replace(res, ons, obj["metadata"]["name"], obj)
    now = _iso(datetime.now(UTC))
    rolled = {
        **prev,
        "version": failed["version"] + 1,
        "info": {
            **prev["info"],
            "last_deployed": now,
            "status": "deployed",
            "description": f"Rollback to {prev['version']}",
        },
    }
    store_release(kube, rolled, create=True)
    prev["info"]["status"] = "superseded"
    store_release(kube, prev, create=False)


def cmd_uninstall(args: Args, kube: Kube) -> int:
    ns = args.one("namespace") or kube.namespace
    if not args.positional:
        raise HelmError(
            '"helm uninstall" requires at least 1 argument\n\nUsage:  helm uninstall RELEASE_NAME [...] [flags]'
        )
    for name in args.positional:
        rels = releases(kube, ns, name)
        if not rels or rels[-1]["info"]["status"] == "uninstalled":
            if args.on("ignore-not-found"):
                continue
            raise HelmError(f"uninstall: Release not loaded: {name}: release: not found")
        for obj in reversed(_objs(rels[-1].get("manifest") or "")):
            kube.delete(Kube.resource(obj), _ns_of(obj, ns), obj["metadata"]["name"])
        if args.on("wait"):
            deadline = time.monotonic() + parse_duration(args.one("timeout") or "5m0s")
            for obj in _objs(rels[-1].get("manifest") or ""):
                while (
                    kube.get(Kube.resource(obj), _ns_of(obj, ns), obj["metadata"]["name"]) is not None
                    and time.monotonic() < deadline
                ):
                    time.sleep(POLL_S)
        for r in rels:
            kube.delete(SECRETS, ns, f"sh.helm.release.v1.{name}.v{r['version']}")
        print(f'release "{name}" uninstalled')
    return 0


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("\t".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n" for r in rows)


def cmd_list(args: Args, kube: Kube) -> int:
    ns = "" if args.on("all-namespaces") else (args.one("namespace") or kube.namespace)
    rels = releases(kube, ns)
    latest_by: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rels:
        latest_by[(r["namespace"], r["name"])] = r
    wanted = {
        s
        for s in ("deployed", "failed", "pending", "superseded", "uninstalled", "uninstalling")
        if args.on(s)
    }
    if args.on("all"):
        wanted = set()
    if not wanted and not args.on("all"):
        wanted = {"deployed", "failed"}
    items = [
        r
        for r in latest_by.values()
        if not wanted
        or r["info"]["status"] in wanted
        or ("pending" in wanted and r["info"]["status"].startswith("pending"))
    ]
    flt = args.one("filter")
    if flt:
        items = [r for r in items if re.search(flt, r["name"])]
    rows = [
        {
            "name": r["name"],
            "namespace": r["namespace"],
            "revision": str(r["version"]),
            "updated": _go_time(
                datetime.fromisoformat(r["info"]["last_deployed"].rstrip("Z")).replace(tzinfo=UTC)
            ),
            "status": r["info"]["status"],
            "chart": f"{r['chart']['metadata']['name']}-{r['chart']['metadata']['version']}",
            "app_version": r["chart"]["metadata"].get("appVersion", ""),
        }
        for r in sorted(items, key=lambda r: r["name"])
    ]
    fmt = args.one("output", "table")
    if fmt == "json":
        print(json.dumps(rows, separators=(",", ":")))
    elif fmt == "yaml":
        print(yaml.safe_dump(rows, sort_keys=False), end="")
    elif args.on("short"):
        for r in rows:
            print(r["name"])
    else:
        head = [["NAME", "NAMESPACE", "REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION"]]
        body = [
            [
                r["name"],
                r["namespace"],
                r["revision"],
                r["updated"],
                r["status"],
                r["chart"],
                r["app_version"],
            ]
            for r in rows
        ]
        print(
            _table(([] if args.on("no-headers") else head) + body)
            if (body or not args.on("no-headers"))
            else "",
            end="",
        )
    return 0


def cmd_status(args: Args, kube: Kube) -> int:
    ns = args.one("namespace") or kube.namespace
    if not args.positional:
        raise HelmError('"helm status" requires 1 argument\n\nUsage:  helm status RELEASE_NAME [flags]')
    name = args.positional[0]
    rels = releases(kube, ns, name)
    rev = args.one("revision")
    rel = next((r for r in rels if str(r["version"]) == rev), None) if rev else (rels[-1] if rels else None)
    if rel is None:
        raise HelmError("release: not found")
    _print_release(rel, args.one("output"), args.on("show-desc"))
    return 0


def cmd_get_values(args: Args, kube: Kube) -> int:
    ns = args.one("namespace") or kube.namespace
    if not args.positional:
        raise HelmError(
            '"helm get values" requires 1 argument\n\nUsage:  helm get values RELEASE_NAME [flags]'
        )
    rel = latest(kube, ns, args.positional[0])
    if rel is None:
        raise HelmError("release: not found")
    vals = rel.get("config") or {}
    if args.on("all"):
        chart = rel["chart"]["metadata"]
        vals, _ = charts.render(chart["name"], chart["version"], vals, rel["name"], rel["namespace"])
    if args.one("output") == "json":
        print(json.dumps(vals, separators=(",", ":")))
    else:
        print("USER-SUPPLIED VALUES:" if not args.on("all") else "COMPUTED VALUES:")
        print(yaml.safe_dump(vals, sort_keys=True) if vals else "null", end="" if vals else "\n")
    return 0


def cmd_get_manifest(args: Args, kube: Kube) -> int:
    ns = args.one("namespace") or kube.namespace
    rel = latest(kube, ns, args.positional[0]) if args.positional else None
    if rel is None:
        raise HelmError("release: not found")
    print(rel.get("manifest") or "", end="")
    return 0


def cmd_history(args: Args, kube: Kube) -> int:
    ns = args.one("namespace") or kube.namespace
    rels = releases(kube, ns, args.positional[0]) if args.positional else []
    if not rels:
        raise HelmError("release: not found")
    rows = [
        {
            "revision": r["version"],
            "updated": r["info"]["last_deployed"],
            "status": r["info"]["status"],
            "chart": f"{r['chart']['metadata']['name']}-{r['chart']['metadata']['version']}",
            "app_version": r["chart"]["metadata"].get("appVersion", ""),
            "description": r["info"]["description"],
        }
        for r in rels
    ]
    if args.one("output") == "json":
        print(json.dumps(rows, separators=(",", ":")))
    else:
        print(
            _table(
                [["REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION", "DESCRIPTION"]]
                + [
                    [
                        str(r["revision"]),
                        r["updated"],
                        r["status"],
                        r["chart"],
                        r["app_version"],
                        r["description"],
                    ]
                    for r in rows
                ]
            ),
            end="",
        )
    return 0


def cmd_search_repo(args: Args) -> int:
    term = args.positional[0] if args.positional else ""
    rows = []
    for r in load_repos(args):
        info = charts.repo_for(r["url"])
        for chart, versions in info.charts.items() if info else []:
            full = f"{r['name']}/{chart}"
            if term and term not in full:
                continue
            vs = sorted(versions, key=lambda v: charts._v(v) or Version("0"), reverse=True)
            if args.one("version"):
                picked = charts.pick_version(versions, args.one("version"))
                vs = [picked] if picked else []
            for v in vs if args.on("versions") else vs[:1]:
                rows.append(
                    {
                        "name": full,
                        "version": v,
                        "app_version": v,
                        "description": charts.DESCRIPTIONS.get(chart, ""),
                    }
                )
    if args.one("output") == "json":
        print(json.dumps(rows, separators=(",", ":")))
    elif not rows:
        print("No results found")
    else:
        print(
            _table(
                [["NAME", "CHART VERSION", "APP VERSION", "DESCRIPTION"]]
                + [[x["name"], x["version"], x["app_version"], x["description"]] for x in rows]
            ),
            end="",
        )
    return 0


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        if args.command == "version":
            if args.on("short"):
                print(f"{HELM_VERSION}+g7e0bb5a")
            else:
                print(
                    f'version.BuildInfo{{Version:"{HELM_VERSION}", GitCommit:"7e0bb5a3e3b4c9c81f4a4f5b1c2e1a0d9f8e7c6b", '
                    'GitTreeState:"clean", GoVersion:"go1.24.3"}'
                )
            return 0
        local = {
            "repo add": cmd_repo_add,
            "repo update": cmd_repo_update,
            "repo list": cmd_repo_list,
            "repo remove": cmd_repo_remove,
            "search repo": cmd_search_repo,
        }
        if args.command in local:
            return local[args.command](args)
        kube = Kube(args.one("kubeconfig"), args.one("kube-context"))
        if args.command == "install":
            return install_or_upgrade(args, kube, upgrade=False)
        if args.command == "upgrade":
            return install_or_upgrade(args, kube, upgrade=True)
        handlers = {
            "uninstall": cmd_uninstall,
            "list": cmd_list,
            "status": cmd_status,
            "get values": cmd_get_values,
            "get manifest": cmd_get_manifest,
            "history": cmd_history,
        }
        return handlers[args.command](args, kube)
    except HelmError as exc:
        if str(exc) == "__usage__":
            print("The Kubernetes package manager (simulated)\n\nUsage:\n  helm [command]", file=sys.stderr)
            return 1
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KubeError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
