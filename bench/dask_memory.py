"""Where a tile's memory goes: ``python -m bench.dask_memory [--n 500000] [--tiles 4]``.

Runs the distributed solve's tiles (:class:`sdot._dask.tile.Tile`) and its Newton loop
(:mod:`sdot._dask.solve`) in this one process, without dask: each actor call is a plain
call. For each kind of tile call it prints the largest rise of the resident memory during
one call above the memory before it (a sampler thread reads ``/proc/self/statm`` every
millisecond; it sees SuperLU's and Qhull's allocations too), the largest rise of NumPy's
traced memory (``tracemalloc``, with ``--trace``: slower) and, at the largest total, the
bytes held by each tile attribute (NumPy arrays and the LU factors' ``nnz``), per owned
Dirac. The points and density are those of ``python -m bench --dask`` (uniform Diracs, box).
"""
from __future__ import annotations

import argparse
import math
import os
import threading
import time
import tracemalloc

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")
#: The largest traced memory seen by the wrappers of :func:`traced_parts` (they reset the peak).
PEAK = [0]


def rss():
    """This process's resident bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Sampler(threading.Thread):
    """The largest :func:`rss` since :meth:`reset`, read every millisecond."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running, self.generation = rss(), True, 0

    def reset(self):
        self.generation += 1
        self.peak = rss()

    def run(self):
        while self.running:
            generation, value = self.generation, rss()
            if generation == self.generation:       # not a reading from before a reset
                self.peak = max(self.peak, value)
            time.sleep(0.001)


def held(obj, prefix="", seen=None, out=None):
    """``{path: bytes}`` of the NumPy arrays (and SuperLU factors, about ``8 nnz``: FP32
    values, 4-byte indices) reachable from ``obj``'s attributes, tuples, lists and dicts."""
    seen = set() if seen is None else seen
    out = {} if out is None else out
    if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bool, np.generic)):
        return out
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj if obj.base is None else obj.base
        if isinstance(base, np.ndarray) and id(base) in seen and base is not obj:
            return out
        out[prefix] = out.get(prefix, 0) + obj.nbytes
        return out
    if type(obj).__name__ == "SuperLU":
        out[prefix] = out.get(prefix, 0) + obj.nnz * 8        # FP32 values, int32 indices (about)
        return out
    if hasattr(obj, "_fields"):
        items = zip(obj._fields, obj)
    elif isinstance(obj, (tuple, list)):
        items = ((str(i), v) for i, v in enumerate(obj))
    elif isinstance(obj, dict):
        items = ((str(k), v) for k, v in obj.items())
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    elif hasattr(obj, "data") and hasattr(obj, "indices"):          # scipy sparse
        items = (("data", obj.data), ("indices", obj.indices), ("indptr", obj.indptr))
    else:
        return out
    for k, v in items:
        if k in ("density", "seconds"):
            continue
        held(v, f"{prefix}.{k}" if prefix else k, seen, out)
    return out


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class Local:
    """A tile whose calls run here, measured: per method the largest rise of the RSS and of
    NumPy's traced memory during a call, and the tile's held arrays at the call of largest RSS."""

    def __init__(self, tile, sampler, report, trace):
        self.tile, self.sampler, self.report, self.trace = tile, sampler, report, trace

    def __getattr__(self, name):
        method = getattr(self.tile, name)

        def call(*args, **kwargs):
            before = rss()
            self.sampler.reset()
            if self.trace:
                tracemalloc.reset_peak()
                traced_before, PEAK[0] = tracemalloc.get_traced_memory()[0], 0
            value = method(*args, **kwargs)
            rise = self.sampler.peak - before
            traced = max(tracemalloc.get_traced_memory()[1], PEAK[0]) - traced_before if self.trace else 0
            row = self.report.setdefault(name, dict(calls=0, rss_rise=0, traced_rise=0, n=0))
            row["calls"] += 1
            key, amount = ("traced_rise", traced) if self.trace else ("rss_rise", rise)
            row["rss_rise"] = max(row["rss_rise"], rise)
            if amount >= row[key]:
                row.update({key: amount}, n=self.tile.seeds.shape[0], m=self.tile.local_seeds.shape[0],
                           held=held(self.tile))
            return Done(value)
        return call


class LocalTiles:
    """:class:`sdot._dask.setup.TileSet` without dask: ``count`` tiles in this process."""

    def __init__(self, X, density, centre, scale, count, aggregate_size, first_width, sampler, report, trace):
        from sdot._dask import setup, tiling
        from sdot._dask.tile import Tile

        levels = max(0, math.ceil(math.log2(count)))
        lo, hi, _ = tiling.kd_tiles(X, levels)
        self.box_lo, self.box_hi = (lo - centre) / scale, (hi - centre) / scale
        pieces = setup._split(X, None, 0, float(X.shape[0]), lo, hi)
        raw = [Tile(t, self.box_lo[t], self.box_hi[t], centre, scale, density, X.shape[0], aggregate_size, 1,
                    pieces[t]) for t in range(lo.shape[0])]
        sizes = [t.sizes() for t in raw]
        offsets = np.concatenate([[0], np.cumsum([s[1] for s in sizes])])
        for t, o in zip(raw, offsets[:-1]):
            t.set_offset(int(o), self.box_lo, self.box_hi, first_width)
        self.raw = raw
        self.tiles = [Local(t, sampler, report, trace) for t in raw]
        self.checkpoint = None


