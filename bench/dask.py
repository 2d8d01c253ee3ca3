"""The distributed solve against the single process: ``python -m bench --dask [--n 200000] [--workers 2]``
(or ``python -m bench.dask``).

Each row runs in a fresh process: the single-process NumPy solve (``sdot.optimal_transport_plan``)
or ``sdot.dask.solve`` on a ``LocalCluster(n_workers=W, threads_per_worker=1, memory_limit=6 GiB)``
started in that process (its start-up not timed), on the points and targets of ``python -m bench``
(uniform points of :func:`bench.solve.points`; "box" the uniform density, "gauss" the 64x64
reference image; in 3D "box3d" the uniform cube, "gauss3d" the 32^3 voxel Gaussian). Columns: Newton
steps, conjugate-gradient iterations per step (dask; the mode "daskT" says T tiles), halo growths, wall time, W2^2 and its relative
difference to the single-process row, residual, peak resident memory (the client's; for dask each
worker's, ``ru_maxrss``), bytes moved during the solve (dask: every byte written to a TCP comm by
the client, the scheduler, the nannies and the workers, counted in
``distributed.comm.tcp.TCP.write`` of each process: actor calls and their results, task transfers,
heartbeats), and the dask solve's wall time by phase and the tiles' summed busy time by kind
(seconds).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

from .solve import SPATIAL, points, target_values


def _count_tcp_writes():
    """Count the bytes written to TCP comms in this process (``distributed.comm.tcp.TCP.write``
    returns them); returns the count so far."""
    from distributed.comm import tcp

    if not hasattr(tcp, "_bench_bytes_written"):
        tcp._bench_bytes_written = 0
        original = tcp.TCP.write

        async def write(self, msg, serializers=None, on_error="message"):
            n = await original(self, msg, serializers, on_error)
            tcp._bench_bytes_written += n
            return n
        tcp.TCP.write = write
    return tcp._bench_bytes_written


def _child(args):
    import sdot

    sdot.driver.framework = "numpy"
    dim = 3 if args.target in SPATIAL else 2
    X = points(args.n, dim=dim)
    grid = sdot.Grid(target_values(args.target))
    if args.mode == "single":
        sdot.distance(sdot.SumOfDiracs(points(100, shift=1, dim=dim)), grid)     # imports, first-use costs
        start = time.perf_counter()
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=args.tol)
        row = dict(time=time.perf_counter() - start, steps=int(plan.iterations), w2=float(plan.distance),
                   residual=float(plan.residual), rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    else:
        import dask
        import dask.array as da
        import distributed

        import sdot.dask

        # the workers' statistical profiler samples every thread's stack each 10 ms: 25% of a
        # solve's time at 2e4 (docs/dask.md)
        dask.config.set({"distributed.worker.profile.enabled": False})

        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, memory_limit="6GiB",
                                      dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
            Xd = da.from_array(X, chunks=(-(-args.n // (4 * args.workers)), dim)).persist()
            distributed.wait(Xd)
            client.run(_count_tcp_writes)
            before = _count_tcp_writes() + sum(client.run(_count_tcp_writes).values())
            start = time.perf_counter()
            halo = {} if args.halo is None else dict(halo=args.halo)
            sol = sdot.dask.solve(Xd, grid, client=client, tol=args.tol, tiles_per_worker=args.tiles_per_worker, **halo)
            seconds = time.perf_counter() - start
            moved = _count_tcp_writes() + sum(client.run(_count_tcp_writes).values()) - before
            rss = sorted(client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024).values())
            tiles = [t.timings().result() for t in sol.tiles]
        row = dict(time=seconds, steps=sol.iterations, cg=sol.cg_iterations, growths=sol.halo_growths,
                   n_tiles=len(sol.tiles),
                   w2=sol.distance, residual=sol.residual, rss=rss, moved=moved,
                   phases={k: round(v, 2) for k, v in sol.timings.items()},
                   tiles={k: round(sum(t.get(k, 0.0) for t in tiles), 2) for k in tiles[0]})
    print(json.dumps(row))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench --dask", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[200_000])
    parser.add_argument("--targets", nargs="+", default=["box", "gauss"], choices=["box", "gauss", "box3d", "gauss3d"])
    parser.add_argument("--halo", type=float, default=None,
                        help="first halo width (sdot.dask.solve's default if unset)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--tiles-per-worker", type=int, default=None,
                        help="default: sdot.dask.solve's (2, more for tiles of at most 250,000 Diracs)")
    parser.add_argument("--modes", nargs="+", default=["single", "dask"], choices=["single", "dask"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.n = args.n[0]
        return _child(args)
    print(f"{'target':6} {'N':>8} {'mode':6} {'steps':>5} {'CG/step':>8} {'grow':>4} {'time (s)':>8} "
          f"{'W2^2':>22} {'rel diff':>8} {'residual':>9} {'RSS (MB)':>11} {'MB moved':>9}  phases")
    for target in args.targets:
        for n in args.n:
            reference = None
            for mode in args.modes:
                command = [sys.executable, "-m", "bench.dask", "--child", "--mode", mode, "--target", target,
                           "--n", str(n), "--workers", str(args.workers), "--tol", str(args.tol)]
                if args.tiles_per_worker is not None:
                    command += ["--tiles-per-worker", str(args.tiles_per_worker)]
                if args.halo is not None:
                    command += ["--halo", str(args.halo)]
                out = subprocess.run(command, capture_output=True, text=True)
                if out.returncode:
                    print(f"{target:6} {n:>8} {mode:6} failed: {out.stderr.strip().splitlines()[-1]}", flush=True)
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                reference = row["w2"] if mode == "single" else reference
                diff = f"{abs(row['w2'] - reference) / reference:8.1e}" if reference and mode != "single" else " " * 8
                cg = f"{np.mean(row['cg']):8.1f}" if "cg" in row else " " * 8
                grow = f"{row['growths']:>4}" if "growths" in row else " " * 4
                rss = "/".join(f"{r:.0f}" for r in np.atleast_1d(row["rss"]))
                mode_name = f"dask{row['n_tiles']}" if "n_tiles" in row else mode
                moved = f"{row['moved'] / 1e6:9.1f}" if "moved" in row else " " * 9
                print(f"{target:6} {n:>8} {mode_name:6} {row['steps']:>5} {cg} {grow} {row['time']:8.2f} {row['w2']:22.15e} "
                      f"{diff} {row['residual']:9.2e} {rss:>11} {moved}  {row.get('phases', '')} "
                      f"{row.get('tiles', '')}",
                      flush=True)


if __name__ == "__main__":
    main()
