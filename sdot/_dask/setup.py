"""From a dask array of positions to the tile actors on the workers, and their halos.

The k-d cuts come from a strided sample of the positions (at most ``SAMPLE`` rows move to
the client); each chunk is split by tile on its worker and each tile gathers its pieces
where its actor lives (the tiles of a worker are neighbours in the k-d order: fewer halo
rows cross workers). Positions never pass through the client.
"""
from __future__ import annotations

import math

import numpy as np

from . import tiling
from .cg import gathered

#: Rows of the positions sampled for the k-d cuts.
SAMPLE = 200_000


def checked(positions):
    """``positions`` a dask array ``(n, 2)`` of known chunk sizes, one chunk along axis 1:
    clear errors otherwise (before any solve)."""
    import dask.array as da

    if not isinstance(positions, da.Array):
        raise TypeError(f"positions must be a dask array, got {type(positions).__name__}")
    if positions.ndim != 2:
        raise ValueError(f"positions must have shape (n, d), got a dask array of {positions.ndim} dimensions")
    if any(math.isnan(c) for c in positions.chunks[0]):
        raise ValueError("positions have unknown chunk sizes (nan); call positions.compute_chunk_sizes() first")
    if positions.shape[1] != 2:
        raise NotImplementedError(f"the dask solve runs in 2D for now, got positions of dimension {positions.shape[1]}")
    if positions.shape[0] == 0:
        raise ValueError("positions: no Diracs")
    return positions.astype(np.float64).rechunk({1: 2})


def _split(chunk, offset, total, lo, hi):
    """The chunk's rows ``(positions, global ids, masses)`` per tile (a task on its worker)."""
    if not np.all(np.isfinite(chunk)):
        raise ValueError("positions contain nan or inf values")
    owner = tiling.tile_of(chunk, lo, hi)
    ids = offset + np.arange(chunk.shape[0])
    mass = np.full(chunk.shape[0], 1.0 / total)
    return [(chunk[owner == t], ids[owner == t], mass[owner == t]) for t in range(lo.shape[0])]


def _piece(split, t):
    return split[t]


def tiles_on_workers(client, positions, density, centre, scale, tiles_per_worker, aggregate_size, first_width):
    """The tile actors (a list, in k-d order) and their rectangles in normalised coordinates."""
    from dask import delayed

    from .tile import Tile

    info = client.scheduler_info()["workers"]
    workers = sorted(info)
    n = positions.shape[0]
    levels = max(0, math.ceil(math.log2(max(1, tiles_per_worker * len(workers)))))
    stride = max(1, n // SAMPLE)
    lo, hi, _ = tiling.kd_tiles(positions[::stride].compute(), levels)
    blocks = positions.to_delayed().ravel()
    offsets = np.concatenate([[0], np.cumsum(positions.chunks[0])[:-1]])
    splits = client.compute([delayed(_split)(b, int(o), n, lo, hi) for b, o in zip(blocks, offsets)])
    count = lo.shape[0]
    where = [workers[t * len(workers) // count] for t in range(count)]
    box_lo, box_hi = (lo - centre) / scale, (hi - centre) / scale
    futures = []
    for t in range(count):
        pieces = [client.submit(_piece, s, t, workers=[where[t]], pure=False) for s in splits]
        futures.append(client.submit(Tile, t, box_lo[t], box_hi[t], centre, scale, density, n, aggregate_size,
                                     info[where[t]]["nthreads"], *pieces, actor=True, workers=[where[t]]))
    tiles = [f.result() for f in futures]
    sizes = gathered([t.sizes() for t in tiles])
    offsets = np.concatenate([[0], np.cumsum([s[1] for s in sizes])])
    gathered([t.set_offset(int(o), box_lo, box_hi, first_width) for t, o in zip(tiles, offsets[:-1])])
    return tiles, box_lo, box_hi, int(offsets[-1]), [s[0] for s in sizes]


def with_halos(tiles, box_lo, box_hi, which, levels, first_width):
    """Give each tile ``k`` of ``which`` the halo of its level in ``levels`` (the width
    ``first_width * 2^level``): the Diracs of every tile whose rectangle is that close (all
    requests at once)."""
    widths = [first_width * 2.0 ** level for level in levels]
    near = {k: [s for s in range(len(tiles))
                if s != k and tiling.box_gap(box_lo[s], box_hi[s], box_lo[k], box_hi[k]) <= w]
            for k, w in zip(which, widths)}
    pieces = gathered([tiles[s].halo_for(k, level) for k, level in zip(which, levels) for s in near[k]])
    calls, start = [], 0
    for k, level in zip(which, levels):
        calls.append(tiles[k].set_halo(list(zip(near[k], pieces[start:start + len(near[k])])), level))
        start += len(near[k])
    gathered(calls)
