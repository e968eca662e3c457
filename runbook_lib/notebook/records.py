"""Change records: one directory per run, sealed by a manifest and chained to the record before it.

Why a hash chain and not just checksums: a SHA256SUMS file proves that nothing inside a record changed,
but not that a whole record was deleted or slipped in later.  Each record therefore stores the SHA-256 of
the previous record's manifest, so removing, replacing or inserting a record breaks the chain at a place
``verify`` can name.  The chain is followed through those links (seal order), never by name: a run that
started earlier may seal later.

How far that goes: nothing after the newest record proves it, so removing or re-sealing it is detected only
against an anchor, its manifest hash kept outside the folder (``runbook run`` prints it; ``records verify
--expect`` checks it).  The chain is unkeyed: whoever can write the folder can forge a whole chain, or
append a forged record after the anchor; only the anchor, held somewhere they cannot write, limits that.

A directory with neither ``record.json`` nor ``SHA256SUMS`` is a run that was killed or crashed: reported
as aborted (not as tampering) until ``seal_aborted`` seals it at the end of the chain, saying so.

Why secrets are scrubbed here as well as kept out upstream: the record is the one artefact that leaves the
machine, so every file is scrubbed of the talosconfig's and kubeconfig's key material right before it is
sealed, whatever a notebook, a tool or a traceback may have printed.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import functools
import getpass
import hashlib
import html.entities
import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import yaml

from runbook_lib.clients.proc import Journal, Runner
from runbook_lib.errors import PermanentError
from runbook_lib.notebook import frontpage
from runbook_lib.notebook.record_content import group_nodes

MANIFEST = "SHA256SUMS"
RECORD_JSON = "record.json"
#: ``record.json``'s field naming the run a run follows (``continues.py``), and the file that holds it from the
#: moment the run's folder is made: a run killed before its seal leaves it for :func:`seal_aborted` (review,
#: stop 53: an aborted record named no run before it, so a rollback of that run alone was not refused).
CONTINUES = "continues"
CONTINUES_FILE = "continues.json"
RECORD_FORMAT = 1
#: Overrides the records directory (default: ``records/`` under the current directory).
RECORDS_ENV = "RUNBOOK_RECORDS"
REDACTED = "***REDACTED***"
#: Keys whose values in a talosconfig/kubeconfig are secret material.
_SECRET_KEYS = frozenset(
    {
        "token",
        "key",
        "crt",
        "ca",
        "password",
        "client-key-data",
        "client-certificate-data",
        "certificate-authority-data",
        "id-token",
        "refresh-token",
        "access-token",
        "client-secret",
    }
)
#: Values shorter than this are not treated as secrets (they would redact ordinary words).
_MIN_SECRET_LEN = 8
_NAME_RE = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9-]+-[0-9a-f]{8}$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def default_root() -> Path:
    return Path(os.environ.get(RECORDS_ENV) or Path.cwd() / "records")


def utc_stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def record_name(cluster: str, run_id: str, now: datetime | None = None) -> str:
    """``<UTC time>-<cluster>-<run id>``: sorts chronologically, and names the cluster at a glance."""
    return f"{utc_stamp(now)}-{cluster}-{run_id}"


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


def create_record_dir(
    root: Path, cluster: str, *, run_id: str | None = None, now: datetime | None = None
) -> Path:
    """A new, empty record directory named at ``now`` (default: now); the name is unique even for runs started
    in the same second."""
    make_root(root)
    path = root / record_name(cluster, run_id or new_run_id(), now)
    path.mkdir()
    _close_for_others(path)
    return path


def make_root(root: Path) -> None:
    """Create the records folder if it is missing, closed to others' writes (:func:`_close_for_others`); an
    existing one is left as its owner set it."""
    if not root.exists():
        root.mkdir(parents=True, exist_ok=True)
        _close_for_others(root)


def _close_for_others(path: Path) -> None:
    """Take away other users' write from ``path``, whatever the umask.

    Why: a record is evidence that others read, not edit.  Under umask 000 records were written 0666/0777, and
    any local user could edit or delete one (attack re-run, stop 49); the manifest would tell, but only
    after the fact.  Readable by others stays: records are shared.  Group write stays as the umask gives it: a
    team's setgid records folder lets a member seal another's aborted run (review of 70aa799).
    """
    mode = path.stat().st_mode & 0o7777
    if mode & 0o002:
        with contextlib.suppress(PermissionError):  # another user's file (a shared folder's): theirs to mind
            path.chmod(mode & ~0o002)


def close_tree_for_others(path: Path) -> None:
    """:func:`_close_for_others` on a record directory and everything in it (files the run's kernels wrote
    under the caller's umask), at its seal; the directory itself was closed when it was made."""
    _close_for_others(path)
    for entry in path.rglob("*"):
        if not entry.is_symlink():
            _close_for_others(entry)


# ---------------------------------------------------------------------------------------------------------
# Who, where, which code


def who() -> dict[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return {"user": user, "host": socket.gethostname()}


def git_info(repo: Path) -> dict[str, Any]:
    """The runbook's commit and whether the working tree differed from it (records under it excluded)."""
    runner = Runner(Journal())
    try:
        head = runner.run(["git", "-C", str(repo), "rev-parse", "HEAD"], timeout=20)
        status = runner.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], timeout=20
        )
    except PermanentError:
        return {"commit": None, "dirty": None, "note": "git not installed"}
    if not head.ok:
        return {"commit": None, "dirty": None, "note": "not a git checkout"}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.ok else None}


