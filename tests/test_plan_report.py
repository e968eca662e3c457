"""``runbook run`` without ``--apply`` prints what a planned step would change, not just ``planned (3 planned)``.

Found by an operator walkthrough: the machine-config diff lived only in the executed notebook, so a headless
plan could not be reviewed before ``--apply``. The dry-run text is shaped as the real talosctl prints one call
for two nodes: its ``patched …`` line per node, then machined's answer, ``Dry run summary:`` and ``Config
diff:`` (talos@v1.12.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:330).
"""

from __future__ import annotations

from pathlib import Path

from runbook_lib.notebook.record_content import PLAN_LINES_MAX, RunOutcome, StepOutcome, plan_lines

ANSWER = """patched MachineConfigs.config.talos.dev/v1alpha1 at the node {node}
Dry run summary:
Applied configuration without a reboot (skipped in dry-run).
Config diff:

--- a
+++ b
@@ -25,6 +27,12 @@
         hostDNS:
             enabled: true
+    kernel:
+        modules:
+            - name: nvidia
"""
DRY_RUN = ANSWER.format(node="10.5.0.11") + "\n" + ANSWER.format(node="10.5.0.12")


def _patch_result(nodes: list[str]) -> dict:
    return {
        "nodes": [{"node": n, "status": "planned", "data": {"group": 0}} for n in nodes],
        "notes": [
            "rollout: 2 node(s) in 2 batch(es) of 1, 1",
            "plan only (apply is off): nothing was changed",
        ],
        "data": {"groups": [{"nodes": nodes, "patch": "machine: {}", "dry_run": DRY_RUN}]},
    }


def test_a_group_of_nodes_shows_its_diff_once_with_the_rollout_note():
    lines = plan_lines(_patch_result(["gpu-1", "gpu-2"]))
    assert lines[0] == "  gpu-1, gpu-2: machine config diff (talosctl's dry run):"
    assert lines[1:6] == [
        "    @@ -25,6 +27,12 @@",
        "             hostDNS:",
        "                 enabled: true",
        "    +    kernel:",
        "    +        modules:",
    ]
    assert sum("name: nvidia" in line for line in lines) == 1, "the second node's same answer is not repeated"
    assert lines[-1] == "  note: rollout: 2 node(s) in 2 batch(es) of 1, 1"
    assert not any("--- a" in line or "patched " in line or "plan only" in line for line in lines)


def test_a_thousand_nodes_name_three_and_a_count_and_a_long_plan_is_cut():
    names = [f"gpu-{i:04d}" for i in range(1000)]
    assert plan_lines(_patch_result(names))[0].startswith("  gpu-0000, gpu-0001, gpu-0002 and 997 more:")
    result = {
        "nodes": [{"node": f"n{i}", "status": "planned", "message": f"would do {i}"} for i in range(99)]
    }
    lines = plan_lines(result)
    assert len(lines) == PLAN_LINES_MAX + 1 and "the whole plan is in the record" in lines[-1]


def test_steps_without_a_diff_show_their_planned_lines_grouped_and_the_report_carries_them():
    cuda = {"nodes": [{"node": n, "status": "planned", "message": "would run pods: gpu, smi"} for n in "ab"]}
    assert plan_lines(cuda) == ["  a, b: would run pods: gpu, smi"]
    outcome = RunOutcome(
        record=Path("/r"),
        outcome="planned",
        steps=[StepOutcome("config-patch", "02.ipynb", "planned", result=_patch_result(["gpu-1"]))],
        manifest_sha256="0" * 64,
        changes=0,
    )
    report = outcome.report()
    assert "config-patch would change (applied only with --apply):" in report
    assert "    +            - name: nvidia" in report
    # the CUDA test leaves nothing behind, as its --apply run says: not "would change" (walkthrough, stop 52)
    outcome.steps = [StepOutcome("cuda-test", "06.ipynb", "planned", result=cuda)]
    assert (
        "cuda-test would run (only with --apply; its test pods are deleted after):\n  a, b: would run pods"
        in (outcome.report())
    )


def test_nodes_whose_plans_differ_only_in_their_own_name_and_address_are_one_group():
    """A rollback's removal that reboots its node says ``kubectl drain <name> first`` beside ``-n <address>``;
    grouping on the address alone printed one group per node, 1,000 nodes cut after 40 lines (review)."""

    def node(i: int) -> dict[str, str]:
        name, address = f"gpu-{i}", f"10.5.0.{i}"
        return {
            "node": name,
            "address": address,
            "status": "planned",
            "message": "back to Talos v1.12.7",
            "diff": f"# it reboots the node: kubectl drain {name} first\ntalosctl -n {address} upgrade --image i",
        }

    lines = plan_lines({"nodes": [node(i) for i in (1, 10, 11)], "data": {"changes": ["helm uninstall x"]}})
    assert lines == [
        "  would: helm uninstall x",
        "  gpu-1, gpu-10, gpu-11: back to Talos v1.12.7",
        "    # it reboots the node: kubectl drain <node> first",
        "    talosctl -n <node> upgrade --image i",
    ], lines


def test_a_failed_node_s_quoted_tool_output_gives_way_to_its_cause_and_fix():
    """A hung boot's node line quoted ten lines of talosctl's output, which filled the report's budget: the
    likely cause and the fix were cut (walkthrough). The output is said to be in the record, once per node."""
    from runbook_lib.notebook.record_content import compact_failure

    quoted = [f"\t* sequence error {i}" for i in range(10)]
    lines = [
        "image: failed (1 failed, 2 changed)",
        "  gpu-3 (10.5.0.13): talosctl upgrade failed: the new boot waits for service x",
        "sequence: boot action: NOOP error: [code: sequence failed",
        *quoted,
        "    driver-binding: the nvidia driver never bound (likely cause: the GPU is not supported)",
        "    fix: choose another track:",
        "talosctl -n 10.5.0.13 upgrade --image i",
        "  hint: see the failing nodes above",
    ]
    assert (
        compact_failure(lines)
        == [
            *lines[
                :5
            ],  # the node's line and its first three continuation lines: a cause may be there (review)
            "    (the tool's output: in the record)",
            *lines[-4:],
        ]
    )
    assert compact_failure(lines[:6]) == lines[:6]  # what fits is left whole
