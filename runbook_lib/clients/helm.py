"""The library's helm client: argv for the real ``helm`` (or the simulator's), run through the journal.

Why idempotency lives here: ``helm upgrade --install`` always creates a new revision, even with nothing
to change, so "a second run upgrades nothing" needs the installed chart version and values compared first
(``helm list -o json`` + ``helm get values -o json``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.errors import PermanentError

from .proc import CommandResult, KubeconfigTool, Runner

#: What every ``helm list`` asks for, the same on helm 3 and 4. ``--max 0``: no cut, where the default 256 keeps
#: the first 256 releases by name, so on a busy cluster ``nvidia-device-plugin`` was missing and taken as not
#: installed (helm@v4.1.4 pkg/cmd/list.go:133, pkg/action/list.go:216-222; v3.14.0 the same). The statuses: helm 3
#: lists only deployed and failed releases by default, hiding one left ``pending-upgrade`` by an interrupted
#: ``helm upgrade``, and helm 4 lists every status, ``uninstalled`` (``helm uninstall --keep-history``) too
#: (v3.14.0 pkg/action/list.go:300-330, v4.1.4 :328-331); a release uninstalled with its history kept is gone.
#: ``uninstalling``: a ``helm uninstall`` stopped midway leaves its record so (v4.1.4 pkg/action/uninstall.go:125-150,
#: 176-186), and ``helm upgrade --install`` then fails ("has no deployed releases", upgrade.go:250-263): the release
#: is there for the kubernetes step to refuse and for rollback to finish removing.
LIST_FILTER = ("--max", "0", "--deployed", "--failed", "--pending", "--uninstalling")


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    chart: str
    """``<chart>-<version>`` as helm lists it, e.g. ``nvidia-device-plugin-0.18.0``."""
    status: str
    revision: int

    def chart_version(self, chart_name: str) -> str:
        return self.chart.removeprefix(f"{chart_name}-")

    def of_chart(self, chart_name: str) -> bool:
        """``helm list`` shows a release's chart as ``<chart>-<version>``; a version starts with a digit or ``v``."""
        rest = self.chart_version(chart_name)
        return rest != self.chart and rest.lstrip("v")[:1].isdigit()


def uninstall_args(name: str, namespace: str, timeout_s: int) -> list[str]:
    """``helm uninstall`` as the runbook runs it, and as a plan prints it (so a pasted line waits the same)."""
    return ["uninstall", name, "-n", namespace, "--wait", "--timeout", f"{timeout_s}s"]


def _json_list(result: CommandResult, command: str) -> list[dict[str, Any]]:
    """The JSON list a helm ``-o json`` command printed; anything else is an error naming the command."""
    try:
        data = json.loads(result.stdout or "[]")
    except ValueError:
        raise PermanentError(
            f"{command} printed something that is not JSON: {result.stdout[:200]!r}"
        ) from None
    return data if isinstance(data, list) else []


#: How many times its ``--timeout`` one ``helm upgrade --install`` may take: helm gives the pre-hooks, the wait for
#: the resources (none without ``--wait``, kept for a site's helm that waits anyway) and the post-hooks the whole
#: ``--timeout`` each (helm@v4.1.4 pkg/action/upgrade.go:457, 490-496,
#: 505; install.go:505, 542-551), and the GPU Operator chart has a pre-upgrade hook Job. A helm killed before it
#: ends leaves the release pending-upgrade (or pending-install), which every later helm refuses to touch.
UPGRADE_PHASES = 3


