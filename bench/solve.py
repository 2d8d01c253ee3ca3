"""Time full solves: ``python -m bench [--n 1000 10000] [--backends numpy torch jax] [--targets box gauss] [--repeat 5]``.

One row per (target, N, backend), each run in a fresh process (clean peak
memory, no shared caches): Newton steps, final residual (max absolute
cell-mass error, masses normalised to 1), W2^2, wall time of one solve from
the Voronoi start, peak resident memory, and where the time went (neighbour
queries and triangulations on the host, cells, integrals, linear solves; eager backends only:
JAX runs the whole solve as one compiled program). JAX is timed after a
warm-up solve of the same shapes (its compile time is printed apart); NumPy and
torch after a warm-up solve of 100 other Diracs, which imports the modules the
solver loads on first use (scipy.spatial, scipy.sparse.linalg: about 0.25 s, printed apart).
With ``--repeat K``, each row runs in K fresh processes and the run of median time is
printed, with the fastest and slowest times: one run on a shared machine can be 20% off.

Points are uniform in the unit square: ``default_rng(2003)`` for N = 1e3 and
``2004`` for 1e4 (the reference cases), ``2000 + log10 N`` otherwise; in the unit cube for
the 3D targets (``default_rng(3003)`` at 1e3, the reference case box3d-1e3, ``3000 + log10 N``
otherwise): the uniform density ("box3d") and a 32^3 Gaussian voxel image ("gauss3d",
``0.2 + exp(-|c - m|^2 / (2 0.15^2))`` at the voxel centres ``c``). Targets:
the uniform density ("box"), the 64x64 Gaussian image of the reference cases
("gauss"), and 64x64 images that are 0 outside a shape (:func:`target_values`): an
annulus ("annulus"), two separate discs ("blobs"), the square of the reference case
square0-2d ("square0") and two squares joined by a one-pixel bridge ("bridge", as bench.hard's),
and a Gaussian ring ``exp(-(|c - m| - 0.3)^2 / (2 0.05^2))`` ("ring"); and Bernstein grids of degree 1 and 2 ("bern1", "bern2", a
``PolynomialGrid`` of 64x64 cells): the Gaussian of "gauss" sampled at each cell's control
points ``(i + k0 / p, j + k1 / p) / 64``, its Bernstein coefficients (positive, smooth across
cells); "spline1" is ``SplineGrid(continuity=1)`` of the "gauss" image (a degree-2 grid). If ``pysdot`` is importable, it is timed on the same points (not on "bern1", "bern2").
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
IMAGE = HERE.parent / "tests" / "data" / "image_gauss64.npy"
PHASES = ("neighbours", "cells", "integrals", "linear solve")
#: Diracs of the eager backends' warm-up solve (its time, mostly imports, printed apart).
WARMUP = 100


#: The 3D targets (the others are 2D).
SPATIAL = ("box3d", "gauss3d")
#: The targets of Bernstein coefficients: their degree.
BERNSTEIN = {"bern1": 1, "bern2": 2}
SPLINES = {"spline1": 1}              # SplineGrid(continuity=1) of the "gauss" image's 64x64 values


def points(n, shift=0, dim=2):
    """The Diracs: uniform in the unit square (cube in 3D)."""
    if dim == 3:
        seed = {1000: 3003}.get(n, 3000 + round(math.log10(n)))
        return np.random.default_rng(seed + shift).random((n, 3))
    seed = {1000: 2003, 10000: 2004}.get(n, 2000 + round(math.log10(n)))
    return np.random.default_rng(seed + shift).random((n, 2))


def target_values(name):
    """The target's pixel values: "box" (1x1), "gauss" (the reference image), or a 64x64
    image of 1 on a shape, 0 elsewhere (pixel centres ``c``): "annulus" ``0.2 < |c - m| <
    0.4`` (``m`` the centre of the square), "blobs" ``|c - (0.28, 0.3)| < 0.15`` or ``|c -
    (0.72, 0.7)| < 0.15``, "square0" ``[20:40, 20:40]`` (the reference case square0-2d)."""
    if name == "box":
        return np.ones((1, 1))
    if name == "box3d":
        return np.ones((1, 1, 1))
    if name == "gauss3d":
        c = (np.arange(32) + 0.5) / 32
        x, y, z = np.meshgrid(c, c, c, indexing="ij")
        return 0.2 + np.exp(-((x - 0.5) ** 2 + (y - 0.5) ** 2 + (z - 0.5) ** 2) / (2 * 0.15 ** 2))
    if name == "gauss" or name in SPLINES:
        return np.load(IMAGE)
    if name in BERNSTEIN:
        p = BERNSTEIN[name]
        at = (np.arange(64)[:, None] + np.arange(p + 1)[None, :] / p) / 64       # (cell, k): control points
        x, y = at[:, None, :, None], at[None, :, None, :]
        gauss = 0.2 + np.exp(-((x - 0.5) ** 2 + (y - 0.5) ** 2) / (2 * 0.15 ** 2))
        return gauss.reshape(64, 64, (p + 1) ** 2)
    c = (np.arange(64) + 0.5) / 64
    x, y = np.meshgrid(c, c, indexing="ij")
    if name == "annulus":
        r2 = (x - 0.5) ** 2 + (y - 0.5) ** 2
        return ((r2 > 0.2 ** 2) & (r2 < 0.4 ** 2)).astype(float)
    if name == "blobs":
        return (((x - 0.28) ** 2 + (y - 0.3) ** 2 < 0.15 ** 2) | ((x - 0.72) ** 2 + (y - 0.7) ** 2 < 0.15 ** 2)).astype(float)
    if name == "square0":
        img = np.zeros((64, 64))
        img[20:40, 20:40] = 1.0
        return img
    if name == "bridge":
        img = np.zeros((64, 64))
        img[8:24, 20:44] = img[40:56, 20:44] = 1.0
        img[24:40, 32] = 1.0
        return img
    if name == "ring":
        return np.exp(-(np.sqrt((x - 0.5) ** 2 + (y - 0.5) ** 2) - 0.3) ** 2 / (2 * 0.05 ** 2))
    raise ValueError(f"unknown target {name!r}: box, gauss, annulus, blobs, square0, box3d, gauss3d, bern1, bern2 or spline1")


def to_backend(name, a):
    if name == "torch":
        import torch

        return torch.from_numpy(a)
    if name.startswith("jax"):
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)     # else jnp.asarray rounds FP64 inputs to FP32
        return jnp.asarray(a)
    return a


def _instrument(totals):
    """Wrap the core's phases with wall-clock timers (eager backends)."""
    from sdot._core import newton, planar, seed_neighbours, spatial
    from sdot._core.planar import integrate
    from sdot._core.spatial import integrate as voxels

    def timed(module, name, phase, inner=()):
        fn = getattr(module, name)
        depth = [0]                                # a recursive call (a retry) is counted once

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            before = {p: totals[p] for p in inner}
            depth[0] += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                totals[phase] += time.perf_counter() - start - sum(totals[p] - before[p] for p in inner)
            return out
        setattr(module, name, wrapper)

    timed(seed_neighbours, "knn", "neighbours")
    timed(seed_neighbours, "delaunay_neighbours", "neighbours")
    timed(seed_neighbours, "regular_neighbours", "neighbours")
    timed(seed_neighbours, "regular_rings", "neighbours")
    timed(seed_neighbours, "regular_cell_combinatorics", "neighbours")
    timed(seed_neighbours, "nearest", "neighbours")
    timed(planar, "power_cells", "cells", inner=("neighbours",))
    timed(spatial, "power_cells", "cells", inner=("neighbours",))
    timed(integrate, "cell_integrals", "integrals")
    timed(integrate, "bernstein_cell_integrals", "integrals")
    timed(voxels, "cell_integrals", "integrals")
    timed(newton, "newton_direction", "linear solve")


