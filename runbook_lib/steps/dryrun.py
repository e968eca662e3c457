"""What a plan says of a write the kubeconfig's user may not make.

Why: the API server authorizes a dry-run write as the write itself (a dry run is a flag on the same request;
k8s.io/apiserver@v0.35.0 pkg/server/config.go:1019 authorizes before any handler reads it),
so a read-only identity, the one a site hands a reviewer or a CI job that only plans, failed the whole plan at
its first write (found by an operator walkthrough). The plan now goes on: the refused write is shown as planned,
with the refusal as what an apply run with the same kubeconfig would meet, and nothing after it is hidden. What
the server's dry run would have checked of that write (admission, validation) is not checked, and the plan says
so. An apply run raises the refusal as before.
"""

from __future__ import annotations

from runbook_lib.errors import GRANT_HINT, Forbidden
from runbook_lib.model.text import PARAMS_PLACEHOLDER

from .results import Check, StepResult

#: How a plan words a write the kubeconfig's user may not make, here and in preflight's and rollback's permission
#: check (permissions.verdict); the run's report finds those checks by it (notebook/record_content.refusal_lines).
REFUSED = "applying would be refused"

GRANT = f"{GRANT_HINT} to apply; the apply run's preflight names every write it needs"


def refused_in_plan(result: StepResult, exc: Forbidden, *, dry_run: bool, writes: int = 1) -> str:
    """The refusal as a plan says it (``; applying would be refused …``), its ``writes`` (one label per node)
    counted in ``data.refused``; raised again when not ``dry_run``."""
    if not dry_run:
        raise exc
    result.data["refused"] = int(result.data.get("refused", 0)) + writes
    return f"; {REFUSED}, so the API server's dry run did not check it: {exc.message}"


def fix(refused: str) -> str:
    """The check's fix for a write said by :func:`refused_in_plan` (none when it was not refused)."""
    return GRANT if refused else ""


def releases_unread(
    result: StepResult, name: str, exc: Forbidden, *, lead: str, subject: str, cannot: str
) -> None:
    """A plan's passed check ``name`` for helm's releases it may not read (``helm list -A`` refused), counted
    in ``data.unread``, which :func:`note` says apart from writes: ``<lead>: helm keeps <subject> in Secrets …
    so the plan cannot <cannot>; applying would be refused: …``. One wording for the Kubernetes step's plan and
    the 1.13 hand-over's."""
    result.data["unread"] = int(result.data.get("unread", 0)) + 1
    said = (
        f"{lead}: helm keeps {subject} in Secrets, which this kubeconfig's user may not list, so the plan cannot "
        f"{cannot}; {REFUSED}: {exc.message}"
    )
    result.checks.append(Check(name, True, said, fix=GRANT))


def note(result: StepResult) -> str | None:
    """The plan's note when writes, or reads it needed, were refused, else None."""
    count, unread = int(result.data.get("refused", 0)), int(result.data.get("unread", 0))
    if not count and not unread:
        return None
    said = []
    if count:
        said.append(
            f"{count} planned write(s) are refused to this kubeconfig's user: the plan shows them, but an apply "
            "run with the same kubeconfig would stop at the first"
        )
    if unread:
        said.append(
            f"{unread} read(s) the plan needed were refused (helm's releases): it shows what it could without them"
        )
    return "; ".join(said) + (
        "; helm's own writes (its release record, a Secret) are not in its dry run: "
        f"`runbook run {PARAMS_PLACEHOLDER} --steps preflight` names them"
    )
