"""The library's small error taxonomy, modelled on kopf's permanent/temporary split.

Every failure a user can meet is one of two kinds, because the two call for different actions:
``PermanentError`` (retrying the same thing cannot help: fix the input, the cluster or the plan) and
``RetryableError`` (the same call may succeed later: a node rebooting, a 5xx, a timeout).  Callers that
retry (rollouts, the factory client) decide on the class alone, never on message text.

This module sits outside the layers so every layer may raise these; it imports nothing from the library.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field


class RunbookError(Exception):
    """Base of every error the library raises on purpose.

    ``hint`` says what to do about it; the CLI prints it under the message and notebooks render it.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class PermanentError(RunbookError):
    """Retrying cannot help: the input, the plan or the cluster must change first."""


class RetryableError(RunbookError):
    """The same call may succeed later (unreachable node, server error, timeout).

    ``status``: the HTTP status an API server answered with (None when none answered), for a caller whose next
    move differs between a server that is busy (429) and one whose own hop failed (5xx)."""

    def __init__(
        self, message: str, *, hint: str | None = None, delay: float = 1.0, status: int | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.delay = delay
        self.status = status


@dataclass(frozen=True)
class ParameterProblem:
    """One thing wrong with a parameter file, located precisely enough to fix without guessing."""

    source: str
    """The file (or ``--set``/notebook parameter) the value came from."""
    path: str
    """Dotted key path, e.g. ``nodes[2].address``."""
    message: str
    """What is wrong and what would be valid."""

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}"


@dataclass
class ParametersInvalid(PermanentError):
    """All problems found in one validation pass: users fix a file once, not once per error."""

    problems: Sequence[ParameterProblem] = field(default_factory=list)

    def __post_init__(self) -> None:
        lines = [str(p) for p in self.problems]
        noun = "problem" if len(lines) == 1 else "problems"
        super().__init__(f"{len(lines)} parameter {noun}:\n" + "\n".join(f"  - {line}" for line in lines))

    def __str__(self) -> str:
        return self.message


class CompatibilityError(PermanentError):
    """Pieces that cannot work together (driver versions, tracks, Talos versions)."""


#: What to do about a write the authorizer refuses, as every refusal says it (a failed write's hint, a plan's
#: refused write, preflight's and rollback's permission check): one wording, so a user meets one instruction.
GRANT_HINT = (
    "grant it to the kubeconfig's user (a Role or ClusterRole bound to it), or use a kubeconfig that has it"
)
#: A failed request's hint when the authorizer refused it.
#: ``-p <parameters>`` is ``model.text.PARAMS_PLACEHOLDER``, which ``runbook run``'s report fills in
FORBIDDEN_HINT = (
    f"{GRANT_HINT}; `runbook run -p <parameters> --steps preflight` names every write a run needs"
)

#: The authorizer's refusal as the API server words it (k8s.io/apiserver@v0.35.0
#: pkg/endpoints/handlers/responsewriters/errors.go:60-80 ``forbiddenMessage``: ``User "…" cannot <verb> resource
#: "…" in API group …``, or ``… cannot <verb> path "…"``), in a 403's body or as helm and kubectl print it
#: (client-go's StatusError is the body's message). Only that 403 is ``Forbidden``: admission answers 403
#: too (a webhook's denial, a namespace being terminated), and those a dry run did check (review, 6 Dec 2026).
AUTHORIZER_REFUSAL = re.compile(r'User "[^"]*" cannot \S+ (?:resource|path) "')


class Forbidden(PermanentError):
    """The API server's authorizer refused the request for this identity (HTTP 403 with the authorizer's words;
    an admission plugin's 403 is a plain ``PermanentError``).

    Its own class because a plan meets it differently from other failures: a dry-run write the identity may
    not make is not checked by the server's dry run, but it tells the plan what an apply run with the same
    kubeconfig would meet, and the plan goes on (steps/kubernetes.py). Granting the permission helps;
    retrying does not."""
