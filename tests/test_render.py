"""Rendering a step result for a person: verdict, failures first with their fix, diffs once, capped table."""

from __future__ import annotations

import re

from runbook_lib.model.inventory import SOURCES, Gpu, NodeInventory, group_inventory
from runbook_lib.notebook.render import (
    CONTINUATION,
    config_diff,
    failure_hint,
    failure_text,
    render_html,
    render_markdown,
)
from runbook_lib.steps.results import Check, NodeResult, StepResult

PATCH = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n"


def fleet(size: int = 1000, failing: int = 3) -> StepResult:
    result = StepResult(step="config-patch", applied=False)
    for i in range(size):
        node = NodeResult(node=f"gpu-{i:04d}", address=f"10.0.{i // 250}.{i % 250}")
        if i >= size - failing:
            node.status = "failed"
            node.message = "cannot read the machine config"
            node.checks.append(
                Check(
                    "machine config readable",
                    False,
                    "connection refused",
                    fix=f"talosctl -n {node.address} version",
                    cause="node down",
                )
            )
        else:
            node.status = "planned"
            node.diff = PATCH
        result.nodes.append(node)
    return result


def test_counts_per_state_and_failing_nodes_before_the_table() -> None:
    html = render_html(fleet())
    assert re.search(r">planned</span> 997<", html) and re.search(r">failed</span> 3<", html)
    failing_at = html.index("Failing nodes (3)")
    table_at = html.index("All nodes (1000)")
    assert failing_at < table_at
    for name in ("gpu-0997", "gpu-0998", "gpu-0999"):
        assert failing_at < html.index(name) < table_at
    assert "talosctl -n 10.0.3.247 version" in html  # the fix is shown with the failure
    assert "<details>" in html  # the full table is collapsed


def test_table_is_capped_and_says_how_many_more() -> None:
    html = render_html(fleet(), limit=50)
    table = html[html.index("All nodes") :]
    assert table.count("<tr><td>") == 50
    assert "950 more in the record." in table
    assert len(html) < 60_000  # stays readable (and light) at 1,000 nodes


def test_identical_diffs_are_shown_once_with_their_node_count() -> None:
    html = render_html(fleet())
    assert html.count('class="runbook-diff"') == 1
    assert "997 node(s): gpu-0000, gpu-0001" in html and "and 989 more" in html
    assert "<pre" in html and "- name: nvidia" in html


def test_patch_groups_from_step_data_are_rendered_as_diffs() -> None:
    result = StepResult(step="config-patch", applied=False)
    result.nodes = [
        NodeResult("a", "10.0.0.1", status="planned"),
        NodeResult("b", "10.0.0.2", status="planned"),
    ]
    result.data["groups"] = [{"nodes": ["a", "b"], "patch": PATCH, "dry_run": ""}]
    html = render_html(result)
    assert "2 node(s): a, b" in html and "- name: nvidia" in html


def test_the_dry_run_diff_talosctl_printed_is_shown_under_the_patch() -> None:
    """The notebook showed only the patch, while `runbook run` printed talosctl's dry-run diff, the one machined
    checked (cloud-user walkthrough, 7 Dec 2026). Shaped as machined answers a dry run (talos@v1.12.0
    internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:250-252 and :330)."""
    dry = (
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n"
        "--- a\n+++ b\n@@ -17,6 +17,8 @@\n+        - name: nvidia <x>"
    )
    result = StepResult(step="config-patch", applied=False)
    result.nodes = [NodeResult("a", "10.0.0.1", status="planned")]
    result.data["groups"] = [{"nodes": ["a"], "patch": PATCH, "dry_run": dry}]
    html = render_html(result)
    assert "<p>a: machine config diff (talosctl's dry run)</p>" in html, html
    assert "@@ -17,6 +17,8 @@" in html and "nvidia &lt;x&gt;" in html
    assert html.index("- name: nvidia") < html.index("@@ -17,6 +17,8 @@"), "the patch first, then its diff"
    # a group's output holds one answer per node: the first is shown, once (review of 4421311: 1,000 copies)
    result.data["groups"] = [{"nodes": ["a", "b", "c"], "patch": PATCH, "dry_run": f"{dry}\n{dry}\n{dry}"}]
    html = render_html(result)
    assert html.count("@@ -17,6 +17,8 @@") == 1 and "Dry run summary" not in html, html
    assert "a, b, c: machine config diff (talosctl's dry run, one answer of 3)" in html


