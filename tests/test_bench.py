"""The benchmark's choice of a row among repeated runs (``python -m bench --repeat K``), its
hard cases, and the GPU table (``python -m bench.gpu``)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository's bench/

from bench.solve import _format, _median_run  # noqa: E402


def _run(time, steps=5):
    return dict(target="box", n=10000, backend="numpy", steps=steps, residual=1e-9, w2=1e-4,
                time=time, rss=100.0, compile=None)


def test_median_run_is_a_whole_run_of_median_time():
    runs = [_run(0.40, steps=6), _run(0.30, steps=5), _run(0.35, steps=4)]
    row = _median_run(runs)
    assert (row["time"], row["steps"]) == (0.35, 4)       # the run's own fields, not mixed
    assert row["spread"] == (0.30, 0.40, 3)
    assert "median of 3: 0.30 to 0.40 s" in _format(row)


def test_median_run_skips_failures_and_keeps_a_single_run_plain():
    failed = dict(target="box", n=10000, backend="numpy", error="timeout after 1 s")
    row = _median_run([failed, _run(0.5), _run(0.2)])
    assert row["time"] == 0.2                              # the lower median of two
    assert row["spread"] == (0.2, 0.5, 2)
    assert "spread" not in _median_run([_run(0.3)])
    assert _median_run([failed]) is failed


def test_hard_cases_are_the_issues_inputs():
    """``python -m bench.hard``: each case is a valid problem of the kind it names."""
    import numpy as np

    from bench.hard import CASES, case

    for name in CASES:
        x, w, img, domain = case(name)
        assert x.ndim == 2 and x.shape[1] == 2 and np.all(np.isfinite(x))
        assert img.min() >= 0 and img.sum() > 0
        assert w is None or (w.shape == (len(x),) and w.min() > 0)
    assert np.max(case("far")[0]) == 1e6
    assert len(np.unique(case("repeated")[0], axis=0)) == 40
    on_sides = case("boundary")[0]
    assert np.all(np.min(np.minimum(on_sides, 1 - on_sides), axis=1) == 0) and len(np.unique(on_sides, axis=0)) == 400
    x, _, _, (lo, hi) = case("shifted")
    assert np.all((x >= lo) & (x <= hi))
    bridge = case("bridge")[2]
    assert bridge[24:40, 32].all() and not bridge[24:40, 31].any()     # one pixel wide


def test_hard_case_row_in_this_process(sdot_driver):
    """One row of the hard-case table: a converged solve (repeated Diracs, NumPy)."""
    from bench.hard import _row, run_one

    row = run_one("numpy", "repeated")
    assert row["converged"] and row["residual"] <= 1e-10 and row["steps"] >= 1
    assert _row(row).startswith("| repeated | numpy | ")


def test_gpu_table_refuses_without_a_gpu_and_runs_the_gpu_route_on_the_cpu(sdot_driver, capsys):
    """``python -m bench.gpu``: no GPU here, so status 2 and a message saying so; a row of
    ``--cpu`` (the GPU's route on the CPU, torch) is a converged solve."""
    pytest.importorskip("torch")
    from bench.gpu import _line, main, run

    assert main(["--frameworks", "torch"]) == 2
    assert "no GPU here" in capsys.readouterr().err
    row = run("torch", 2, 50, cpu=True)
    assert sdot_driver.host is False and row["steps"] >= 1 and row["warm"] > 0 and row["peak"] is None
    assert _line(row).split()[:4] == ["torch", "2", "50", str(row["steps"])]


def test_solve_rows_run_with_their_phase_timers():
    """``python -m bench`` (a fresh process per row, the phases timed by wrapping the core's
    functions): a 2D and a 3D row converge and print their phases (a moved function, whose
    timer then fails, once broke every row)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "bench", "--n", "300", "--backends", "numpy", "--targets", "box",
                           "box3d"], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "failed" not in done.stdout, done.stdout + done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["box"], ["box3d"])]
    assert [r[:3] for r in rows] == [["box", "300", "numpy"], ["box3d", "300", "numpy"]], done.stdout
    for r in rows:
        assert float(r[4]) <= 1e-8 and all(float(v) >= 0 for v in r[8:12]), r     # residual, the four phases