def traced_parts(report):
    """Wrap the core's diagram (``planar.power_cells`` and within it the kinetic update and the
    rebuild from the triangulation) and the pixel integrals: the largest rise of the traced
    memory during one call of each, in ``report``."""
    from sdot._core import density, planar
    from sdot._core.planar import diagram, kinetic

    def wrapped(name, function):
        def call(*args, **kwargs):
            before, outer = tracemalloc.get_traced_memory()
            PEAK[0] = max(PEAK[0], outer)       # the enclosing calls' peak so far
            tracemalloc.reset_peak()
            out = function(*args, **kwargs)
            peak = tracemalloc.get_traced_memory()[1]
            PEAK[0] = max(PEAK[0], peak)
            n = args[2].shape[0] if name == "integrals" else args[1].shape[0]
            report[name] = max(report.get(name, 0.0), (peak - before) / n)
            return out
        return call
    planar.power_cells = wrapped("power_cells", planar.power_cells)
    diagram.update = wrapped("kinetic update", kinetic.update)
    diagram.rebuild = kinetic.rebuild = wrapped("rebuild (triangulation)", kinetic.rebuild)
    density.PixelDensity.integrals = wrapped("integrals", density.PixelDensity.integrals)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.dask_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500_000)
    parser.add_argument("--tiles", type=int, default=4)
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--trace", action="store_true", help="also NumPy's traced peaks (tracemalloc; slower)")
    parser.add_argument("--parts", action="store_true", help="with --trace: the core's diagram and integrals apart")
    args = parser.parse_args(argv)

    import sdot
    from sdot._core.options import DEFAULT
    from sdot._dask import solve as dsolve
    from sdot._dask.tile import Tile  # noqa: F401  (imports before the baseline)

    from .solve import points

    sdot.driver.framework = "numpy"
    X = points(args.n)
    grid = sdot.Grid(np.ones((1, 1)))
    density, centre, scale = _normalised(grid)
    parts = {}
    if args.trace:
        tracemalloc.start()
        if args.parts:
            traced_parts(parts)
    sampler = Sampler()
    sampler.start()
    report = {}
    start_rss = rss()
    width = 8.0 * math.sqrt(np.prod(density.hi - density.lo) / args.n)
    tiles = LocalTiles(X, density, centre, scale, args.tiles, 32, width, sampler, report, args.trace)
    halos = dsolve._Halos(len(tiles.tiles), width)
    clock = dsolve._Clock()
    newton = dsolve._Newton(halos, args.tol, 300, DEFAULT, None, clock)
    halos.reset(tiles)
    newton.start(tiles.tiles)
    while not newton.done:
        newton.step(tiles)
    sampler.running = False
    distance = sum(s["distance"] for s in newton.summaries) * scale * scale
    per = 1.0 / (args.n / args.tiles)
    print(f"N {args.n}, {args.tiles} tiles, {newton.it} steps, W2^2 {distance:.15e}, residual {newton.err:.2e}, "
          f"process RSS at start {start_rss / 1e6:.0f} MB, now {rss() / 1e6:.0f} MB")
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    total_held = sum(sum(held(t).values()) for t in tiles.raw)
    if args.trace:
        print("largest traced allocations alive at the end:")
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:8]:
            print(f"  {stat.size / 1e6:8.1f} MB  {stat.traceback}")
    print(f"held by all tiles at the end {total_held / 1e6:.0f} MB; process RSS after malloc_trim "
          f"{rss() / 1e6:.0f} MB")
    print(f"{'call':22} {'calls':>5} {'RSS rise/Dirac':>15} {'traced rise/Dirac':>18}  (bytes per owned Dirac)")
    for name, row in sorted(report.items(), key=lambda kv: -kv[1]["rss_rise"]):
        n = max(row["n"], 1)
        print(f"{name:22} {row['calls']:>5} {row['rss_rise'] / n:15.0f} {row['traced_rise'] / n:18.0f}")
    for name, value in parts.items():
        print(f"  inside: {name:30} traced rise {value:6.0f} B per Dirac of the tile with its halo")
    for name in ("evaluate", "start_solve", "accept", "newton_system"):
        if name not in report:
            continue
        row = report[name]
        n = max(row["n"], 1)
        parts = sorted(row["held"].items(), key=lambda kv: -kv[1])
        total = sum(v for _, v in parts)
        print(f"\nheld by a tile after its largest '{name}' ({row['n']} owned, {row['m']} with halo): "
              f"{total / n:.0f} B per owned Dirac")
        for k, v in parts:
            if v / n >= 4:
                print(f"  {k:40} {v / n:8.0f}")


def _normalised(grid):
    """The normalised density, centre and scale, as :func:`sdot.dask.solve` makes them."""
    from sdot._core.density import grid_density

    grid = grid.with_dim(2)
    lo, hi = (np.asarray(a, dtype=np.float64) for a in grid.domain)
    centre, scale = 0.5 * (lo + hi), np.max(hi - lo)
    density = grid_density(np.asarray(grid.density, dtype=np.float64), lo, hi)
    return density.normalised(centre, scale), centre, scale


if __name__ == "__main__":
    main()
