"""Latency of sdot under ``jax.jit``: ``python -m bench.jit_latency [--n 10000 100000] [--targets box gauss]
[--routes callback compiled numpy]``.

Each (route, target, N) runs in a fresh process (the JAX import and sdot's first-use imports
are printed apart, as ``import``) and times, in this order, with the points of
:func:`bench.solve.points` and the targets of :func:`bench.solve.target_values`, ``tol`` 1e-8:

- ``first``: the first call of ``jax.jit(w2)`` (``w2(x) = sdot.distance(SumOfDiracs(x), grid)``),
  compile and run;
- ``steady``: a second call, other points of the same N (no compilation);
- ``new N``: a call at ``N' = round(1.03 N)`` (a new shape: compiles again);
- ``vg first``: the first call of ``jax.jit(jax.value_and_grad(w2))`` at N;
- ``vg steady``: its second call, other points.

Routes: ``callback`` and ``compiled`` are ``sdot.driver.jit_route``; ``numpy`` times the same
calls without JAX (``sdot.driver.framework = "numpy"``: ``w2``, and for ``vg`` the plan and the
position gradient ``2 m (x - b)``), after a warm-up solve of 100 Diracs.
"""
from __future__ import annotations

import argparse
import json
import time

from bench.children import child_row

COLUMNS = ("import", "first", "steady", "new N", "vg first", "vg steady")


def run(route, target, n, tol=1e-8):
    """One row, in this process."""
    start = time.perf_counter()
    import numpy as np

    import sdot
    from bench.solve import points, target_values

    row = dict(route=route, target=target, n=n)
    values = target_values(target)
    if route == "numpy":
        sdot.driver.framework = "numpy"
        grid = sdot.Grid(values)

        def w2(x):
            return sdot.distance(sdot.SumOfDiracs(x), grid, tol=tol)

        def value_and_grad(x):
            plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), grid, tol=tol)
            return plan.distance, 2.0 / len(x) * (x - plan.barycenters)
        w2(points(100, shift=7))
        row["import"] = time.perf_counter() - start
        block = lambda out: out                    # noqa: E731 (NumPy returns when done)
    else:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        sdot.driver.framework, sdot.driver.jit_route = "jax", route
        grid = sdot.Grid(jnp.asarray(values))

        def distance(x):
            return sdot.distance(sdot.SumOfDiracs(x), grid, tol=tol)
        w2, value_and_grad = jax.jit(distance), jax.jit(jax.value_and_grad(distance))
        row["import"] = time.perf_counter() - start
        block = jax.block_until_ready

    def timed(fn, x):
        start = time.perf_counter()
        out = block(fn(x))
        return time.perf_counter() - start, out

    row["first"], value = timed(w2, points(n, shift=1))
    row["steady"], value = timed(w2, points(n))
    row["new N"], _ = timed(w2, points(round(1.03 * n), shift=2))
    row["vg first"], _ = timed(value_and_grad, points(n, shift=3))
    row["vg steady"], _ = timed(value_and_grad, points(n, shift=4))
    row["w2"] = float(value)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.jit_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"])
    parser.add_argument("--routes", nargs="+", default=["callback", "compiled", "numpy"],
                        choices=["callback", "compiled", "numpy"])
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)     # internal: route, target, N in a child
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run(args.one[0], args.one[1], int(args.one[2]))))
        return
    print(f"{'target':6} {'N':>7} {'route':9} " + " ".join(f"{c:>9}" for c in COLUMNS) + "   W2^2 (s)")
    for target in args.targets:
        for n in args.n:
            for route in args.routes:
                row, why = child_row(["bench.jit_latency", "--one", route, target, str(n)], args.timeout)
                if row is None:
                    print(f"{target:6} {n:7d} {route:9} {why}", flush=True)
                    continue
                print(f"{target:6} {n:7d} {route:9} " + " ".join(f"{row[c]:9.2f}" for c in COLUMNS)
                      + f"   {row['w2']:.12e}", flush=True)


if __name__ == "__main__":
    main()
