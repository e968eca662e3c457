"""Verify must not pass a node on evidence it could not read.

The cdi-spec check counts ``Could not locate`` in ``talosctl logs ext-nvidia-cdi-gen``; when that read failed it
counted 0 lines and passed the node.  Here the real verify runs against a simulated Talos 1.13.2 cluster, and one
node's log read is refused exactly as the real talosctl prints it:

* ``talosctl logs`` always sends ``nodes`` metadata (talos@v1.13.0 cmd/talosctl/pkg/talos/global/client.go:109
  ``client.WithNodes``), so apid proxies one-to-many (internal/app/apid/pkg/director/director.go:87-99) and a
  node's error comes back as ``Metadata.Error`` (internal/app/apid/pkg/backend/apid.go:239-256 BuildError),
  which talosctl prints as ``ERROR: <error>`` on stderr, naming no node, while the other nodes' lines go to
  stdout as ``<node>: <line>``; it then exits 1 (cmd/talosctl/cmd/talos/logs.go:74-106).
* machined's error for a service whose log was never written (it has not run since boot):
  ``log "<id>" was not registered`` (internal/app/machined/pkg/runtime/logging/circular.go:235-247), a plain
  error, so gRPC code Unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.steps.verify import verify
from tests.simcluster import sim_cluster

NOT_REGISTERED = 'ERROR: rpc error: code = Unknown desc = log "ext-nvidia-cdi-gen" was not registered\n'


class Refusing(Runner):
    """Runs every talosctl call for real through ``inner``; subclasses refuse some of ``refused``'s calls."""

    def __init__(self, inner: Runner, refused: str) -> None:
        super().__init__(inner.journal)
        self.inner = inner
        self.refused = refused


class RefusedLogs(Refusing):
    """``refused``'s log read fails as the real talosctl prints it (``error``; with none, the read succeeds but
    gives no line); the other nodes' lines are kept."""

    error = NOT_REGISTERED

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        result = self.inner.run(argv, **kwargs)
        nodes = argv[argv.index("-n") + 1].split(",") if "-n" in argv else []
        if "logs" not in argv or self.refused not in nodes:
            return result
        kept = "".join(
            line
            for line in result.stdout.splitlines(keepends=True)
            if not line.startswith(self.refused + ": ")
        )
        failed = int(bool(self.error))
        return CommandResult(result.argv, failed, kept, result.stderr + self.error, result.duration_s)


class EmptyLog(RefusedLogs):
    error = ""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runner", "said"),
    [
        (
            RefusedLogs,
            'failed: ERROR: rpc error: code = Unknown desc = log "ext-nvidia-cdi-gen" was not registered',
        ),
        (EmptyLog, "printed no line"),
    ],
)
def test_a_cdi_gen_log_that_cannot_be_read_fails_the_node_instead_of_passing_it(tmp_path, runner, said):
    """An empty log is no evidence either: a Finished generator logs what it could not locate (9 lines on a
    healthy LTS node, which Talos CI asserts exactly: talos v1.13.0 extensions_nvidia.go:167-174)."""
    with sim_cluster(tmp_path, daemon=False, scenario="gpu-ready", talos_version="v1.13.2") as (params, ctx):
        refused = params.nodes[0]
        ctx.talosctl.runner = runner(ctx.talosctl.runner, refused.address)
        result = verify(ctx)
        by_name = {n.node: n for n in result.nodes}
        cdi = next(c for c in by_name[refused.name].checks if c.name == "cdi-spec")
        assert not cdi.ok and by_name[refused.name].status == "failed"
        assert f"`talosctl -n {refused.address} logs ext-nvidia-cdi-gen` {said}" in cdi.message
        assert f"talosctl -n {refused.address} service ext-nvidia-cdi-gen" in cdi.fix
        # the node whose log was read is still judged on it, and passes
        other = by_name[params.nodes[1].name]
        assert other.status == "ok", other.to_dict()
        assert next(c for c in other.checks if c.name == "cdi-spec").message.startswith(
            "ext-nvidia-cdi-gen could not locate 9 files"
        )