def run_one(backend, target, n, tol):
    """One row, in this process: a dict of measurements."""
    import sdot

    jitted = backend.startswith("jax-jit")
    sdot.driver.framework = "jax" if jitted else backend
    sdot.driver.jit_route = "compiled" if backend == "jax-jit-compiled" else "callback"
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    totals = dict.fromkeys(PHASES, 0.0)
    if not jitted:
        _instrument(totals)
    values = to_backend(backend, target_values(target))
    g = (sdot.PolynomialGrid(values) if target in BERNSTEIN else
         sdot.SplineGrid(values, continuity=SPLINES[target]) if target in SPLINES else sdot.Grid(values))

    def eager_plan(x):
        return sdot.optimal_transport_plan(sdot.SumOfDiracs(x), g, tol=tol)
    plan_of = eager_plan
    dim = 3 if target in SPATIAL else 2
    if jitted:                      # under jax.jit (eager JAX solves on the host)
        import jax
        from types import SimpleNamespace

        run = jax.jit(lambda x: {k: getattr(eager_plan(x), k) for k in ("distance", "iterations", "residual")})
        plan_of = lambda x: SimpleNamespace(**run(x))       # noqa: E731

    def solve(x):
        plan = plan_of(to_backend(backend, x))
        float(plan.distance)                       # wait for the result
        return plan

    compile_time = warmup = None
    start = time.perf_counter()
    if jitted:
        solve(points(n, shift=1, dim=dim))         # same shapes, other points: compiles
        compile_time = time.perf_counter() - start
    else:
        solve(points(WARMUP, shift=1, dim=dim))    # imports scipy.spatial etc., starts the threads
        warmup = time.perf_counter() - start
        totals.update(dict.fromkeys(PHASES, 0.0))
    start = time.perf_counter()
    plan = solve(points(n, dim=dim))
    wall = time.perf_counter() - start
    return dict(target=target, n=n, backend=backend, steps=int(plan.iterations),
                residual=float(plan.residual), w2=float(plan.distance), time=wall,
                rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                compile=compile_time, warmup=warmup, **({} if jitted else totals))


