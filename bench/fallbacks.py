"""Cost of the pure array-API fallbacks on the CPU: ``python -m bench.fallbacks [--n 10000 100000]
[--modes host linear geometry all] [--timeout 900]``.

Times ``sdot.distance`` (NumPy, uniform box, the points of :func:`bench.solve.points`) with the
host paths as they are ("host": scipy's k-d tree, Qhull, the sparse factors) and with some of them
refused, as on a GPU or array_api_strict, where the core takes its pure array-API fallbacks:

- "linear": the linear solves by Jacobi-preconditioned CG (:func:`sdot._core.linear_solvers._solve_cg`)
  instead of factor-preconditioned CG; the geometry on the host;
- "geometry": k nearest neighbours by a uniform grid or blocks of brute force
  (:mod:`sdot._core.seed_neighbours`) instead of the k-d tree, and no Qhull (the first diagram
  from the nearest seeds, ``nearest_cells``; no regular triangulation for the kinetic update); the
  factors kept. The compiled cells (numba) need neither: run with ``SDOT_COMPILED=0`` for the
  array-API cells, whose neighbours these are;
- "all": both (what a GPU runs, here with NumPy's kernels on the CPU).

Each (N, mode) runs in a fresh process after a warm-up solve of 100 other Diracs (imports);
a run longer than ``--timeout`` seconds is reported as such. Prints one line per run: Newton
steps, W2^2, wall and CPU (process) time.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("host", "linear", "geometry", "all")


def refuse(mode):
    """Make the host paths of ``mode`` return None (the callers then take their fallbacks)."""
    from sdot._core import linear_solvers as linalg
    from sdot._core import seed_neighbours

    def none(*args, **kwargs):
        return None
    if mode in ("linear", "all"):
        linalg.host_callback = none
    if mode in ("geometry", "all"):
        seed_neighbours.host_callback = seed_neighbours.on_host = seed_neighbours.host_view = none


def run(n, mode):
    """One timed solve in this process: a dict."""
    import numpy as np

    import sdot
    from bench.solve import points

    sdot.driver.framework, sdot.driver.dtype = "numpy", "FP64"
    refuse(mode)
    grid = sdot.Grid(np.ones((1, 1)))
    sdot.distance(sdot.SumOfDiracs(np.random.default_rng(0).random((100, 2))), grid)      # warm-up
    x = points(n)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), grid)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return dict(n=n, mode=mode, steps=int(plan.iterations), w2=float(plan.distance), wall=wall, cpu=cpu)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)     # internal: N and mode, in a child
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run(int(args.one[0]), args.one[1])))
        return
    for n in args.n:
        for mode in args.modes:
            cmd = [sys.executable, "-m", "bench.fallbacks", "--one", str(n), mode]
            try:
                out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"N={n:>7} {mode:>9}: more than {args.timeout:.0f} s (stopped)", flush=True)
                continue
            if out.returncode:
                print(f"N={n:>7} {mode:>9}: failed\n{out.stderr[-2000:]}", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"N={n:>7} {mode:>9}: {r['steps']} steps  W2^2 {r['w2']:.12e}  wall {r['wall']:7.2f} s  "
                  f"cpu {r['cpu']:7.2f} s", flush=True)


if __name__ == "__main__":
    main()
