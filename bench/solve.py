"""Time full solves: ``python -m bench [--n 1000 10000] [--backends numpy torch jax] [--targets box gauss]``.

Prints one row per (target, N, backend): Newton steps, final residual (max
absolute cell-mass error), W2^2, wall time of the solve from the Voronoi
start, and the peak resident memory of the process. Points are uniform in
the unit square (``default_rng(2003)`` for N = 1e3 and ``2004`` for 1e4, as in
the reference cases; ``2000 + log10 N`` otherwise). Each backend is warmed up
once on a small problem of the same target first (JAX compiles its kernels).
"""
from __future__ import annotations

import argparse
import math
import resource
import time
from pathlib import Path

import numpy as np

import sdot

HERE = Path(__file__).resolve().parent
IMAGE = HERE.parent / "tests" / "data" / "image_gauss64.npy"


def points(n):
    seed = {1000: 2003, 10000: 2004}.get(n, 2000 + round(math.log10(n)))
    return np.random.default_rng(seed).random((n, 2))


def target_values(name):
    return np.ones((1, 1)) if name == "box" else np.load(IMAGE)


def to_backend(name, a):
    if name == "torch":
        import torch

        return torch.from_numpy(a)
    if name == "jax":
        import jax.numpy as jnp

        return jnp.asarray(a)
    return a


def run(backend, target, n, tol):
    sdot.driver.framework = backend
    x = to_backend(backend, points(n))
    g = sdot.Grid(to_backend(backend, target_values(target)))
    start = time.perf_counter()
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), g, tol=tol)
    wall = time.perf_counter() - start
    return int(plan.iterations), float(plan.residual), float(plan.distance), wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax"])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"])
    parser.add_argument("--tol", type=float, default=1e-10)
    args = parser.parse_args(argv)
    if "torch" in args.backends:
        import torch

        torch.set_num_threads(1)
    if "jax" in args.backends:
        import jax

        jax.config.update("jax_enable_x64", True)
    print(f"{'target':6} {'N':>8} {'backend':8} {'steps':>5} {'residual':>10} {'W2^2':>22} "
          f"{'time (s)':>9} {'peak RSS (MB)':>13}")
    for target in args.targets:
        for backend in args.backends:
            run(backend, target, 200, args.tol)                       # warm-up
            for n in args.n:
                steps, res, w, wall = run(backend, target, n, args.tol)
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"{target:6} {n:8d} {backend:8} {steps:5d} {res:10.2e} {w:22.16e} "
                      f"{wall:9.2f} {rss:13.0f}", flush=True)


if __name__ == "__main__":
    main()
