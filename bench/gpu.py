"""The solver on a GPU: ``python -m bench.gpu [--n 1000 10000 100000] [--dims 2 3] [--frameworks jax torch] [--cpu]``.

For each framework with a GPU (torch: ``torch.cuda``; JAX: ``jax.devices("gpu")``), each
dimension and each N, in a fresh process: the uniform box (the points of
:func:`bench.solve.points`), ``tol`` 1e-8, and

- ``steps``: Newton steps of the warm call's solve;
- ``first``: the first call of ``w2(x)``, the distance and steps of ``sdot.optimal_transport_plan`` (JAX: ``jax.jit(w2)``, compile and run; torch: eager, its kernels'
  first launch included);
- ``warm``: a second call on other points of the same N (JAX: no compilation);
- ``peak``: the device memory at its peak (torch: ``torch.cuda.max_memory_allocated``; JAX:
  ``peak_bytes_in_use`` of the device's ``memory_stats()``, where the runtime reports it).

With no GPU it says so and exits with status 2. ``--cpu`` runs the same table on the CPU with
``sdot.driver.host = False``, the GPU's route without a GPU under it (to check the script, and
what the route costs on the CPU: docs/backends.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench.children import child_row

COLUMNS = ("steps", "first", "warm", "peak")
FRAMEWORKS = ("jax", "torch")


def gpu_of(framework):
    """The name of ``framework``'s GPU, or None (also when the framework is not installed)."""
    try:
        if framework == "torch":
            import torch

            return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        import jax

        devices = jax.devices("gpu")
        return str(devices[0]) if devices else None
    except (ImportError, RuntimeError):
        return None


def run(framework, dim, n, cpu=False, tol=1e-8):
    """One row, in this process: the Newton steps, the first and warm times (s), the peak
    device memory (bytes, or None where the runtime does not report it)."""
    import numpy as np

    import sdot
    from bench.solve import points

    sdot.driver.framework = framework
    if cpu:
        sdot.driver.host = False
    values = np.ones((1,) * dim)

    def solve(x):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), grid, tol=tol)
        return plan.distance, plan.iterations
    if framework == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
        device = jax.devices("cpu" if cpu else "gpu")[0]
        grid = sdot.Grid(jax.device_put(values, device))
        w2 = jax.jit(solve)
        put, block = (lambda a: jax.device_put(a, device)), jax.block_until_ready
    else:
        import torch

        device = torch.device("cpu" if cpu else "cuda")
        grid = sdot.Grid(torch.as_tensor(values, device=device))
        w2 = solve
        put = lambda a: torch.as_tensor(a, device=device)                      # noqa: E731
        block = (lambda out: out) if cpu else (lambda out: (torch.cuda.synchronize(), out)[1])

    def timed(x):
        start = time.perf_counter()
        _, steps = block(w2(put(x)))
        return time.perf_counter() - start, int(steps)

    row = dict(framework=framework, dim=dim, n=n, device=str(device))
    row["first"], _ = timed(points(n, shift=1, dim=dim))
    row["warm"], row["steps"] = timed(points(n, dim=dim))
    row["peak"] = _peak(framework, device)
    return row


def _peak(framework, device):
    if framework == "torch":
        import torch

        return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    stats = device.memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _line(row):
    peak = "-" if row["peak"] is None else f"{row['peak'] / 2**20:.0f} MiB"
    return (f"{row['framework']:6} {row['dim']:3d} {row['n']:7d} {row['steps']:5d} {row['first']:9.2f} "
            f"{row['warm']:9.2f} {peak:>10}  {row['device']}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--cpu", action="store_true", help="the GPU's route on the CPU (sdot.driver.host = False)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)     # internal: framework, dim, N in a child
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run(args.one[0], int(args.one[1]), int(args.one[2]), cpu=args.cpu)))
        return 0
    frameworks = args.frameworks if args.cpu else [f for f in args.frameworks if gpu_of(f)]
    if not frameworks:
        print("bench.gpu: no GPU here (torch.cuda.is_available() is False, jax.devices('gpu') has none, "
              f"among {', '.join(args.frameworks)}); --cpu runs the GPU's route on the CPU", file=sys.stderr)
        return 2
    print(f"{'frame':6} {'dim':>3} {'N':>7} {'steps':>5} {'first (s)':>9} {'warm (s)':>9} {'peak':>10}  device")
    for framework in frameworks:
        for dim in args.dims:
            for n in args.n:
                row, why = child_row(["bench.gpu", "--one", framework, str(dim), str(n)] + (["--cpu"] if args.cpu else []),
                                     args.timeout)
                print(_line(row) if row else f"{framework:6} {dim:3d} {n:7d} {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
