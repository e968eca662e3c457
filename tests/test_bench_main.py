"""``make bench`` runs issue 16's benchmarks, ``make bench-full`` every one (``benchmarks/__main__.py``)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.__main__ import QUICK, selected

HERE = Path(__file__).resolve().parents[1] / "benchmarks"


def test_make_bench_runs_every_quick_script_and_bench_full_runs_them_all() -> None:
    quick = [p.stem.removeprefix("bench_") for p in selected(HERE, [], full=False)]
    assert sorted(quick) == sorted(QUICK)  # a renamed script would silently drop out of make bench
    full = selected(HERE, [], full=True)
    assert {p.name for p in full} == {p.name for p in HERE.glob("bench_*.py")} and "bench_fleet" not in quick


def test_names_pick_scripts_in_either_set() -> None:
    assert [p.stem for p in selected(HERE, ["fleet"], full=False)] == ["bench_fleet"]
    assert selected(HERE, ["no_such_bench"], full=True) == []
