"""Partial transport against the balanced solve of the same Diracs, in one process:
``python -m bench.partial [--n 10000 100000] [--targets box gauss] [--repeat 3]``.

Each row: N Diracs uniform in the unit square (``default_rng(2000 + log10 N)``, as
:mod:`bench.solve`) against the target of mass 1 (balanced) and of mass 2 (partial: each Dirac
takes its mass from its Laguerre cell cut by a ball), NumPy, tolerance 1e-10 on the cell masses:
Newton steps, the best of ``--repeat`` wall times of each, and their ratio (the issue's goal: at
most 2). Targets: "box" (uniform), "gauss" (the 64x64 Gaussian image of the reference cases), and
images of 1 on a shape, 0 elsewhere, whose Voronoi cells do not all hold mass ("square0",
"annulus", "blobs" of :func:`.solve.target_values`: the start from the balanced cells).
``--peer PYTHON``: the C++ solver's partial transport on the same points and target of mass 2
(:mod:`bench.peer`, its own process), its time, our time over it and the relative difference of W2^2.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import sdot

from .solve import _spawn_peer, points, target_values


def _timed(source, target, tol, repeat):
    """The best wall time of ``repeat`` solves and the last plan (an unconverged one too)."""
    best, plan = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            plan = sdot.optimal_transport_plan(source, target, tol=tol)
        except sdot.OtNotConverged as failure:
            plan = failure.plan
        best = min(best, time.perf_counter() - start)
    return best, plan


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"],
                        choices=["box", "gauss", "square0", "annulus", "blobs"])
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer", metavar="PYTHON", help="the interpreter of the C++ solver's environment")
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    values = {name: target_values(name) for name in args.targets + ["gauss"]}
    warm = sdot.SumOfDiracs(points(100, shift=1))
    sdot.distance(warm, sdot.Grid(values["gauss"], mass=2.0))          # imports, compiled kernels
    print(f"{'target':8s} {'N':>8s} {'balanced':>20s} {'partial (mass 2)':>20s} {'ratio':>6s}"
          + ("  C++ partial   ours/C++  W2^2 rel. diff" if args.peer else ""))
    for target in args.targets:
        for n in args.n:
            source = sdot.SumOfDiracs(points(n))
            t_bal, bal = _timed(source, sdot.Grid(values[target]), args.tol, args.repeat)
            t_par, par = _timed(source, sdot.Grid(values[target], mass=2.0), args.tol, args.repeat)
            line = (f"{target:8s} {n:8d} {t_bal:9.2f} s {int(bal.iterations):3d} steps "
                    f"{t_par:9.2f} s {int(par.iterations):3d} steps {t_par / t_bal:6.2f}"
                    + ("" if bool(par.converged) else "  (partial: not converged)"))
            if args.peer:
                row = _spawn_peer(args.peer, target, n, args.tol, 1800, mass=2.0)
                line += (f"  {row['time']:9.2f} s {row['steps']:3d} {t_par / row['time']:8.2f}  "
                         f"{abs(float(par.distance) / row['w2'] - 1):.1e}" if "error" not in row else f"  {row['error']}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
