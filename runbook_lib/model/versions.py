"""Talos versions and NVIDIA extension version tags.

Why this module exists: every step of the procedure changes with the Talos *minor* version, and the
NVIDIA kernel-module extension is built against one exact Talos *release* (its tag is
``<driver>-<talos>``, e.g. ``580.95.05-v1.12.0-beta.0``), while the container toolkit's tag is
``<driver>-<toolkit>`` (e.g. ``580.95.05-v1.18.0``).  A node whose two driver parts differ fails with
"Driver/library version mismatch" (facts §5), and a kernel-module tag built for another Talos release
does not load at all (facts §1.2), so both are checked before anything changes.

Ordering uses :mod:`packaging` (``v1.12.0-beta.0`` < ``v1.12.0``); the original text is kept for display.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Any

from packaging.version import InvalidVersion, Version

from runbook_lib.errors import CompatibilityError, PermanentError

_TALOS_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(-(?:alpha|beta|rc)\.\d+)?$")
_DRIVER_RE = r"\d+\.\d+(?:\.\d+)?"
_TAG_RE = re.compile(rf"^(?P<driver>{_DRIVER_RE})-(?P<other>v\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)$")

#: The Talos minors this project has researched profiles for (facts §1).
SUPPORTED_MINORS: tuple[tuple[int, int], ...] = tuple((1, m) for m in range(3, 15))


@total_ordering
@dataclass(frozen=True)
class TalosVersion:
    """A Talos release (``v1.12.7``) or minor line (``v1.12``, patch ``None``)."""

    major: int
    minor: int
    patch: int | None = None
    prerelease: str = ""
    """``-beta.0`` style suffix, kept verbatim because extension tags embed it."""

    @classmethod
    def parse(cls, text: str) -> TalosVersion:
        match = _TALOS_RE.match(text.strip())
        if not match:
            raise PermanentError(
                f"{text!r} is not a Talos version",
                hint="use vMAJOR.MINOR.PATCH, e.g. v1.12.7 (or v1.12.0-beta.0 for a pre-release)",
            )
        major, minor, patch, pre = match.groups()
        return cls(int(major), int(minor), int(patch) if patch is not None else None, pre or "")

    @property
    def minor_line(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def is_release(self) -> bool:
        """True for an exact release (has a patch number), which installers and tags need."""
        return self.patch is not None

    def _key(self) -> Version:
        base = f"{self.major}.{self.minor}.{self.patch if self.patch is not None else 0}"
        try:
            return Version(base + self.prerelease)
        except InvalidVersion:  # pragma: no cover - the regex only admits alpha/beta/rc
            return Version(base)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, TalosVersion):
            return NotImplemented
        return self._key() < other._key()

    @classmethod
    def parse_or_none(cls, tag: str | None) -> TalosVersion | None:
        """A node's or talosctl's version tag, or None when it is missing or unparsable (a caller that must
        decide without it: an unreadable release counts as old, or is not compared)."""
        try:
            return cls.parse(tag or "")
        except PermanentError:
            return None

    def at_least(self, major: int, minor: int, patch: int = 0) -> bool:
        """True when this version is ``major.minor.patch`` or newer (pre-releases count as that release)."""
        own = (self.major, self.minor, self.patch or 0)
        return own >= (major, minor, patch)

    def __str__(self) -> str:
        core = f"v{self.major}.{self.minor}"
        if self.patch is not None:
            core += f".{self.patch}"
        return core + self.prerelease


def driver_key(driver: str) -> tuple[int, ...]:
    """Numeric sort key of an NVIDIA driver version such as ``580.105.08``."""
    return tuple(int(p) for p in driver.split("."))


@dataclass(frozen=True)
class ExtensionTag:
    """A parsed extension tag: the NVIDIA driver part and what follows it."""

    driver: str
    other: str
    """Talos version for kernel modules, container-toolkit version for the toolkit, empty for fabricmanager."""

    @classmethod
    def parse(cls, tag: str, *, what: str = "extension tag") -> ExtensionTag:
        tag = tag.strip()
        if re.fullmatch(_DRIVER_RE, tag):
            return cls(driver=tag, other="")
        match = _TAG_RE.match(tag)
        if not match:
            raise PermanentError(
                f"{what} {tag!r} is not <driver>-<version>",
                hint="kernel modules are tagged like 580.95.05-v1.12.0, the toolkit like 580.95.05-v1.18.0",
            )
        return cls(driver=match["driver"], other=match["other"])


def parse_kmod_tag(tag: str) -> tuple[str, TalosVersion]:
    """Split a kernel-module tag ``<driver>-<talos>`` into the driver and the Talos release it was built for."""
    parsed = ExtensionTag.parse(tag, what="kernel-module tag")
    if not parsed.other:
        raise PermanentError(
            f"kernel-module tag {tag!r} names no Talos version", hint="expected e.g. 580.95.05-v1.12.0"
        )
    return parsed.driver, TalosVersion.parse(parsed.other)


def parse_toolkit_tag(tag: str) -> tuple[str, str]:
    """Split a container-toolkit tag ``<driver>-<toolkit>`` into the driver and the toolkit version."""
    parsed = ExtensionTag.parse(tag, what="container-toolkit tag")
    if not parsed.other:
        raise PermanentError(
            f"container-toolkit tag {tag!r} names no toolkit version", hint="expected e.g. 580.95.05-v1.18.0"
        )
    return parsed.driver, parsed.other


@dataclass(frozen=True)
class TagCheck:
    """Outcome of :func:`check_extension_tags`: every problem, each saying what is wrong and what would fit."""

    driver: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_extension_tags(kmod_tag: str, toolkit_tag: str, node_talos: TalosVersion | str) -> TagCheck:
    """Check the two rules that make a node's NVIDIA stack load: same driver, kmod built for this Talos.

    Returns all problems rather than raising on the first, so a report can show both at once.
    """
    node = node_talos if isinstance(node_talos, TalosVersion) else TalosVersion.parse(node_talos)
    kmod_driver, built_for = parse_kmod_tag(kmod_tag)
    toolkit_driver, toolkit_version = parse_toolkit_tag(toolkit_tag)
    problems: list[str] = []
    if kmod_driver != toolkit_driver:
        problems.append(
            f"driver mismatch: kernel modules {kmod_tag} carry driver {kmod_driver} but the container toolkit "
            f"{toolkit_tag} carries {toolkit_driver}; use the same track for both (a toolkit tagged "
            f"{kmod_driver}-{toolkit_version}, or kernel modules tagged {toolkit_driver}-{node})"
        )
    if str(built_for) != str(node):
        problems.append(
            f"kernel modules {kmod_tag} were built for Talos {built_for}, but the node runs {node}; "
            f"the modules need the tag {kmod_driver}-{node} (the factory picks it when the installer "
            f"is built for {node})"
        )
    return TagCheck(driver=kmod_driver, problems=tuple(problems))


def require_matching_tags(kmod_tag: str, toolkit_tag: str, node_talos: TalosVersion | str) -> str:
    """Like :func:`check_extension_tags`, raising :class:`CompatibilityError`; returns the driver version."""
    result = check_extension_tags(kmod_tag, toolkit_tag, node_talos)
    if not result.ok:
        raise CompatibilityError("; ".join(result.problems))
    return result.driver


#: A chart version as helm reads it (Masterminds/semver ``NewVersion``: an optional ``v``, minor and patch optional).
_CHART_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def _chart_version_key(text: str) -> tuple[Any, ...] | None:
    """Semantic-version precedence (semver.org §11): a pre-release sorts before its release, its dot-separated
    identifiers compared numerically when digits, numbers before words; build metadata ignored."""
    match = _CHART_VERSION.match(text.strip())
    if match is None:
        return None
    core = tuple(int(part or 0) for part in match.groups()[:3])
    pre = match.group(4)
    if pre is None:
        return (core, (1,))
    return (core, (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))))


def is_chart_version(text: str) -> bool:
    """Whether ``text`` is one chart version rather than a range (``~0.17``, ``>=26.3.1``) helm resolves against
    the repository's index."""
    return _chart_version_key(text) is not None