class LogsOfThree(Runner):
    """``talosctl logs`` as the real one answers when 10.0.0.2's log was never written: the others' lines on
    stdout, ``ERROR: …`` naming no node on stderr, exit 1."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        nodes = argv[argv.index("-n") + 1].split(",")
        self.calls.append(nodes)
        out = "".join(f'{n}: level=info msg="Generated CDI spec"\n' for n in nodes if n != "10.0.0.2")
        refused = "10.0.0.2" in nodes
        return CommandResult(tuple(argv), int(refused), out, NOT_REGISTERED if refused else "", 0.0)


def test_a_log_error_naming_no_node_is_given_to_the_node_that_printed_nothing() -> None:
    from runbook_lib.clients.talosctl import Talosctl

    runner = LogsOfThree()
    logs, errors = Talosctl(runner=runner).logs("ext-nvidia-cdi-gen", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert sorted(logs) == ["10.0.0.1", "10.0.0.3"]
    assert errors == {"10.0.0.2": NOT_REGISTERED.strip()}
    assert runner.calls == [["10.0.0.1", "10.0.0.2", "10.0.0.3"], ["10.0.0.2"]]  # only the silent node again


#: ``talosctl read`` with a talosconfig whose role is not os:admin: MachineService/Read is for os:admin only
#: (talos@v1.13.0 internal/app/machined/pkg/system/services/machined.go:99; os:operator and os:reader may read
#: logs and resources, :89), refused with authz.ErrNotAuthorized (pkg/grpc/middleware/authz/authorizer.go:18);
#: talosctl prints the stream's error as ``error reading: %w`` (cmd/talosctl/cmd/talos/read.go:45-48) then exits 1
#: (cmd/talosctl/cmd/root.go:35-37).
READ_REFUSED = "error reading: rpc error: code = PermissionDenied desc = not authorized\n"


class RefusedRead(Refusing):
    """``read <path>`` on ``refused`` is refused as for an os:operator talosconfig."""

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        if "read" in argv and argv[argv.index("-n") + 1] == self.refused:
            return CommandResult(tuple(argv), 1, "", READ_REFUSED, 0.01)
        return self.inner.run(argv, **kwargs)


@pytest.mark.slow
def test_a_refused_driver_version_read_fails_the_node_instead_of_skipping_the_driver_checks(tmp_path):
    """Before: the refused read counted as "file absent", so the driver checks (and the CDI-spec check, which
    needs the driver's architecture) were skipped and the node passed on its modules alone."""
    with sim_cluster(tmp_path, daemon=False, scenario="gpu-ready", talos_version="v1.13.2") as (params, ctx):
        refused = params.nodes[1]
        ctx.talosctl.runner = RefusedRead(ctx.talosctl.runner, refused.address)
        result = verify(ctx)
        node = next(n for n in result.nodes if n.node == refused.name)
        assert node.status == "failed", node.to_dict()
        check = next(c for c in node.checks if c.name == "driver version file")
        command = f"talosctl -n {refused.address} read /proc/driver/nvidia/version"
        assert (
            not check.ok
            and command in check.message
            and "PermissionDenied desc = not authorized" in check.message
        )
        assert "os:admin" in check.fix and command in check.fix
        assert all(n.status == "ok" for n in result.nodes if n is not node), result.to_dict()


#: A node's ServiceList error as the real talosctl prints it while the other nodes answer: the one-to-many
#: call's multierror (each error prefixed with its node by client.FilterMessages) as a ``WARNING`` on stderr, exit
#: 0 (talos@v1.13.0 cmd/talosctl/cmd/talos/service.go:73-83 serviceList, cli.Warning). The error itself is an
#: example: apid's own wording when it cannot reach the node; not captured from a real node.
SERVICES_REFUSED = (
    "WARNING: 1 error occurred:\n\t* {node}: rpc error: code = Unavailable desc = connection error: desc = "
    '"transport: Error while dialing: dial tcp {node}:50000: connect: connection refused"\n\n'
)


class RefusedServices(Refusing):
    """``talosctl service`` answers for every node but ``refused``, whose error is the call's warning."""

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        result = self.inner.run(argv, **kwargs)
        if list(argv[-1:]) != ["service"] or self.refused not in argv[argv.index("-n") + 1].split(","):
            return result
        rows = "".join(
            line
            for line in result.stdout.splitlines(keepends=True)
            if not line.startswith(self.refused + " ")
        )
        return CommandResult(result.argv, 0, rows, SERVICES_REFUSED.format(node=self.refused), 0.01)


@pytest.mark.slow
def test_a_failed_service_list_names_the_node_the_command_and_the_fix(tmp_path):
    with sim_cluster(tmp_path, daemon=False, scenario="gpu-ready", talos_version="v1.13.2") as (params, ctx):
        refused = params.nodes[0]
        ctx.talosctl.runner = RefusedServices(ctx.talosctl.runner, refused.address)
        result = verify(ctx)
        node = next(n for n in result.nodes if n.node == refused.name)
        check = next(c for c in node.checks if c.name == "services")
        assert not check.ok and node.status == "failed"
        assert (
            f"`talosctl -n {refused.address} service` failed: rpc error: code = Unavailable" in check.message
        )
        assert f"talosctl -n {refused.address} service" in check.fix
        assert not any(c.name == "cdi-spec" for c in node.checks)  # not judged without the service's state
        assert all(n.status == "ok" for n in result.nodes if n is not node), result.to_dict()