def test_a_dry_run_diff_ends_at_its_hunks_and_a_refusal_is_shown_not_an_empty_diff() -> None:
    """Shaped as talosctl prints a group's dry run: per node its ``patched … at the node`` line, then machined's
    answer (talos@v1.12.0 cmd/talosctl/cmd/talos/patch.go:103-111; configdiff.go:80-127 writes the hunks). A
    node that is down answered with an error naming no node, right after the previous node's hunks, and was
    shown as a line of its diff; a node that refused the patch answered with no ``Config diff:``, and the box
    was empty, which reads as "no changes" to whoever clicks Approve (review of 51a7060)."""
    patched = "patched MachineConfigs.config.talos.dev/v1alpha1 at the node {}\n"
    answer = (
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n"
        "--- a\n+++ b\n@@ -17,6 +17,8 @@\n         modules:\n+        - name: nvidia\n"
    )
    down = (
        "rpc error: code = Unavailable desc = connection error: dial tcp 10.0.0.2:50000: connect: refused\n"
    )
    group = patched.format("10.0.0.1") + answer + down + patched.format("10.0.0.3") + answer
    assert config_diff(group) == ["@@ -17,6 +17,8 @@", "         modules:", "+        - name: nvidia"]
    refused = (
        patched.format("10.0.0.1")
        + "1 error occurred:\n\t* 10.0.0.1: rpc error: code = InvalidArgument desc = "
        "1 error occurred:\n\t* v1alpha1.Config: unknown machine type\n"
    )
    shown = config_diff(refused + patched.format("10.0.0.3") + answer)
    assert shown[0].startswith("patched ") and shown[-1].endswith("unknown machine type"), shown
    assert not any("10.0.0.3" in line for line in shown), "the first node's answer only"
    result = StepResult(step="config-patch", applied=False)
    result.nodes = [NodeResult("a", "10.0.0.1", status="planned")]
    result.data["groups"] = [{"nodes": ["a"], "patch": PATCH, "dry_run": refused}]
    assert "unknown machine type</pre>" in render_html(result)


def test_cluster_output_is_escaped() -> None:
    result = StepResult(step="verify", applied=False)
    result.nodes = [NodeResult("n1", "10.0.0.1", status="failed", message="<script>alert(1)</script>")]
    html = render_html(result)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_plan_and_apply_are_told_apart() -> None:
    plan = render_html(fleet(10, 0))
    assert "plan only: nothing changed" in plan
    applied = StepResult(step="config-patch", applied=True)
    applied.nodes = [NodeResult("a", "10.0.0.1", status="changed")]
    assert "applied" in render_html(applied) and "plan only" not in render_html(applied)


def test_markdown_has_the_same_essentials() -> None:
    md = render_markdown(fleet(), limit=20)
    assert md.startswith("### config-patch: failed")
    assert "**Failing nodes (3)**" in md and "fix: `talosctl -n 10.0.3.247 version`" in md
    assert md.count("| gpu-") == 20 and "980 more in the record." in md
    assert md.count("```diff") == 1


def test_failure_text_carries_the_diagnosis_for_the_error_cell() -> None:
    text = failure_text(fleet(100, 8), limit=5)
    assert text.startswith("config-patch: failed")
    # eight nodes alike but for their own address in the fix: one block (review: the fleet case printed five)
    names = "gpu-0092, gpu-0093, gpu-0094, gpu-0095, gpu-0096, gpu-0097, gpu-0098, gpu-0099"
    assert f"  {names} (8 nodes): cannot read the machine config\n" in text, text
    assert "fix: talosctl -n <node> version" in text and "more failing nodes" not in text, text
    single = failure_text(fleet(100, 1), limit=5)
    assert "gpu-0099 (10.0.0.99): cannot read the machine config" in single
    assert "fix: talosctl -n 10.0.0.99 version" in single, "one node: its own address"