class Helm(KubeconfigTool):
    def __init__(
        self, binary: str = "helm", *, kubeconfig: str | None = None, runner: Runner | None = None
    ) -> None:
        super().__init__(binary, kubeconfig=kubeconfig, runner=runner)

    def run(self, args: list[str], **kwargs: Any) -> CommandResult:
        return self.runner.run(self.argv(args), **kwargs)

    def version(self) -> str:
        result = self.runner.run([self.binary, "version", "--short"])
        result.check("helm version")
        return result.stdout.strip()

    def repo_add(self, name: str, url: str, *, replace: bool = False) -> CommandResult:
        """Add repository ``name``; ``replace``: overwrite this machine's entry of that name.

        Why ``replace`` is the caller's choice: ``--force-update`` replaces the whole entry, username, password,
        CA and TLS files included (helm@v4.1.4 pkg/cmd/repo_add.go:93, 191-216), so used on every run it erased
        the credentials a site's NGC or mirror entry holds (see :meth:`repository_entry`)."""
        args = ["repo", "add", name, url, *(["--force-update"] if replace else [])]
        return self.run(args).check(f"helm repo add {name}")

    def repository_entry(self, name: str) -> dict[str, Any] | None:
        """This machine's helm entry for repository ``name`` as helm's repositories file holds it, or None.

        Read from the file (``helm env HELM_REPOSITORY_CONFIG`` names it) because ``helm repo list`` shows names
        and URLs only, and what an overwrite would lose is the rest: the fields of helm's ``repo.Entry``
        (helm@v4.1.4 pkg/repo/v1/chartrepo.go:38-48). Never journalled: the entry can hold a password."""
        path = self.run(["env", "HELM_REPOSITORY_CONFIG"]).check("helm env").stdout.strip()
        try:
            data = yaml.safe_load(Path(path).read_text()) if path else None
        except FileNotFoundError:
            return None  # helm writes the file with its first repository
        except (OSError, yaml.YAMLError) as exc:
            raise PermanentError(f"helm's repositories file {path} cannot be read: {exc}") from None
        entries = (data.get("repositories") if isinstance(data, dict) else None) or []
        return next((dict(e) for e in entries if isinstance(e, dict) and e.get("name") == name), None)

    def repo_update(self, name: str | None = None) -> CommandResult:
        return self.run(["repo", "update", *([name] if name else [])]).check("helm repo update")

    def resolve_version(self, chart: str, constraint: str) -> str | None:
        """The version ``helm upgrade --version <constraint>`` would install from the added repository, or None.

        Why ``helm search repo``: it checks the same Masterminds semver constraint over the same cached index
        as the upgrade's chart lookup, newest first (helm@v4.1.4 pkg/cmd/search_repo.go ``applyConstraint``,
        pkg/repo/v1/index.go ``IndexFile.Get``), so the runbook learns the version before anything changes."""
        matching = self._search(chart, ["--version", constraint])
        return matching[0] if matching else None

    def chart_versions(self, chart: str) -> list[str]:
        """Every version of ``chart`` the added repository has, newest first."""
        return self._search(chart, ["--versions"])

    def _search(self, chart: str, flags: list[str]) -> list[str]:
        result = self.run(["search", "repo", chart, *flags, "-o", "json"]).check("helm search repo")
        data = _json_list(result, "helm search repo")
        # search matches names by substring (nvdp/nvidia-device-plugin-foo too): keep the chart itself
        return [str(r["version"]) for r in data if r.get("name") == chart]

    def releases(self, namespace: str) -> list[Release]:
        return self._parse_list(
            self.run(["list", "-n", namespace, *LIST_FILTER, "-o", "json"]).check("helm list"), namespace
        )

    @staticmethod
    def _parse_list(result: CommandResult, namespace: str) -> list[Release]:
        data = _json_list(result, "helm list")
        return [
            Release(
                name=r["name"],
                namespace=r.get("namespace", namespace),
                chart=r.get("chart", ""),
                status=r.get("status", ""),
                revision=int(r.get("revision", 0)),
            )
            for r in data
        ]

    def releases_everywhere(self) -> list[Release]:
        """Releases of every namespace (``helm list -A``): a device plugin may live outside the planned one."""
        return self._parse_list(
            self.run(["list", "-A", *LIST_FILTER, "-o", "json"]).check("helm list -A"), ""
        )

    def uninstall(self, name: str, namespace: str, *, timeout_s: int = 300) -> CommandResult:
        """Remove a release and wait until its objects are gone (``--wait``, helm >= 3.7)."""
        return self.run(
            uninstall_args(name, namespace, timeout_s), timeout=timeout_s + 60, changes_cluster=True
        )

    def release(self, name: str, namespace: str) -> Release | None:
        return next((r for r in self.releases(namespace) if r.name == name), None)

    def manifest(self, name: str, namespace: str) -> list[tuple[str, str, str]]:
        """(apiVersion, kind, namespace or "") of each object the release made (``helm get manifest``): what
        ``helm uninstall`` deletes (helm@v4.1.4 pkg/action/uninstall.go:256-289). Journalled without its output:
        a chart's Secrets are in it."""
        result = self.run(["get", "manifest", name, "-n", namespace], journal_output=False).check(
            "helm get manifest"
        )
        objects = []
        for doc in yaml.safe_load_all(result.stdout):
            if isinstance(doc, dict) and doc.get("kind"):
                meta = doc.get("metadata") or {}
                objects.append(
                    (str(doc.get("apiVersion") or ""), str(doc["kind"]), str(meta.get("namespace") or ""))
                )
        return objects

    def values(self, name: str, namespace: str) -> dict[str, Any]:
        """The values the release was given (its user-supplied ones, as ``helm get values`` prints them).

        Journalled as a command without its output: they are the site's values and may hold what no key name
        marks as secret (a registry's credentials under a chart's own key, a MIG config), and records are
        shared widely."""
        result = self.run(["get", "values", name, "-n", namespace, "-o", "json"], journal_output=False).check(
            "helm get values"
        )
        try:
            data = json.loads(result.stdout or "{}")
        except ValueError:
            raise PermanentError("helm get values printed something that is not JSON") from None
        return data if isinstance(data, dict) else {}

    def upgrade_install(
        self,
        release: str,
        chart: str,
        *,
        version: str,
        namespace: str,
        values: Mapping[str, str],
        create_namespace: bool = False,
        timeout_s: int = 300,
        dry_run: bool = False,
        reuse_values: bool = False,
    ) -> CommandResult:
        """``helm upgrade --install`` with ``values`` as ``--set``.

        ``reuse_values`` keeps the values the release was given before (a site's time-slicing config, pull
        secrets, tolerations): with any ``--set`` and neither reuse flag, helm starts from the new chart's defaults
        alone and drops them (helm@v4.1.4 pkg/action/upgrade.go:604-642, ``reuseValues``, the same since v3.14).
        ``--reset-then-reuse-values`` (helm ≥3.14) takes the new chart's defaults, the release's earlier values
        over them, then ``--set``: unlike ``--reuse-values`` it lets defaults the new chart adds take effect.

        No ``--wait``: helm then waits for the chart's hooks only, within ``--timeout`` (helm 3 always waits for
        hooks, helm@v3.21.4 pkg/action/hooks.go:90; helm 4's default ``hookOnly``, v4.1.4 pkg/cmd/flags.go:58-66,
        pkg/kube/client.go:118). With ``--wait`` one node whose plugin pod never starts failed the whole release
        after ``--timeout`` (helm 4's kstatus counts a DaemonSet ready only when every scheduled pod is), so every
        later run upgraded it again; the step judges each GPU node itself (its GPUs, its plugin pod's revision)."""
        args = ["upgrade", "--install", release, chart, "--version", version, "-n", namespace]
        if reuse_values:
            args.append("--reset-then-reuse-values")
        for key, value in values.items():
            args += ["--set", f"{key}={value}"]
        if create_namespace:
            args.append("--create-namespace")
        if dry_run:
            args.append("--dry-run")
        else:
            args += ["--timeout", f"{timeout_s}s"]
        return self.run(
            args,
            timeout=UPGRADE_PHASES * timeout_s + 60,
            changes_cluster=not dry_run,
            journal_output=not dry_run,
        )