# ---------------------------------------------------------------------------------------------------------
# Secrets


def secret_values(*config_paths: str | Path | None) -> list[str]:
    """Secret strings found in talosconfig/kubeconfig files (and their base64-decoded forms)."""
    found: set[str] = set()
    for path in config_paths:
        if not path:
            continue
        try:
            docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue
        for doc in docs:
            for key, value in _string_fields(doc):
                if key in _SECRET_KEYS:
                    found.add(value)
                elif key == "tokenFile":
                    found.update(_token_file(Path(path).parent / value))
    out: set[str] = set()
    for value in found:
        out.add(value)
        with contextlib.suppress(binascii.Error, ValueError, UnicodeDecodeError):
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
            out.update(line for line in decoded.splitlines() if len(line) >= _MIN_SECRET_LEN)
    return sorted((v for v in out if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def _token_file(path: Path) -> Iterator[str]:
    """The content of a file a kubeconfig's ``tokenFile`` names (relative to the kubeconfig, as kubectl reads
    it), trimmed as kubectl trims it: the token a run sends is a secret wherever it is kept."""
    with contextlib.suppress(OSError, UnicodeDecodeError), path.open(encoding="utf-8") as f:
        yield f.read(_TOKEN_FILE_MAX).strip()


#: How much of a tokenFile is read for its secret (a service-account token is a few KiB).
_TOKEN_FILE_MAX = 64 * 1024


def _string_fields(node: Any) -> Iterator[tuple[str, str]]:
    """Every (key, value) of a parsed config whose value is a string, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str):
                yield key, value
            else:
                yield from _string_fields(value)
    elif isinstance(node, list):
        for item in node:
            yield from _string_fields(item)


def redact(text: str, secrets: Iterable[str]) -> str:
    """The text with every secret blanked, in every written form (see :func:`_secret_pattern`)."""
    for value in secrets:
        pattern = _secret_pattern(value)
        if pattern is not None and _may_hold(text, value):
            text = pattern.sub(REDACTED, text)
    return text


def _may_hold(text: str, value: str) -> bool:
    """A cheap pre-check: letters and digits are never escaped, so the secret's longest run of them is in
    any text that holds the secret in any form."""
    runs = re.findall(r"[A-Za-z0-9]+", value)
    longest = max(runs, key=len, default="")
    return len(longest) < 4 or longest in text


@functools.lru_cache(maxsize=1024)
def _secret_pattern(value: str) -> re.Pattern[str] | None:
    """A pattern for the secret as files may hold it, not only verbatim.

    Why: a value is collected as the config file parses it (a ``token: |`` block ends in a newline), but a
    notebook or record holds it inside JSON (``\\n``, ``\\u002b``, ``\\/``, escaped again in JSON in JSON), a
    ``bytes`` repr in a traceback, HTML (``&#43;``, ``&plus;``) or a URL (``%2B``).  Surrounding whitespace
    is dropped, and each other character matches any of its escaped forms.
    """
    value = value.strip()
    if len(value) < _MIN_SECRET_LEN:
        return None
    return re.compile("".join(_char_forms(char) for char in value))


def _char_forms(char: str) -> str:
    """A regex alternation for one character: itself or any of its escaped forms (letters and digits are
    never escaped by JSON, HTML or URL encoders, so they match themselves only)."""
    if char.isascii() and char.isalnum():
        return char
    code = ord(char)
    forms = [
        re.escape(char),
        rf"\\+u{_hex(f'{code:04x}')}",  # JSON \u escapes, once or nested
        rf"\\+x{_hex(f'{code:02x}')}" if code < 0x100 else "",  # Python repr
        rf"&#0*{code};",
        rf"&#[xX]0*{_hex(f'{code:x}')};",
        f"%{_hex(f'{code:02x}')}" if code < 0x80 else "",  # URL encoding
        *(f"&{re.escape(name)}" for name in _ENTITIES.get(char, ())),
    ]
    if char in "\"\\/'":
        forms.append(rf"\\+{re.escape(char)}")  # JSON's short escapes
    if char in _SHORT_ESCAPES:
        forms.append(r"\\+" + _SHORT_ESCAPES[char])
    return "(?:" + "|".join(f for f in forms if f) + ")"


_SHORT_ESCAPES = {"\n": "n", "\t": "t", "\r": "r"}


def _hex(digits: str) -> str:
    """Hex digits in either case."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in digits)


#: HTML named character references by character (``+`` -> ``plus;``), for the HTML renderings.
_ENTITIES: dict[str, list[str]] = {}
for _name, _char in html.entities.html5.items():
    if len(_char) == 1 and _name.endswith(";"):
        _ENTITIES.setdefault(_char, []).append(_name)


def scrub_tree(path: Path, secrets: Iterable[str]) -> list[str]:
    """Redact secrets in every file under ``path``; returns the files that needed it.

    Bytes that are not UTF-8 are kept as they are (surrogate escapes), so a binary file is scrubbed too.
    """
    values = list(secrets)
    touched: list[str] = []
    if not values:
        return touched
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        text = file.read_bytes().decode("utf-8", "surrogateescape")
        clean = redact(text, values)
        if clean != text:
            file.write_bytes(clean.encode("utf-8", "surrogateescape"))
            touched.append(file.relative_to(path).as_posix())
    return touched


# ---------------------------------------------------------------------------------------------------------
# Manifest and chain


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _record_files(path: Path) -> list[str]:
    return sorted(
        p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != MANIFEST
    )


def write_manifest(path: Path) -> str:
    """Write ``SHA256SUMS`` (``sha256sum -c`` format) and return the manifest's own hash."""
    lines = [f"{sha256_file(path / rel)}  {rel}\n" for rel in _record_files(path)]
    (path / MANIFEST).write_text("".join(lines), encoding="utf-8")
    return sha256_file(path / MANIFEST)


def read_manifest(path: Path) -> dict[str, str]:
    """The manifest's ``{file: sha256}``; a manifest that is not UTF-8 or has a malformed line is an error
    naming the record (a tampered manifest must be reported, never crash ``verify``)."""
    text = _read_text(path, MANIFEST)
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, _, rel = line.partition("  ")
        if not _DIGEST_RE.match(digest) or not rel:
            raise PermanentError(
                f"{path.name}: {MANIFEST} line {number} is not '<64 hex digits>  <file>' (found {line[:80]!r})"
            )
        entries[rel] = digest
    return entries


def _read_text(path: Path, name: str) -> str:
    """A record file as text, or an error naming the record and the file."""
    try:
        return (path / name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PermanentError(f"{path.name}: no {name} (the run did not finish)") from None
    except UnicodeDecodeError as exc:
        raise PermanentError(f"{path.name}: {name} is not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise PermanentError(f"{path.name}: {name} cannot be read ({exc.strerror or exc})") from None


def sealed_records(root: Path) -> list[Path]:
    """Record directories (sealed or not) in name order; the chain order is :func:`read_chain`'s."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _NAME_RE.match(p.name))


def is_unsealed(path: Path) -> bool:
    """Neither ``record.json`` nor ``SHA256SUMS``: a run that was killed or crashed (or is still running)."""
    return not (path / RECORD_JSON).exists() and not (path / MANIFEST).exists()


@contextlib.contextmanager
def _chain_lock(root: Path) -> Iterator[None]:
    """Two runs sealing at once must not both chain to the same predecessor."""
    root.mkdir(parents=True, exist_ok=True)
    with _lock_file(root) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_file(root: Path) -> IO[str]:
    """The records folder's seal lock, created 0660 whatever the umask.

    Why not world-openable: ``flock`` needs only an open descriptor, so any local user who could open it could
    hold it and stall every seal (umask 000 made it 0666; review of 70aa799). Group members share a team's
    folder; a reader who cannot open it reads without the lock (:func:`reading`).
    """
    fd = os.open(root / ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o660)
    return os.fdopen(fd, "a")


@contextlib.contextmanager
def reading(root: Path) -> Iterator[None]:
    """Readers wait for a seal in progress, so a half-written record is never reported as tampered.

    A folder that cannot be locked (read-only: a downloaded CI artifact, a mount) is read as it is.
    """
    try:
        handle = _lock_file(root)
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def seal(path: Path, record: dict[str, Any], *, secrets: Iterable[str] = ()) -> str:
    """Write ``record.json`` (chained to the previous record), scrub secrets, write the manifest.

    Returns the manifest hash, which the next record will store.
    """
    root = path.parent
    values = list(secrets)
    with _chain_lock(root):
        # The last sealed, in seal order (names need not sort that way).
        previous = read_chain(root, quick=True).head
        link = {"record": previous.name, "sha256sums": _manifest_hash(previous)} if previous else None
        # The chain fields first, so the next seal reads them from the file's head (see _quick_link).
        record = {
            "format": RECORD_FORMAT,
            "record": path.name,
            "previous": link,
            **{k: v for k, v in record.items() if k not in ("format", "record", "previous")},
        }
        (path / RECORD_JSON).write_text(
            json.dumps(record, indent=1, sort_keys=False, default=str) + "\n", encoding="utf-8"
        )
        frontpage.write(path, record)  # before the scrub and the manifest: scrubbed and sealed like the rest
        scrub_tree(path, values)
        digest = write_manifest(path)
        close_tree_for_others(path)
        return digest


def _manifest_hash(path: Path) -> str:
    """The manifest's hash, or ``missing``: a tampered predecessor is for verify to report (it will), not a
    reason to leave this run's record unsealed."""
    manifest = path / MANIFEST
    return sha256_file(manifest) if manifest.is_file() else "missing"


#: What a record sealed by :func:`seal_aborted` says about itself.
ABORTED_NOTE = (
    "this run ended without sealing its record (killed, crashed, or the machine stopped) and was sealed "
    "afterwards by `runbook records seal-aborted`: what it ran and changed is known only from the files "
    "listed here, so check the cluster before relying on it"
)


def _started(stamp: str) -> str | None:
    """The start time a record's name carries; None when it is no time (``…T999999Z``: the name was made by hand
    or damaged). Why not an error: the directory is still sealed as evidence; ``seal-aborted`` crashed on it
    with a ValueError after ``records verify`` had suggested it (attack re-run, 7 Dec 2026)."""
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).isoformat()
    except ValueError:
        return None


def seal_aborted(
    path: Path, *, secrets: Iterable[str] = (), read_journal: JournalReader | None = None
) -> str:
    """Seal a directory a killed or crashed run left, as an aborted run, at the end of the chain.

    Why a separate seal: an unsealed directory is neither proof of tampering nor an intact record, and
    deleting it would delete evidence; sealing it records that the run was aborted and what it left.
    """
    if not is_unsealed(path):
        raise PermanentError(
            f"{path.name} is already sealed (it has {RECORD_JSON} or {MANIFEST})",
            hint="only a directory with neither, left by a run that was killed or crashed, can be sealed as aborted",
        )
    stamp, _, rest = path.name.partition("-")
    cluster, _, run_id = rest.rpartition("-")
    record: dict[str, Any] = {
        "run_id": run_id,
        "cluster": cluster,
        "started": _started(stamp),
        "outcome": "aborted",
        "aborted": True,
        "note": ABORTED_NOTE,
        "sealed_after_abort": {"at": now_iso(), **who()},
        "files": [{"path": rel, "bytes": (path / rel).stat().st_size} for rel in _record_files(path)],
    }
    record["steps"], record["changes"] = _aborted_steps(path, read_journal)
    record.update(_aborted_follows(path))
    params = aborted_params(path)
    if params is not None:
        record.update(params=params, apply=params.get("apply"), target=params.get("target"))
        if isinstance(params.get("cluster"), str) and params["cluster"]:
            # the parameters' cluster, not the name's: a JupyterLab approval's folder is named
            # <time>-<cluster>-interactive-<id>, and its aborted record said cluster "<cluster>-interactive", so
            # a rollback of it was refused as another cluster's and the chain of runs passed it over (review)
            record["cluster"] = params["cluster"]
    return seal(path, record, secrets=secrets)


#: Reads the journal a step's kernel appended while it ran, given the step's result file (which it never
#: wrote): ``runbook_lib.notebook.interrupts.read_journal`` on ``steps.journal_file``.
JournalReader = Callable[[Path], list[dict[str, Any]]]


def _aborted_steps(
    path: Path, read_journal: JournalReader | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steps an aborted run finished (``results/<step>.json``) or was running (a notebook without a
    result), and the cluster changes their journals hold."""
    steps: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    for notebook in sorted(path.glob("[0-9][0-9]-*.ipynb")):
        name = notebook.stem.split("-", 1)[1].removesuffix(".interactive")  # an approval's rebuilt notebook
        result_file = path / "results" / f"{name}.json"
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            result = None
        if isinstance(result, dict):
            step: dict[str, Any] = {
                "name": name,
                "status": str(result.get("status")),
                "summary": str(result.get("summary")),
            }
            if isinstance(result.get("result"), dict):
                # what rollback reads (where the image step found each node, which nodes a patch changed),
                # as a sealed run's record keeps it (``record_content.StepOutcome.to_record``); a result file
                # too damaged to group is left out, as an unreadable one is
                with contextlib.suppress(AttributeError, TypeError):
                    step["result"] = group_nodes(result["result"])
            entries = listed(result, "journal")
        else:
            step, entries = _in_flight_step(name, result_file, read_journal)
        steps.append(step)
        changes += [
            {"step": name, **{k: v for k, v in entry.items() if k in _CHANGE_KEYS}}
            for entry in entries
            if entry.get("changes_cluster")
        ]
    return steps, changes


def _in_flight_step(
    name: str, result_file: Path, read_journal: JournalReader | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The step that was running when the run ended, with what its kernel journalled as it went."""
    entries: list[dict[str, Any]] = []
    if read_journal is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            entries = [e for e in read_journal(result_file) if isinstance(e, dict)]
    count = sum(1 for entry in entries if entry.get("changes_cluster"))
    # an entry the journal reader made for a call that started and never returned (interrupts.IN_FLIGHT; not
    # imported: it brings jupyter_client into every `runbook records` command). A summary said "one marked in
    # flight may or may not have reached the cluster" of journals with none (README audit, stop 50)
    flying = sum(1 for entry in entries if str(entry.get("interrupt", "")).startswith("in flight"))
    if not entries:
        summary = "running when the run ended: its changes are unknown"
    elif count:
        maybe = f" ({flying} in flight: it may or may not have reached the cluster)" if flying else ""
        summary = f"running when the run ended: {count} change(s) from its journal{maybe}"
    else:
        summary = f"running when the run ended: its journal holds {len(entries)} read(s), no change"
    return {"name": name, "status": "aborted", "summary": summary}, entries


_CHANGE_KEYS = ("kind", "summary", "argv", "exit_code", "duration_s", "diff", "at", "interrupt")


def write_follows(path: Path, name: str | None) -> None:
    """Write :data:`CONTINUES_FILE` in a run's new folder: the run it follows, ``None`` for none."""
    (path / CONTINUES_FILE).write_text(json.dumps({CONTINUES: name}) + "\n", encoding="utf-8")


def _aborted_follows(path: Path) -> dict[str, Any]:
    """``{"continues": …}`` from an aborted run's :data:`CONTINUES_FILE`; {} when it has none (a rollback's, or
    a folder made before the file existed) or it cannot be read: then the record says nothing of it."""
    try:
        data = json.loads((path / CONTINUES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    value = data.get(CONTINUES, False) if isinstance(data, dict) else False
    return {CONTINUES: value} if value is None or (isinstance(value, str) and value) else {}


def aborted_params(path: Path) -> dict[str, Any] | None:
    """The parameters an aborted run wrote before it started (``params.yaml``), if readable."""
    try:
        data = yaml.safe_load((path / "params.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------------------------------
# Reading and verifying


@dataclass
class RecordSummary:
    name: str
    path: Path
    cluster: str = "?"
    started: str = "?"
    outcome: str = "incomplete"
    apply: bool | None = None
    steps: list[tuple[str, str]] = field(default_factory=list)
    changes: int = 0
    problem: str = ""
    nodes: str = ""
    """The parameter file's nodes (:func:`nodes_seen`; a ``--nodes`` subset is not reflected): two clusters with
    the same ``cluster`` name tell apart by it."""


def nodes_seen(data: Mapping[str, Any]) -> str:
    """``<count> node(s) from <first address>`` of the record's parameters, "" when it lists none.

    Why: ``records list`` showed only the cluster's name, and a folder holding runs of two clusters named alike
    (a staging copy of production's parameter file) listed them as one; rollback refuses a record whose nodes
    sit at other addresses, so the operator needs to see which record is which (operator walkthrough)."""
    params = data.get("params")
    nodes = params.get("nodes") if isinstance(params, Mapping) else None
    addresses = [str(n.get("address")) for n in nodes or [] if isinstance(n, Mapping) and n.get("address")]
    if not addresses:
        return ""
    return f"{len(addresses)} node(s) from {addresses[0]}"


def load_record(path: Path) -> dict[str, Any]:
    """``record.json`` as a mapping; anything else (missing, not UTF-8, not JSON, not an object) is an error
    naming the record, so ``list``, ``show``, ``verify`` and ``run --from`` report it instead of crashing."""
    text = _read_text(path, RECORD_JSON)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PermanentError(f"{path.name}: {RECORD_JSON} is not valid JSON ({exc})") from None
    except RecursionError:
        raise PermanentError(f"{path.name}: {RECORD_JSON} is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise PermanentError(
            f"{path.name}: {RECORD_JSON} is not a JSON object (found a {type(data).__name__})"
        )
    return data


def listed(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The mappings in ``data[key]``; a malformed record must not crash the reader."""
    value = data.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def summarize(path: Path) -> RecordSummary:
    """One line's worth of a record; a malformed record.json is kept as the problem, never raised."""
    summary = RecordSummary(name=path.name, path=path)
    try:
        data = load_record(path)
    except PermanentError as exc:
        if (path / RECORD_JSON).exists():
            summary.outcome = "malformed"
            summary.problem = str(exc)
        return summary
    summary.cluster = str(data.get("cluster", "?"))
    summary.started = str(data.get("started", "?"))
    summary.outcome = str(data.get("outcome", "?"))
    summary.apply = data.get("apply") if isinstance(data.get("apply"), bool) else None
    summary.steps = [(str(s.get("name")), str(s.get("status"))) for s in listed(data, "steps")]
    summary.changes = len(listed(data, "changes"))
    summary.nodes = nodes_seen(data)
    return summary


def list_records(root: Path) -> list[RecordSummary]:
    return [summarize(p) for p in sealed_records(root)]


def resolve(root: Path, name: str | None) -> Path:
    """A record by (a unique prefix or suffix of) its name; ``None`` or ``latest`` means the newest.

    The newest is the chain's head (seal order).  When the chain is broken it is the newest sealed one by
    name instead, so a malformed newest record is reported (not silently skipped for an older one).
    """
    records = sealed_records(root)
    # a misspelt --records said "no records in" it, as of an empty folder (walkthrough, stop 53)
    if not records and not root.is_dir():
        raise PermanentError(
            f"the records folder {root} does not exist",
            hint=f"name the folder `runbook run` writes to (--records, ${RECORDS_ENV}; default ./records)",
        )
    if not records:
        raise PermanentError(f"no records in {root}", hint="`runbook run` writes one per run")
    if name in (None, "latest"):
        chain = read_chain(root, quick=True)
        if chain.head is not None and not chain.problems:
            return chain.head
        sealed = [path for path in records if not is_unsealed(path)]
        return (sealed or records)[-1]
    assert name is not None
    matches = [p for p in records if p.name == name or p.name.startswith(name) or p.name.endswith(name)]
    if len(matches) != 1:
        what = "no record matches" if not matches else f"{len(matches)} records match"
        raise PermanentError(f"{what} {name!r} in {root}", hint="`runbook records list` shows the names")
    return matches[0]


def verify_record(path: Path) -> list[str]:
    """Problems inside one record: edited, removed and inserted files."""
    name = path.name
    if not (path / MANIFEST).exists():
        return [f"{name}: {MANIFEST} is missing (an unfinished run, or the manifest was removed)"]
    try:
        manifest = read_manifest(path)
    except PermanentError as exc:
        return [str(exc)]
    problems: list[str] = []
    present = set(_record_files(path))
    for rel, digest in manifest.items():
        if rel not in present:
            problems.append(f"{name}: removed file {rel}")
        elif (path / rel).is_symlink():  # the bytes may match today, but they are not in the record
            problems.append(f"{name}: {rel} is a symbolic link, not a file")
        elif sha256_file(path / rel) != digest:
            problems.append(f"{name}: edited file {rel}")
    problems += [f"{name}: inserted file {rel}" for rel in sorted(present - set(manifest))]
    return problems


@dataclass
class _Link:
    """A sealed record's place in the chain: the record it says precedes it (``None``: the first)."""

    path: Path
    previous: dict[str, str] | None


@dataclass
class Chain:
    """The records folder read as a chain: records in seal order, runs left unsealed, what breaks it.

    Why seal order and not name order: names carry the start time and a random run id, and a run that
    started earlier can seal later (a long apply beside a short plan), so only the ``previous`` links say
    which record followed which.
    """

    order: list[Path] = field(default_factory=list)
    aborted: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def head(self) -> Path | None:
        return self.order[-1] if self.order else None


#: The head of a record.json as :func:`seal` writes it: the chain fields before everything else.
_QUICK_LINK = re.compile(
    r'\A\{\n "format": \d+,\n "record": "(?P<record>[^"\\]*)",\n "previous": (?:null|\{\n'
    r'  "record": "(?P<previous>[^"\\]*)",\n  "sha256sums": "(?P<sha>[0-9a-f]{64})"\n \})[,\n]'
)


def _quick_link(path: Path) -> _Link | None:
    """The chain link from the first bytes of record.json, or ``None`` when it is not in seal's layout.

    Why: record.json of a fleet run is megabytes, and sealing must find the chain's head without parsing
    every earlier record.  ``verify`` always parses the whole file.
    """
    try:
        with (path / RECORD_JSON).open("rb") as handle:
            head = handle.read(1024).decode("utf-8", "replace")
    except OSError:
        return None
    match = _QUICK_LINK.match(head)
    if match is None or match["record"] != path.name:
        return None
    if match["previous"] is None:
        return _Link(path, None)
    return _Link(path, {"record": match["previous"], "sha256sums": match["sha"]})


def _link_of(path: Path, *, quick: bool = False) -> tuple[_Link | None, list[str]]:
    """The record's ``previous`` link, and what is wrong with it (unreadable, renamed)."""
    fast = _quick_link(path) if quick else None
    if fast is not None:
        return fast, []
    try:
        data = load_record(path)
    except PermanentError as exc:
        return None, [str(exc)]
    problems = []
    if data.get("record") not in (None, path.name):
        problems.append(f"{path.name}: renamed (its {RECORD_JSON} says it is {str(data.get('record'))[:80]})")
    previous = data.get("previous")
    if previous is None:
        return _Link(path, None), problems
    if not (
        isinstance(previous, dict)
        and isinstance(previous.get("record"), str)
        and isinstance(previous.get("sha256sums"), str)
    ):
        return None, [
            *problems,
            f"{path.name}: {RECORD_JSON} 'previous' is not an object with 'record' and 'sha256sums' "
            f"(found {json.dumps(previous)[:80]})",
        ]
    return _Link(path, {"record": previous["record"], "sha256sums": previous["sha256sums"]}), problems


def read_chain(root: Path, *, quick: bool = False) -> Chain:
    """Follow the ``previous`` links from the first record; name what is removed, inserted or rewritten.

    ``quick`` reads the links from the head of each record.json where seal's layout allows (to find the
    head); ``verify`` parses every file whole.
    """
    chain = Chain()
    dirs = sealed_records(root)
    links: dict[str, _Link] = {}
    for path in dirs:
        if not (path / RECORD_JSON).exists():
            continue  # unsealed (judged below), or record.json removed (verify_record names it)
        link, problems = _link_of(path, quick=quick)
        chain.problems += problems
        if link is not None:
            links[path.name] = link
    successors: dict[str, list[_Link]] = {}
    for link in links.values():
        if link.previous is not None:
            successors.setdefault(link.previous["record"], []).append(link)
    for path in filter(is_unsealed, dirs):
        if path.name in successors:
            after = successors[path.name][0].path.name
            chain.problems.append(
                f"{path.name}: {RECORD_JSON} and {MANIFEST} removed ({after} chains to it, so it was sealed)"
            )
        else:
            chain.aborted.append(path)
    _walk(_starts(links, {p.name for p in dirs}, chain), successors, chain)
    chain.problems += [
        f"{name}: not reachable from the first record (records swapped, or inserted in a loop)"
        for name in sorted(set(links) - {p.name for p in chain.order})
    ]
    return chain


def _starts(links: dict[str, _Link], names: set[str], chain: Chain) -> list[_Link]:
    """Where the chain (and, when broken, each piece of it) begins."""
    ordered = sorted(links.values(), key=lambda link: link.path.name)
    roots = [link for link in ordered if link.previous is None]
    chain.problems += [
        f"{extra.path.name}: claims to be the first record, but the chain starts at {roots[0].path.name} "
        "(an inserted record, or the chain was restarted)"
        for extra in roots[1:]
    ]
    pieces = []
    for link in ordered:
        claimed = link.previous["record"] if link.previous else None
        if claimed is not None and claimed not in links:
            if claimed not in names:
                chain.problems.append(
                    f"{claimed}: record removed (the chain in {link.path.name} points to it)"
                )
            pieces.append(link)
    return roots + pieces


def _walk(starts: list[_Link], successors: dict[str, list[_Link]], chain: Chain) -> None:
    """Depth-first along the links, checking each record's manifest against the hash its successor kept."""
    seen: set[str] = set()
    stack = list(reversed(starts))
    while stack:
        link = stack.pop()
        if link.path.name in seen:
            continue
        seen.add(link.path.name)
        chain.order.append(link.path)
        after = sorted(successors.get(link.path.name, []), key=lambda item: item.path.name)
        if len(after) > 1:
            chain.problems.append(
                f"{', '.join(a.path.name for a in after)} all chain to {link.path.name} "
                "(an inserted record, or two runs sealed at once)"
            )
        manifest = link.path / MANIFEST
        digest = sha256_file(manifest) if manifest.is_file() else None
        for successor in after:
            if successor.previous is not None and digest != successor.previous["sha256sums"]:
                chain.problems.append(
                    f"{link.path.name}: {MANIFEST} changed after {successor.path.name} was recorded"
                )
        stack.extend(reversed(after))


#: An anchor is a manifest hash: all 64 hex digits, or a prefix of at least this many.
ANCHOR_MIN = 16
_ANCHOR_RE = re.compile(rf"^[0-9a-f]{{{ANCHOR_MIN},64}}$")


def check_anchors(root: Path, expect: Iterable[str], chain: Chain) -> list[str]:
    """Problems with anchors: each expected manifest hash must still be the hash of a record's SHA256SUMS.

    Why anchors: the chain proves each record against the one after it, so nothing proves the newest one;
    its hash, printed by ``runbook run`` and kept outside the records folder (a CI log), does.  A hash
    that no longer matches means the anchored record was removed or re-sealed.
    """
    wanted = [value.strip().lower() for value in expect]
    bad = [value for value in wanted if not _ANCHOR_RE.match(value)]
    if bad:
        raise PermanentError(
            f"--expect {bad[0]!r} is not a SHA256SUMS hash",
            hint=f"give the hash `runbook run` printed: 64 hex digits (or at least the first {ANCHOR_MIN})",
        )
    hashes = [sha256_file(path / MANIFEST) for path in chain.order if (path / MANIFEST).is_file()]
    return [
        f"anchor {value}: no record's {MANIFEST} has this hash (the anchored record was removed, "
        "or re-sealed after the anchor was taken)"
        for value in wanted
        if not any(digest.startswith(value) for digest in hashes)
    ]


def check(root: Path, expect: Iterable[str] = ()) -> Chain:
    """The chain with every problem in the folder: inside each sealed record, between records, anchors.

    A folder that does not exist is a problem, and so is an anchor in a folder with no record: before, both
    answered "ok: 0 record(s) … anchor(s) found", so deleting the whole folder, or checking the wrong one (the
    anchor line ``runbook run`` printed named no folder), passed the check the anchor exists for (operator
    walkthrough, 6 Dec 2026)."""
    if not root.is_dir():
        missing = (
            f"no records folder at {root}: nothing to verify (give the folder the runs wrote: --records DIR)"
        )
        return Chain(problems=[missing, *check_anchors(root, expect, Chain())])
    with reading(root):
        chain = read_chain(root)
        anchors = check_anchors(root, expect, chain)
        inside = [
            p for path in sealed_records(root) if path not in chain.aborted for p in verify_record(path)
        ]
    chain.problems = inside + chain.problems + anchors
    return chain


def chain_problems(path: Path) -> list[str]:
    """What breaks the chain around one sealed record in its folder (inserted, re-sealed, renamed, a
    forged first record), as :func:`verify` names it, from the ``previous`` links only.

    Why: a copy of a record with edited contents and a fresh manifest is intact on its own
    (:func:`verify_record`); only the chain shows it was never sealed there.  The links are read quickly
    (the head of each record.json), so this costs little in a folder of fleet runs.
    """
    with reading(path.parent):
        chain = read_chain(path.parent, quick=True)
    return [problem for problem in chain.problems if path.name in problem]


def intact_problems(path: Path) -> list[str]:
    """What makes one sealed record not intact: its own files first (:func:`verify_record`), else its place in
    the chain (:func:`chain_problems`). The one test rollback's evidence, ``run --from`` and ``records show``
    apply before trusting a record."""
    return verify_record(path) or chain_problems(path)


def verify(root: Path) -> list[str]:
    """Every problem in the records directory; an empty list means intact (aborted runs are not problems)."""
    return check(root).problems


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