def test_alike_failures_are_said_once_with_their_nodes_and_count() -> None:
    """250 nodes a rollback refused for the same reason printed five alike blocks and "245 more failing nodes",
    which hid whether the rest failed alike (stop 47's note); a node that failed otherwise still gets its own."""
    result = StepResult(step="rollback", applied=False)
    for i in range(251):
        node = NodeResult(node=f"gpu-{i:04d}", address=f"10.0.{i // 250}.{i % 250}", status="failed")
        node.message = "refused: the machine config could not be read" if i else "refused: moved"
        node.checks.append(
            Check("rollback evidence", False, node.message, fix="name the record that changed it")
        )
        result.nodes.append(node)
    text = failure_text(result, limit=5)
    assert "  gpu-0000 (10.0.0.0): refused: moved\n" in text, text
    alike = "  gpu-0001, gpu-0002, gpu-0003, gpu-0004, gpu-0005, gpu-0006, gpu-0007, gpu-0008 and 242 more (250 nodes): "
    assert f"{alike}refused: the machine config could not be read\n" in text, text
    assert text.count("name the record that changed it") == 2 and "more failing nodes" not in text, text


def verified_fleet(size: int = 1000) -> StepResult:
    """A verify result as the step stores it: 1,000 identical nodes but one with an older Talos and one down."""
    same = NodeInventory(
        talos="v1.12.7",
        schematic="ef35b8d5b5f2a0ef8dbc0b3bd1e0f2fb3e4e2d9e1d2b8c1c0a4f1a1b6f5c4d3e",
        extensions=(("nvidia-open-gpu-kernel-modules-lts", "570.172.08-v1.12.7"),),
        modules=(("nvidia", "Live"), ("nvidia_uvm", "Live")),
        driver="570.172.08",
        gpus=(Gpu("AD104GL [L4]", 23034),),
    )
    result = StepResult(step="verify", applied=False)
    inventories = {}
    for i in range(size):
        name = f"gpu-{i:04d}"
        result.nodes.append(
            NodeResult(node=name, address=f"10.0.{i // 250}.{i % 250}", message="all checks passed")
        )
        inventories[name] = same
    inventories["gpu-0007"] = NodeInventory(**{**vars(same), "talos": "v1.12.6 <b>"})
    del inventories["gpu-0009"]
    result.node("gpu-0009").status = "failed"
    result.data["inventory"] = [g.to_dict() for g in group_inventory(inventories)]
    result.data["inventory_sources"] = dict(SOURCES)
    return result


def test_verify_shows_what_it_checked_with_identical_nodes_on_one_line() -> None:
    html = render_html(verified_fleet())
    section = html[html.index("What was checked") :]
    assert "998 nodes: Talos v1.12.7, schematic ef35b8d5b5f2…" in section
    assert "modules live, driver 570.172.08, 1× AD104GL [L4] 22.5 GiB" in section
    assert "gpu-0007: Talos v1.12.6 &lt;b&gt;" in section  # the node that differs, named and escaped
    assert (
        "1 node(s) are not in this list: they did not answer" in section
        and "talosctl get pcidevices" in section
    )
    assert section.count("<li>") == 2


def test_verify_inventory_in_markdown() -> None:
    md = render_markdown(verified_fleet(10))
    assert "- 8 nodes: Talos v1.12.7" in md and "- gpu-0007: Talos v1.12.6" in md
    assert "Sources: talos: talosctl version" in md


#: What the image step's failed upgrade carries: the start of what the real talosctl v1.12.0 printed for simnode's
#: upgrade-fails scenario (``runbook run --set simulation.scenario=upgrade-fails --apply``, 6 Dec 2026). The
#: node line quotes the check's message after "talosctl upgrade failed: ".
UPGRADE_ERROR = (
    "sequence: upgrade action: NOOP error: [code: sequence failed: error running phase 9 in upgrade sequence: "
    'task 1/1: failed, task "upgrade" failed: exit code 1 message: FATAL]\n'
    "error: sequence error: sequence failed: error running phase 9 in upgrade sequence: task 1/1: failed\n"
    "1 error(s) occurred:\n\tsequence error: sequence failed"
)


