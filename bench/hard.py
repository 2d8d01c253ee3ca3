"""The hard cases of the zero-regions issue, one fresh process per (case, backend):
``python -m bench.hard [--backends numpy torch jax] [--cases square0 annulus ...]``.

Each row: Newton steps, the max cell-mass error, W2^2, the wall time of
``optimal_transport_plan(..., tol=1e-10)`` in a fresh process (JAX: the first call, which
compiles, and a second call on the same shapes), and the status. Cases (2,000 Diracs of
``default_rng(0)`` unless said otherwise, 64x64 images on the unit square):

- ``square0``: 1 on ``[20:40, 20:40]``, 0 elsewhere (the reference case square0-2d);
- ``square1e-12``: the same square on a background of 1e-12;
- ``blobs``, ``annulus``: the bench's images (:func:`bench.solve.target_values`);
- ``bridge``: two squares ``[8:24, 20:44]`` and ``[40:56, 20:44]`` joined by a one-pixel
  row ``[24:40, 32]``, 0 elsewhere;
- ``diagonal``: ``Grid(np.eye(64))``, a one-pixel diagonal line;
- ``far``: the box density, 1,999 Diracs and one at (1e6, 1e6);
- ``boundary``: the box density, 400 distinct Diracs on the sides of the unit square;
- ``near-dup``: the box density, 200 Diracs and 20 copies moved by 1e-10;
- ``cluster``: the box density, 200 Diracs and 50 in a 1e-9-wide cluster;
- ``collinear``: the box density, 400 random Diracs on a line;
- ``repeated``: the box density, 40 Diracs each repeated 10 times;
- ``decades``: the annulus, ``SumOfWeightedDiracs`` with masses ``10 ** uniform(-6, 0)``;
- ``shifted``: square0 with the domain and the Diracs translated by 1e4;
- ``grey``: a disc of 1 (radius 0.3) on a background of 0.05, 5,000 Diracs (positive, but
  jumping by 21 at the disc's edge).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CASES = ("square0", "square1e-12", "blobs", "annulus", "bridge", "diagonal", "far", "boundary", "near-dup",
         "cluster", "collinear", "repeated", "decades", "shifted", "grey")


def case(name):
    """``(points, masses or None, image, domain or None)`` of a case."""
    from .solve import target_values

    rng = np.random.default_rng(0)
    x = rng.random((2000, 2))
    box = np.ones((1, 1))
    square = np.zeros((64, 64))
    square[20:40, 20:40] = 1.0
    if name == "square0":
        return x, None, square, None
    if name == "square1e-12":
        return x, None, np.where(square > 0, 1.0, 1e-12), None
    if name in ("blobs", "annulus"):
        return x, None, target_values(name), None
    if name == "bridge":
        img = np.zeros((64, 64))
        img[8:24, 20:44] = img[40:56, 20:44] = 1.0
        img[24:40, 32] = 1.0
        return x, None, img, None
    if name == "diagonal":
        return x, None, np.eye(64), None
    if name == "far":
        return np.concatenate([x[:1999], [[1e6, 1e6]]]), None, box, None
    if name == "boundary":
        t = rng.random(100)
        sides = [np.stack([t, 0 * t], 1), np.stack([1 + 0 * t, t], 1), np.stack([t, 1 + 0 * t], 1),
                 np.stack([0 * t, t], 1)]
        return np.concatenate(sides), None, box, None
    if name == "near-dup":
        return np.concatenate([x[:200], x[:20] + 1e-10]), None, box, None
    if name == "cluster":
        return np.concatenate([x[:200], 0.5 + 1e-9 * rng.random((50, 2))]), None, box, None
    if name == "collinear":
        t = rng.random(400)
        return np.stack([t, 0.3 + 0.4 * t], 1), None, box, None
    if name == "repeated":
        return np.repeat(x[:40], 10, axis=0), None, box, None
    if name == "decades":
        return x, 10.0 ** rng.uniform(-6, 0, 2000), target_values("annulus"), None
    if name == "shifted":
        return x + 1e4, None, square, ((1e4, 1e4), (1e4 + 1.0, 1e4 + 1.0))
    if name == "grey":
        c = (np.arange(64) + 0.5) / 64
        disc = (c[:, None] - 0.5) ** 2 + (c[None, :] - 0.5) ** 2 < 0.3 ** 2
        return np.random.default_rng(0).random((5000, 2)), None, np.where(disc, 1.0, 0.05), None
    raise ValueError(f"unknown case {name!r}: {', '.join(CASES)}")


def run_one(backend, name):
    """One row, in this process."""
    import sdot

    from .solve import to_backend

    sdot.driver.framework = backend
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    x, w, img, domain = case(name)
    src = sdot.SumOfDiracs(to_backend(backend, x)) if w is None else \
        sdot.SumOfWeightedDiracs(to_backend(backend, x), to_backend(backend, w))
    grid = sdot.Grid(to_backend(backend, img), domain=domain)

    def solve():
        start = time.perf_counter()
        plan = sdot.optimal_transport_plan(src, grid, tol=1e-10, raise_on_failure=False)
        float(plan.distance)
        return plan, time.perf_counter() - start

    plan, first = solve()
    again = solve()[1] if backend == "jax" else None
    return dict(case=name, backend=backend, steps=int(plan.iterations), residual=float(plan.residual),
                w2=float(plan.distance), time=first, again=again, converged=bool(plan.converged),
                status=int(plan.status))


def _spawn(backend, name, timeout):
    cmd = [sys.executable, "-m", "bench.hard", "--child", "--backends", backend, "--cases", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, timeout=timeout,
                              env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return dict(case=name, backend=backend, error=f"timeout after {timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return dict(case=name, backend=backend, error=(proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(lines[-1])


def _row(r):
    if "error" in r:
        return f"| {r['case']} | {r['backend']} | failed: {r['error']} | | | | |"
    t = f"{r['time']:.2f}" + (f" (again {r['again']:.2f})" if r.get("again") is not None else "")
    return (f"| {r['case']} | {r['backend']} | {r['steps']} | {t} | {r['residual']:.1e} | {r['w2']:.12g} | "
            f"{'yes' if r['converged'] else 'no, status ' + str(r['status'])} |")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.hard", description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.backends[0], args.cases[0])))
        return
    print("| case | backend | Newton steps | time (s) | residual | W2^2 | converged |")
    print("|---|---|---|---|---|---|---|")
    for name in args.cases:
        for backend in args.backends:
            print(_row(_spawn(backend, name, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
