"""Time value-and-gradient: ``python -m bench.gradients [--n 10000] [--backends numpy torch jax]``.

One row per backend, each in a fresh process: the forward solve alone, then
the value and its gradient with respect to the positions (and, separately,
to the grid values), on uniform points against the uniform density (64x64
grid of ones, so that the grid gradient has 4096 entries). JAX is timed
jitted, after a warm-up of the same shapes; its compile time is printed.
NumPy has no autodiff: its gradient time is the core's analytic gradients.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .solve import HERE, points


def _best(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run_one(backend, n, repeat):
    import sdot

    sdot.driver.framework = backend
    x_np, img_np = points(n), np.ones((64, 64))
    out = dict(backend=backend, n=n)
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
        x, img = torch.from_numpy(x_np), torch.from_numpy(img_np)

        def forward():
            return float(sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img)))

        def with_grad(wrt):
            xs = x.clone().requires_grad_(wrt == "positions")
            im = img.clone().requires_grad_(wrt == "values")
            value = sdot.distance(sdot.SumOfDiracs(xs), sdot.Grid(im))
            value.backward()
            return (xs if wrt == "positions" else im).grad
    elif backend == "jax":
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        x, img = jnp.asarray(x_np), jnp.asarray(img_np)

        def w2(p, v):
            return sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(v))
        fwd = jax.jit(w2)
        grads = {"positions": jax.jit(jax.value_and_grad(w2, argnums=0)),
                 "values": jax.jit(jax.value_and_grad(w2, argnums=1))}

        def forward():
            return float(fwd(x, img))

        def with_grad(wrt):
            return jax.block_until_ready(grads[wrt](x, img))
        for name, fn in (("compile_forward", forward), ("compile_grad", lambda: with_grad("positions"))):
            start = time.perf_counter()
            fn()
            out[name] = time.perf_counter() - start
        with_grad("values")
    else:
        from sdot import _checks
        from sdot._core import gradients, plan

        def forward():
            return float(sdot.distance(sdot.SumOfDiracs(x_np), sdot.Grid(img_np)))

        def with_grad(wrt):
            src, tgt = _checks.check_pair(sdot.SumOfDiracs(x_np), sdot.Grid(img_np))
            xp, prob = _checks.problem(src, tgt)
            res = plan.solve_plan(xp, prob, sdot.default_tolerance(), 100)
            needs = (wrt == "positions", False, wrt == "values")
            return gradients.gradients(xp, prob.seeds, prob.masses, prob.density, res["state"], needs)
    out["forward"] = _best(forward, repeat)
    out["grad_positions"] = _best(lambda: with_grad("positions"), repeat)
    out["grad_values"] = _best(lambda: with_grad("values"), repeat)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.gradients", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax"])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child, args.n, args.repeat)))
        return
    print(f"{'backend':8} {'N':>7} {'forward':>8} {'+grad y':>8} {'+grad rho':>9}  backward/forward (y, rho)")
    for backend in args.backends:
        proc = subprocess.run([sys.executable, "-m", "bench.gradients", "--child", backend, "--n", str(args.n),
                               "--repeat", str(args.repeat)], capture_output=True, text=True, cwd=HERE.parent)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            print(f"{backend:8} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(lines[-1])
        extra = (f"  compile: forward {r['compile_forward']:.1f} s, value_and_grad {r['compile_grad']:.1f} s"
                 if "compile_forward" in r else "")
        print(f"{backend:8} {r['n']:7d} {r['forward']:8.3f} {r['grad_positions']:8.3f} {r['grad_values']:9.3f}  "
              f"{r['grad_positions'] / r['forward'] - 1:+.0%}, {r['grad_values'] / r['forward'] - 1:+.0%}{extra}",
              flush=True)


if __name__ == "__main__":
    main()