def test_a_check_the_node_line_already_quotes_is_not_printed_twice() -> None:
    """Found by an operator walkthrough: a failed upgrade printed talosctl's whole error block twice, once in the
    node's line and again as its ``upgrade`` check, pushing the fix below the terminal's fold."""
    result = StepResult(step="image", applied=True)
    node = NodeResult(node="gpu-worker-3", address="10.5.0.13", status="failed")
    node.message = f"talosctl upgrade failed: {UPGRADE_ERROR}"
    node.checks.append(Check("upgrade", False, UPGRADE_ERROR, fix="talosctl -n 10.5.0.13 dmesg"))
    node.checks.append(Check("boot", False, "not back after 600 s", fix="talosctl -n 10.5.0.13 health"))
    result.nodes.append(node)
    # the notebook's table lists every node's line once more, by design: the failing nodes' section is checked
    for text in (failure_text(result), render_markdown(result).split("| node |")[0]):
        assert text.count("1 error(s) occurred") == 1, text
        assert "talosctl -n 10.5.0.13 dmesg" in text and "not back after 600 s" in text
        assert "talosctl -n 10.5.0.13 health" in text
        assert "fix (upgrade): " in text and "(as in the node's line)" not in text  # filler (walkthrough)


def test_a_check_whose_message_is_only_part_of_another_is_still_printed_whole() -> None:
    """Review of eb42958: a substring match dropped a short message the node's line holds by accident, and a
    check with no fix disappeared."""
    result = StepResult(step="cuda-test", applied=True)
    node = NodeResult(node="gpu-1", address="10.5.0.11", status="failed")
    node.message = "pod ended Failed: CUDA driver too old"
    node.checks += [
        Check("nvidia-smi", False, "pod ended Failed", fix="kubectl describe node gpu-1"),
        Check(
            "vectoradd", False, "pod ended Failed: CUDA driver too old", fix="talosctl -n 10.5.0.11 upgrade"
        ),
        Check("gpu", False, "Failed"),
    ]
    result.nodes.append(node)
    text = failure_text(result)
    assert "    nvidia-smi: pod ended Failed\n" in text and "    gpu: Failed" in text, text
    assert "    fix (vectoradd): talosctl -n 10.5.0.11 upgrade" in text and "vectoradd:" not in text, text


def test_a_failure_with_no_failing_node_points_at_the_step_s_check_not_at_nodes() -> None:
    """A step stopped by a cluster-level check (helm list refused, no node touched) ended with "hint: see the
    failing nodes above", above which no node was (operator walkthrough, 6 Dec 2026)."""

    cluster = StepResult(step="kubernetes", applied=False)
    cluster.checks.append(Check("kubernetes layer", False, "helm list -A failed"))
    assert failure_hint(cluster) == "see the step's failed check above for the cause and the fix"
    nodes = StepResult(step="verify", applied=False)
    nodes.nodes.append(
        NodeResult(node="gpu-1", address="10.0.0.1", status="failed", message="failed: modules")
    )
    assert failure_hint(nodes) == "see the failing nodes above for the cause and the fix"