def chart_is_newer(installed: str, planned: str) -> bool | None:
    """Whether a Helm chart version installed is newer than the one planned (``v26.7.0`` > ``v26.3.3``), by
    semantic-version precedence as helm orders chart versions; ``None`` when either is not a version (a
    constraint such as ``>=26.3.1``), so the caller leaves the choice to helm rather than guess.

    Why it matters: ``helm upgrade --version`` installs exactly the version given, older or not, so a plan pinned
    to an older chart than a site already runs would downgrade it. Why not :mod:`packaging`: PEP 440 reads
    ``26.3.3-1`` as a post-release (after ``26.3.3``, where semver puts it before) and refuses ``0.17.0-ubi8``."""
    old, new = _chart_version_key(installed), _chart_version_key(planned)
    if old is None or new is None:
        return None
    return old > new


def gpu_operator_too_old(version: str, minimum: str) -> str | None:
    """Why ``version`` of the GPU Operator chart is refused, or None: older than ``minimum``, the oldest the Talos
    docs support. A range is judged once helm has resolved it (the Kubernetes step)."""
    if chart_is_newer(minimum, version):
        return (
            f'{version} is older than {minimum}: the Talos docs say "Make sure to install GPU operator version '
            f'{minimum} or higher"; pin {minimum} or newer (Talos CI installs v26.3.3)'
        )
    return None