def run_pysdot(target, n, tol):
    """The same solve with pysdot (C++), if importable; None otherwise."""
    try:
        from pysdot import OptimalTransport
        from pysdot.domain_types import ScaledImage
    except ImportError:
        return None
    if target in SPATIAL or target in BERNSTEIN or target in SPLINES:
        return None
    x = points(n)
    values = target_values(target)
    start = time.perf_counter()
    ot = OptimalTransport(x, np.ones(n) / n, ScaledImage([0, 0], [1, 1], values.T / values.mean()))
    ot.max_mass_error = tol
    ot.adjust_weights()
    wall = time.perf_counter() - start
    return dict(target=target, n=n, backend="pysdot", steps=-1, residual=float("nan"),
                w2=float(ot.transport_cost() if hasattr(ot, "transport_cost") else float("nan")),
                time=wall, rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, compile=None)


def _child(args):
    row = run_pysdot(args.target, args.n, args.tol) if args.backend == "pysdot" else \
        run_one(args.backend, args.target, args.n, args.tol)
    print(json.dumps(row))


def _spawn(backend, target, n, tol, timeout):
    cmd = [sys.executable, "-m", "bench.solve", "--child", "--backend", backend, "--target", target,
           "--n", str(n), "--tol", str(tol)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(target=target, n=n, backend=backend, error=f"timeout after {timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return dict(target=target, n=n, backend=backend, error=proc.stderr.strip().splitlines()[-1:])
    return json.loads(lines[-1])


def _median_run(runs):
    """The run of median time (the lower one of an even count) among those that did not
    fail, with ``spread``: the fastest and slowest times and the count; the first run if
    all failed."""
    done = sorted((r for r in runs if "error" not in r), key=lambda r: r["time"])
    if not done:
        return runs[0]
    row = dict(done[(len(done) - 1) // 2])
    if len(runs) > 1:
        row["spread"] = (done[0]["time"], done[-1]["time"], len(done))
    return row


def _spawn_peer(python, target, n, tol, timeout, mass=1.0, periodic=False):
    """A row of the C++ solver (bench/peer.py) run by the interpreter ``python``, in a
    directory of its own (so that ``import sdot`` is the C++ package there); ``mass``: the
    target's (above 1: partial transport); ``periodic``: on the torus."""
    import tempfile

    cmd = [python, str(HERE / "peer.py"), "--target", target, "--n", str(n), "--tol", str(tol), "--mass", str(mass)]
    cmd += ["--periodic"] if periodic else []
    with tempfile.TemporaryDirectory() as cwd:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                                  env=dict(os.environ, PYTHONPATH=""))
        except subprocess.TimeoutExpired:
            return dict(target=target, n=n, backend="C++ sdot", error=f"timeout after {timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return dict(target=target, n=n, backend="C++ sdot", error=proc.stderr.strip().splitlines()[-1:])
    return json.loads(lines[-1])


def _format(row, reference=None):
    if "error" in row:
        return f"{row['target']:6} {row['n']:8d} {row['backend']:8}  failed: {row['error']}"
    split = " ".join(f"{row[p]:6.2f}" if row.get(p) is not None else "     -" for p in PHASES)
    extra = f"  compile {row['compile']:.1f} s" if row.get("compile") else ""
    extra += f"  warm-up {row['warmup']:.2f} s" if row.get("warmup") else ""
    extra += "  NOT CONVERGED" if row.get("converged") is False else ""
    if row.get("spread"):
        low, high, count = row["spread"]
        extra += f"  median of {count}: {low:.2f} to {high:.2f} s"
    ratio = f"  ratio {row['time'] / reference:.2f}" if reference else ""
    return (f"{row['target']:6} {row['n']:8d} {row['backend']:8} {row['steps']:5d} {row['residual']:9.1e} "
            f"{row['w2']:.12e} {row['time']:8.2f} {row['rss']:8.0f}   {split}{extra}{ratio}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax", "jax-jit"],
                        help="jax: eager JAX arrays (solved on the host); jax-jit: under jax.jit, the NumPy "
                             "core by a host callback; jax-jit-compiled: under jax.jit, the compiled solve")
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"],
                        choices=["box", "gauss", "annulus", "blobs", "square0", "bridge", "ring", "box3d", "gauss3d", "bern1",
                                 "bern2", "spline1"])
    parser.add_argument("--tol", type=float, default=1e-8,
                        help="max absolute cell-mass error (default 1e-8, as the C++ reference runs)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes per row; the run of median time is printed (default 1)")
    parser.add_argument("--peer", metavar="PYTHON",
                        help="a Python whose `import sdot` is the package index's C++ solver: each row is run "
                             "there too (bench/peer.py), in the same sitting, and each of ours gets its ratio")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.child:
        args.n = args.n[0]
        return _child(args)
    print(f"{'target':6} {'N':>8} {'backend':8} {'steps':>5} {'residual':>9} {'W2^2':>18} "
          f"{'time (s)':>8} {'RSS (MB)':>8}   {'neighb':>6} {'cells':>6} {'integr':>6} {'solve':>6}")
    for target in args.targets:
        for n in args.n:
            rows = [_median_run([_spawn(b, target, n, args.tol, args.timeout) for _ in range(args.repeat)])
                    for b in args.backends]
            if args.peer:
                peer = _median_run([_spawn_peer(args.peer, target, n, args.tol, args.timeout)
                                    for _ in range(args.repeat)])
            else:
                peer = _spawn("pysdot", target, n, args.tol, args.timeout)
            reference = peer.get("time") if "error" not in peer else None
            for row in rows:
                print(_format(row, reference), flush=True)
            if reference:
                print(_format(peer), flush=True)


if __name__ == "__main__":
    main()