def test_talosctl_s_quoted_lines_stay_inside_the_node_s_block() -> None:
    """Operator walkthrough (6 Dec 2026): in ``stopped at image:`` talosctl's quoted lines (``error: sequence
    error: …``, as talos@v1.12.0's tracker prints a node's failure) were printed flush left inside the indented
    node block, where they read as the report's own lines. They are indented under the node's line, and the
    terminal's compaction still counts them as that line's quote."""
    from runbook_lib.notebook.record_content import compact_failure

    result = StepResult(step="image", applied=True)
    node = NodeResult(node="gpu-worker-3", address="10.5.0.13", status="failed")
    node.message = f"talosctl upgrade failed: {UPGRADE_ERROR}\n" + "\n".join(f"line {i}" for i in range(30))
    # a fix stays as written: its heredoc ends only at a flush-left EOF (review of 7 Dec 2026)
    heredoc = "cat > p.yaml <<EOF\nmachine: {}\nEOF\ntalosctl -n 10.5.0.13 patch mc --patch @p.yaml"
    node.checks.append(Check("boot", False, "not back", fix=heredoc))
    result.nodes.append(node)
    lines = failure_text(result).splitlines()
    block = lines[lines.index(next(x for x in lines if x.startswith("  gpu-worker-3 (10.5.0.13): "))) :]
    message = block[: block.index("    boot: not back")]
    assert all(x.startswith("  ") for x in message), message
    assert any(x.startswith("      error: sequence error: sequence failed: error running") for x in block), (
        block
    )
    fix = ["    fix: cat > p.yaml <<EOF", "machine: {}", "EOF", heredoc.splitlines()[-1]]
    assert block[-4:] == fix, block
    compacted = compact_failure(lines)
    assert compacted[-5:] == ["    boot: not back", *fix], compacted
    assert "    (the tool's output: in the record)" in compacted and "      line 29" not in compacted, (
        compacted
    )


def test_a_stopped_steps_report_is_never_cut_inside_a_fixs_here_document() -> None:
    """Review of 7470dc3: the report keeps 16 lines of a failed step's diagnosis; cut between a fix's
    ``<<'EOF'`` and its ``EOF``, the pasted fix waits for input and what is typed next becomes the patch."""
    from runbook_lib.notebook.record_content import STOPPED_LINES_MAX, cut_failure

    head = [f"  gpu-{i} (10.0.0.{i}): failed" for i in range(STOPPED_LINES_MAX - 3)]
    fix = ["    fix: talosctl -n 10.0.0.9 patch mc --patch @- <<'EOF'", "machine:", "  kernel: {}", "EOF"]
    shown = cut_failure([*head, *fix, "  gpu-9 (10.0.0.9): failed"])
    assert shown == head, shown  # the fix goes whole: the record holds it
    closed = [*head[:-2], *fix, "more"]
    assert cut_failure(closed) == closed[:STOPPED_LINES_MAX], "a fix that ends within the limit stays"
    plain = [f"line {i}" for i in range(40)]
    assert cut_failure(plain) == plain[:STOPPED_LINES_MAX]
    # review of c62d224: a diagnosis that fits is never cut, and only a fix's lines open a here-document
    short = ["summary", "  node: near <<EOF in the patch", "    reachable: no", "    fix: talosctl dmesg"]
    assert cut_failure(short) == short
    quoted = [f"      {i} << shift; grep x <<< y" for i in range(STOPPED_LINES_MAX + 4)]
    assert cut_failure(quoted) == quoted[:STOPPED_LINES_MAX]
    escaped = [*head, "    fix: cat > p.yaml <<\\EOF", "machine:", "  kernel: {}", "EOF", "more"]
    assert cut_failure(escaped) == head
    # a check whose message the node's line said prints its fix alone, named by the check (walkthrough, stop 53)
    named = [
        *head,
        "    fix (modules patch): talosctl -n 10.0.0.9 patch mc --patch @- <<'EOF'",
        *fix[1:],
        "more",
    ]
    assert cut_failure(named) == head


def test_compaction_keeps_a_fixs_here_document_whole() -> None:
    """Review of 7470dc3: a two-space line in a fix's patch (``  kernel: {}``) read as a new block to the
    compaction, which kept 3 of its lines and replaced the rest with "(the tool's output: in the record)"."""
    from runbook_lib.notebook.record_content import STOPPED_LINES_MAX, compact_failure

    quoted = [f"{CONTINUATION}line {i}" for i in range(STOPPED_LINES_MAX)]
    modules = [f"        - name: {m}" for m in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")]
    patch = ["machine:", "  kernel:", "      modules:", *modules, "EOF"]
    lines = [
        "  gpu-1 (10.0.0.1): failed",
        *quoted,
        "    modules: missing",
        "    fix: talosctl patch <<'EOF'",
        *patch,
    ]
    compacted = compact_failure(lines)
    assert compacted[-len(patch) - 1 :] == ["    fix: talosctl patch <<'EOF'", *patch], compacted
