"""Image Factory client: register schematics and resolve extensions, public or self-hosted (facts §2.1).

Why it is careful: everything the upgrade step does rests on two answers from the factory, the schematic
ID (which must equal the offline one, or node checks would compare against the wrong ID) and the exact
extension tags for the target Talos release (which must exist, share one NVIDIA driver, and be built for
that release, or the node comes back without working GPUs, facts §5).  So both are checked *before*
anything changes, and every disagreement is an error that says what to do.

Transport: ``requests`` with a ``urllib3`` ``Retry``: timeouts on every call, exponential back-off on
connection errors, read timeouts and 5xx (``POST /schematics`` is safe to retry: schematics are
content-addressed), never on 4xx; a 4xx raises :class:`PermanentError` carrying the factory's plain text.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from runbook_lib.errors import CompatibilityError, PermanentError, RetryableError, RunbookError
from runbook_lib.model.boot_assets import PUBLIC_FACTORY_URL
from runbook_lib.model.schematic import ExtensionInfo, Schematic, parse_schematic
from runbook_lib.model.versions import TalosVersion, check_extension_tags

RETRY_STATUSES = frozenset({500, 502, 503, 504})


class FactoryRefused(PermanentError):
    """The factory answered 4xx: the request itself is wrong (the message is the factory's own text)."""

    def __init__(self, message: str, *, status: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


def _is_kmod(name: str) -> bool:
    return "nvidia-open-gpu-kernel-modules" in name or "kmod-nvidia" in name


def _is_toolkit(name: str) -> bool:
    return "nvidia-container-toolkit" in name


@dataclass(frozen=True)
class SchematicRegistration:
    """What ``POST /schematics`` answered, checked against the offline computation."""

    id: str
    offline_id: str
    canonical_yaml: str
    server_canonical_yaml: str | None
    """``None`` on factories before image-factory v1.3.0, which answer ``{"id"}`` only."""


@dataclass(frozen=True)
class ResolvedExtensions:
    """Wanted extensions resolved to exact images for one Talos release, in the wanted order."""

    talos_version: str
    extensions: tuple[ExtensionInfo, ...]
    driver: str | None
    """The NVIDIA driver both kernel modules and toolkit carry (``None`` without NVIDIA extensions)."""
    notes: tuple[str, ...] = field(default=())

    @property
    def refs(self) -> list[str]:
        return [e.ref for e in self.extensions]

    def tag(self, name: str) -> str:
        for ext in self.extensions:
            if ext.name == name:
                return ext.tag
        raise KeyError(name)


class FactoryClient:
    """One Image Factory (``https://factory.talos.dev`` by default, or a self-hosted URL)."""

    def __init__(
        self,
        base_url: str = PUBLIC_FACTORY_URL,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 0.5,
        backoff_max: float = 20.0,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise PermanentError(
                f"image factory URL {base_url!r} is not an http(s) URL", hint="e.g. https://factory.talos.dev"
            )
        self.timeout = (connect_timeout, read_timeout)
        self.retries = retries
        retry = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            other=0,
            backoff_factor=backoff,
            backoff_max=backoff_max,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=frozenset({"GET", "HEAD", "POST"}),
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        self.session = session or requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers.setdefault("User-Agent", "talos-gpu-runbooks")

    # -- transport ------------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = f"{self.base_url}{path}"
        try:
            response = self.session.request(method, url, timeout=self.timeout, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise RetryableError(
                f"Image Factory {self.base_url} did not answer {method} {path} after {self.retries + 1} attempts: "
                f"{_short(exc)}",
                hint="check the factory URL and the network (proxy, firewall); a self-hosted factory must be running",
            ) from None
        except requests.RequestException as exc:
            raise RetryableError(f"Image Factory {method} {url} failed: {_short(exc)}") from None
        if response.status_code >= 500:
            raise RetryableError(
                f"Image Factory {self.base_url} answered {response.status_code} to {method} {path} "
                f"after {self.retries + 1} attempts: {response.text.strip()}",
                hint="the factory is having trouble; try again later",
            )
        if response.status_code >= 400:
            raise FactoryRefused(
                f"Image Factory {self.base_url} refused {method} {path} ({response.status_code}): "
                f"{response.text.strip()}",
                status=response.status_code,
            )
        return response

    def _json(self, path: str) -> Any:
        response = self._request("GET", path)
        try:
            return response.json()
        except ValueError:
            raise PermanentError(
                f"Image Factory {self.base_url} answered {path} with something that is not JSON",
                hint="is the URL really an Image Factory (not a web page or proxy login)?",
            ) from None

    # -- API --------------------------------------------------------------------------------------------------
    def post_schematic(self, schematic: Schematic | str | bytes) -> SchematicRegistration:
        """Register a schematic; its ID must equal the offline ID (and the canonical YAML, when sent)."""
        parsed = schematic if isinstance(schematic, Schematic) else parse_schematic(schematic)
        body = parsed.canonical_bytes() if isinstance(schematic, Schematic) else _as_bytes(schematic)
        response = self._request(
            "POST", "/schematics", data=body, headers={"Content-Type": "application/yaml"}
        )
        try:
            data = response.json()
            server_id = str(data["id"])
        except (ValueError, KeyError, TypeError):
            raise PermanentError(
                f"Image Factory {self.base_url} answered POST /schematics without an id: {response.text[:200]!r}"
            ) from None
        server_yaml = data.get("schematic") if isinstance(data, dict) else None
        registration = SchematicRegistration(
            id=server_id,
            offline_id=parsed.id,
            canonical_yaml=parsed.canonical_yaml(),
            server_canonical_yaml=str(server_yaml) if server_yaml is not None else None,
        )
        check_registration(self.base_url, registration)
        return registration

    def get_schematic(self, schematic_id: str) -> str | None:
        """The canonical YAML the factory stores for an ID, or ``None`` when it does not know it."""
        try:
            return self._request("GET", f"/schematics/{schematic_id}").text
        except FactoryRefused as exc:
            if exc.status == 404:
                return None
            raise

    def versions(self) -> list[str]:
        data = self._json("/versions")
        if not isinstance(data, list):
            raise PermanentError(f"Image Factory {self.base_url} /versions is not a list")
        return [str(v) for v in data]

    def official_extensions(self, talos_version: str) -> list[ExtensionInfo]:
        version = str(TalosVersion.parse(talos_version))
        try:
            data = self._json(f"/version/{version}/extensions/official")
        except FactoryRefused as exc:
            if exc.status != 404:
                raise
            raise FactoryRefused(exc.message, status=404, hint=self._version_hint(version)) from None
        if not isinstance(data, list):
            raise PermanentError(f"Image Factory {self.base_url} extension list for {version} is not a list")
        return [ExtensionInfo.from_json(item) for item in data]

    def _version_hint(self, version: str) -> str:
        """Name the releases of the same minor line the factory does know (or say it has none)."""
        try:
            known = self.versions()
        except RunbookError:
            return "check the Talos version (the Image Factory builds Talos 1.5 and later)"
        return known_versions_hint(known, TalosVersion.parse(version))

    def resolve_extensions(self, wanted_names: Iterable[str], talos_version: str) -> ResolvedExtensions:
        """Resolve wanted official extensions to exact images for ``talos_version``, or fail before any change.

        Fails (all problems at once) when a name does not exist for that release (naming close existing ones),
        when the kernel modules and the container toolkit carry different NVIDIA drivers, or when the
        kernel-module tag was built for another Talos release.
        """
        version = str(TalosVersion.parse(talos_version))
        wanted = list(dict.fromkeys(wanted_names))
        available = self.official_extensions(version)
        return resolve_against(available, wanted, version, source=self.base_url)


def known_versions_hint(known: Sequence[str], wanted: TalosVersion) -> str:
    """What the factory builds near ``wanted``: the newest five of its minor line, else its whole range."""
    same_line = [v for v in known if _minor_line(v) == wanted.minor_line]
    if same_line:
        return f"the factory knows {', '.join(same_line[-5:])} in that minor line"
    if not known:
        return "the factory lists no Talos release at all"
    return f"the factory builds nothing for Talos {wanted.major}.{wanted.minor} (it knows {known[0]}…{known[-1]})"


def _minor_line(version: str) -> tuple[int, int] | None:
    try:
        return TalosVersion.parse(version).minor_line
    except PermanentError:  # a name the factory lists that is not a release: not in any line
        return None


def _missing_hint(missing: Sequence[str]) -> str:
    """Which parameter to change for the extensions a release lacks: the kernel modules and the toolkit come from
    ``driver_flavor`` and ``track``, every other name (the fabric manager included) from ``extra_extensions``;
    both when both are missing. Why: a typo in extra_extensions was answered with the version note alone, and
    the user looked at tracks (cloud-user walkthrough, 7 Dec 2026); a fabric manager was sent to the tracks
    (review of bac402f)."""
    where = []
    if any(_is_kmod(name) or _is_toolkit(name) for name in missing):
        where.append("choose a driver_flavor (and from Talos 1.8 a track) the release builds")
    if any(not (_is_kmod(name) or _is_toolkit(name)) for name in missing):
        where.append(
            "correct the name in extra_extensions or the node's overrides.extra_extensions (close names above)"
        )
    return (
        "; ".join(where)
        + "; official names also change with the Talos version: -lts/-production suffixes from Talos 1.8 on"
    )


def resolve_against(
    available: Sequence[ExtensionInfo],
    wanted: Sequence[str],
    talos_version: str,
    *,
    source: str = "the factory",
) -> ResolvedExtensions:
    """The pure part of :meth:`FactoryClient.resolve_extensions` (usable on a cached catalog)."""
    by_name = {e.name: e for e in available}
    missing: list[str] = []
    for name in wanted:
        if name in by_name:
            continue
        # compared without the publisher, which every official name shares: with it, "siderolabs/nvidia-nope"
        # was "close" to siderolabs/gvisor and siderolabs/amd-ucode (walkthrough, stop 52)
        short = name.split("/", 1)[-1]
        shorts = {n.split("/", 1)[-1]: n for n in by_name}
        close = [shorts[c] for c in difflib.get_close_matches(short, list(shorts), n=4, cutoff=0.6)]
        if not close:
            close = [n for n in by_name if short and short.split("-")[0] in n][:4]
        suggestion = f" (did you mean {', '.join(close)}?)" if close else ""
        missing.append(f"{name} does not exist for Talos {talos_version}{suggestion}")
    if missing:
        raise PermanentError(
            f"{source} has no such official extension: " + "; ".join(missing),
            hint=_missing_hint([name for name in wanted if name not in by_name]),
        )
    resolved = tuple(by_name[name] for name in wanted)
    kmods = [e for e in resolved if _is_kmod(e.name)]
    toolkits = [e for e in resolved if _is_toolkit(e.name)]
    problems: list[str] = []
    driver: str | None = None
    if len(kmods) > 1:
        problems.append(f"more than one NVIDIA kernel-module extension: {', '.join(e.name for e in kmods)}")
    if kmods and toolkits:
        check = check_extension_tags(kmods[0].tag, toolkits[0].tag, talos_version)
        problems.extend(check.problems)
        driver = check.driver
    elif kmods:
        problems.append(
            f"{kmods[0].name} without the NVIDIA container toolkit: pods cannot use the GPU "
            "(add the toolkit of the same track)"
        )
    # The fabric manager's tag is the driver alone, and it "has to match with the NVIDIA driver version in
    # use" (talos website/content/v1.9/talos-guides/configuration/nvidia-fabricmanager.md at v1.9.0).
    problems += [
        f"{e.name} {e.tag} is for another NVIDIA driver than the kernel modules ({driver}): the fabric manager "
        "must carry the same driver (pick the fabric manager of the same track)"
        for e in resolved
        if "nvidia-fabricmanager" in e.name and driver and e.tag.split("-")[0] != driver
    ]
    if problems:
        # every problem says what to change; the hint says where those extensions come from, for preflight and
        # the image step alike (the image step's fix was empty: review of 1932525)
        raise CompatibilityError(
            f"the extensions {source} offers for Talos {talos_version} cannot work together: "
            + "; ".join(problems),
            hint="change what each problem names: the NVIDIA extensions follow driver_flavor and track (or a "
            "node's overrides), a fabric manager or other extension comes from extra_extensions",
        )
    return ResolvedExtensions(talos_version=talos_version, extensions=resolved, driver=driver)


def check_registration(base_url: str, reg: SchematicRegistration) -> None:
    problems: list[str] = []
    if reg.id != reg.offline_id:
        problems.append(f"the factory assigned ID {reg.id}, the offline computation gives {reg.offline_id}")
    if reg.server_canonical_yaml is not None and reg.server_canonical_yaml != reg.canonical_yaml:
        diff = "".join(
            difflib.unified_diff(
                reg.canonical_yaml.splitlines(keepends=True),
                reg.server_canonical_yaml.splitlines(keepends=True),
                "offline",
                "factory",
            )
        )
        problems.append(f"its canonical schematic differs from ours:\n{diff}")
    if problems:
        raise PermanentError(
            f"Image Factory {base_url} disagrees about the schematic: " + "; ".join(problems),
            hint="an Enterprise factory adds an owner, and a proxy may rewrite bodies; use the factory's ID only "
            "after checking why (nodes report the ID they were installed with)",
        )


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:297] + "..."
