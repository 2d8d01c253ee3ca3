"""Time the backward pass of the barycentres: ``python -m bench.plan_gradients [--n 10000 100000]
[--targets box gauss] [--backends numpy torch jax]``.

One row per (target, N, backend), each in a fresh process: the forward solve (as in
``python -m bench``: the same points and targets, tol 1e-10), then the gradient of
``sum(c * barycenters)`` with respect to the positions (``c`` random): torch ``backward()``,
eager JAX ``jax.vjp`` (concrete arrays: the host path), NumPy :meth:`sdot.OtPlan.vjp`. The
backward is one implicit differentiation: the facet moments of the density, one sparse solve
with the Newton matrix, the transpose products. Times are the best of ``--repeat`` runs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .solve import HERE, points, target_values


def run_one(backend, target, n, repeat):
    import sdot

    sdot.driver.framework = backend
    x_np, img_np = points(n), target_values(target)
    c_np = np.random.default_rng(1).normal(size=x_np.shape)
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
        x, img, c = (torch.from_numpy(a) for a in (x_np, img_np, c_np))

        def forward():
            xs = x.clone().requires_grad_()
            return xs, sdot.barycenters(sdot.SumOfDiracs(xs), sdot.Grid(img))

        def backward(out):
            xs, b = out
            (b * c).sum().backward()
            return xs.grad
    elif backend == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
        x, img, c = (jax.numpy.asarray(a) for a in (x_np, img_np, c_np))

        def forward():
            return jax.vjp(lambda p: sdot.barycenters(sdot.SumOfDiracs(p), sdot.Grid(img)), x)

        def backward(out):
            return jax.block_until_ready(out[1](c)[0])
    else:
        def forward():
            return sdot.optimal_transport_plan(sdot.SumOfDiracs(x_np), sdot.Grid(img_np))

        def backward(plan):
            return plan.vjp(barycenters=c_np)["positions"]
    backward(forward())                     # imports, first-use costs
    t_forward, t_backward = [], []
    for _ in range(repeat):                 # a fresh solve each time: nothing kept from the last backward
        start = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        backward(out)
        t_forward.append(middle - start)
        t_backward.append(time.perf_counter() - middle)
    t_forward, t_backward = min(t_forward), min(t_backward)
    return dict(backend=backend, target=target, n=n, forward=t_forward, backward=t_backward)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.plan_gradients", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"])
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax"])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        backend, target, n = args.child
        print(json.dumps(run_one(backend, target, int(n), args.repeat)))
        return
    print(f"{'target':7} {'N':>7} {'backend':8} {'forward':>8} {'backward':>9}  backward/forward")
    for target in args.targets:
        for n in args.n:
            for backend in args.backends:
                proc = subprocess.run([sys.executable, "-m", "bench.plan_gradients", "--child", backend, target, str(n),
                                       "--repeat", str(args.repeat)], capture_output=True, text=True, cwd=HERE.parent)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                if not lines:
                    print(f"{target:7} {n:7d} {backend:8} failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                r = json.loads(lines[-1])
                print(f"{target:7} {n:7d} {backend:8} {r['forward']:8.3f} {r['backward']:9.3f}  "
                      f"{r['backward'] / r['forward']:.2f}", flush=True)


if __name__ == "__main__":
    main()
