"""One row of the bench with the package index's C++ solver, in another Python.

``PYTHON bench/peer.py --target box3d --n 10000 --tol 1e-8`` prints one JSON row, the same
fields as a row of :mod:`bench.solve`: the C++ ``sdot`` (``pip install sdot``, a compiled
solver that uses the import name ``sdot`` too, hence its own environment) on the bench's own
points and target (:func:`solve.points`, :func:`solve.target_values`), timed after a warm-up
solve of 100 other points (its kernels compile on the first solve of a new environment, about
20 s, and are cached). ``python -m bench --peer PYTHON`` runs it beside each row.

Run as a script from any directory: this file's folder is then first on ``sys.path``, so
``import sdot`` finds the C++ package, not this repository's.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

import solve as bench         # bench/solve.py: the points and targets (it imports only numpy here)


def target_of(sdot, name, mass=1.0):
    """The C++ solver's distribution for the bench target ``name``, of total ``mass``."""
    values = bench.target_values(name)
    if np.all(values == values.flat[0]):          # a uniform density on the unit square / cube
        return sdot.Box(nb_dims=values.ndim, target_mass=mass)
    if name in bench.BERNSTEIN:
        p = bench.BERNSTEIN[name]
        return sdot.Image(values, degree=p, target_mass=mass)
    return sdot.Image(values, target_mass=mass)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--mass", type=float, default=1.0, help="the target's mass (above 1: partial transport)")
    parser.add_argument("--periodic", action="store_true", help="on the torus (periodicity=True)")
    args = parser.parse_args(argv)
    periodic = dict(periodicity=True) if args.periodic else {}
    import sdot

    if not hasattr(sdot, "ot_solve"):
        raise SystemExit(f"the sdot imported from {sdot.__file__} is not the C++ solver of the package index")
    dim = 3 if args.target in bench.SPATIAL else 2
    target = target_of(sdot, args.target, args.mass)
    start = time.perf_counter()
    sdot.ot_solve(sdot.SumOfDiracs(bench.points(bench.WARMUP, shift=1, dim=dim)), target, tol=args.tol,
                  on_failure="ignore", **periodic)
    warmup = time.perf_counter() - start
    x = bench.points(args.n, dim=dim)
    start = time.perf_counter()
    plan = sdot.ot_solve(sdot.SumOfDiracs(x), target, tol=args.tol, on_failure="ignore", **periodic)
    wall = time.perf_counter() - start
    stats = plan.stats
    print(json.dumps(dict(target=args.target, n=args.n, backend="C++ sdot", steps=int(stats.get("nb_iter", -1)),
                          residual=float(stats.get("residual", float("nan"))), w2=float(plan.cost), time=wall,
                          rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, compile=None,
                          warmup=warmup, converged=bool(plan.converged),
                          **{p: None for p in bench.PHASES})))


if __name__ == "__main__":
    sys.exit(main())
