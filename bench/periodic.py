"""Periodic domains against the plane, in one process:
``python -m bench.periodic [--n 10000 100000] [--targets box gauss box3d gauss3d] [--repeat 3]``.

Each row: N Diracs uniform in the unit square or cube (:func:`.solve.points`) against the target
(:func:`.solve.target_values`) in the plane and on the torus (``metric=PeriodicMetric(Norm2(),
[1, ..., 1])``), NumPy, tolerance ``--tol`` on the cell masses: Newton steps, the best of
``--repeat`` wall times of each, and their ratio (the issue's goal: at most 1.5). ``--peer PYTHON``:
the C++ solver's periodic mode on the same points and target (:mod:`bench.peer`, its own
process), its time, our torus time over it and the relative difference of W2^2.
"""
from __future__ import annotations

import argparse
import time

import sdot
from sdot.metrics import Norm2, PeriodicMetric

from .solve import SPATIAL, _spawn_peer, points, target_values


def _timed(source, target, tol, repeat, metric=None):
    """The best wall time of ``repeat`` solves and the last plan."""
    best, plan = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        plan = sdot.optimal_transport_plan(source, target, tol=tol, metric=metric)
        best = min(best, time.perf_counter() - start)
    return best, plan


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss", "box3d"],
                        choices=["box", "gauss", "box3d", "gauss3d"])
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer", metavar="PYTHON", help="the interpreter of the C++ solver's environment")
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    for dim in (2, 3):                                  # imports, compiled kernels
        torus = PeriodicMetric(Norm2(), [1.0] * dim)
        sdot.distance(sdot.SumOfDiracs(points(100, shift=1, dim=dim)), sdot.Grid(target_values(
            "box" if dim == 2 else "box3d")), metric=torus)
    print(f"{'target':8s} {'N':>8s} {'plane':>20s} {'torus':>20s} {'ratio':>6s}"
          + ("  C++ torus     ours/C++  W2^2 rel. diff" if args.peer else ""))
    for target in args.targets:
        dim = 3 if target in SPATIAL else 2
        torus = PeriodicMetric(Norm2(), [1.0] * dim)
        grid = sdot.Grid(target_values(target))
        for n in args.n:
            source = sdot.SumOfDiracs(points(n, dim=dim))
            t_plane, plane = _timed(source, grid, args.tol, args.repeat)
            t_torus, on_torus = _timed(source, grid, args.tol, args.repeat, torus)
            line = (f"{target:8s} {n:8d} {t_plane:9.2f} s {int(plane.iterations):3d} steps "
                    f"{t_torus:9.2f} s {int(on_torus.iterations):3d} steps {t_torus / t_plane:6.2f}")
            if args.peer:
                row = _spawn_peer(args.peer, target, n, args.tol, 1800, periodic=True)
                line += (f"  {row['time']:9.2f} s {row['steps']:3d} {t_torus / row['time']:8.2f}  "
                         f"{abs(float(on_torus.distance) / row['w2'] - 1):.1e}" if "error" not in row
                         else f"  {row['error']}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
