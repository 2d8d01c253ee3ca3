"""From dask arrays of positions (and masses) to the tile actors on the workers, their
halos, and their rebuild after a lost worker.

The k-d cuts come from a strided sample of the positions (at most ``SAMPLE`` rows move to
the client); each chunk is split by tile on its worker and each tile gathers its pieces
where its actor lives (the tiles of a worker are neighbours in the k-d order: fewer halo
rows cross workers). Positions never pass through the client.

Faults: an actor dies with its worker. The client keeps the owned weights of every tile
after each accepted Newton step (:attr:`TileSet.checkpoint`); when a call finds an actor's
worker lost (:func:`lost_worker`), :meth:`TileSet.rebuild` places new actors on the live
workers (the same rectangles; positions and masses recomputed from the input's graph if
their chunks died too) and gives them the checkpointed weights: the step is redone.

Each tile also restores glibc's heap thresholds in its worker (:func:`.tile.heap_for_temporaries`).
"""
from __future__ import annotations

import math
import time

import numpy as np

from . import dimensions, tiling
from .cg import gathered

#: Rows of the positions sampled for the k-d cuts.
SAMPLE = 200_000
#: Seconds a rebuild waits for restarted workers (a nanny restarts a killed worker in about
#: one second) before it places the tiles on the survivors.
RESTART_WAIT = 10.0


#: Largest tile (owned Diracs) that the default tile count allows (:func:`tile_levels`): a
#: tile's diagram is built in one call, whose temporaries (about 1.8 KB per Dirac, beyond the
#: 0.5 KB its diagram keeps) come on top of what the worker's tiles hold (docs/dask.md).
MAX_TILE = 250_000


def tile_levels(n, workers, tiles_per_worker=None):
    """The depth of the k-d cuts, ``2^depth >= tiles_per_worker * workers`` tiles for ``n``
    Diracs; ``tiles_per_worker`` None: 2, or more so that a tile has at most :data:`MAX_TILE`."""
    if tiles_per_worker is None:
        tiles_per_worker = max(2, math.ceil(n / (workers * MAX_TILE)))
    elif not (isinstance(tiles_per_worker, (int, np.integer)) and tiles_per_worker >= 1):
        raise ValueError(f"tiles_per_worker must be a positive integer or None, got {tiles_per_worker!r}")
    return max(0, math.ceil(math.log2(max(1, tiles_per_worker * workers))))


def checked(positions):
    """``positions`` a dask array ``(n, d)`` (``d`` 2 or 3) of known chunk sizes, one chunk along
    axis 1: clear errors otherwise (before any solve)."""
    import dask.array as da

    if not isinstance(positions, da.Array):
        raise TypeError(f"positions must be a dask array, got {type(positions).__name__}")
    if positions.ndim != 2:
        raise ValueError(f"positions must have shape (n, d), got a dask array of {positions.ndim} dimensions")
    if any(math.isnan(c) for c in positions.chunks[0]):
        raise ValueError("positions have unknown chunk sizes (nan); call positions.compute_chunk_sizes() first")
    dim = dimensions.checked(positions.shape[1])
    if positions.shape[0] == 0:
        raise ValueError("positions: no Diracs")
    return positions.astype(np.float64).rechunk({1: dim})


def checked_masses(masses, positions):
    """The masses of the Diracs (a dask or NumPy array ``(n,)``, or None: equal masses) as a
    dask array chunked like ``positions``, and their total (computed now: it normalises them)."""
    import dask.array as da

    if masses is None:
        return None, float(positions.shape[0])
    if not isinstance(masses, da.Array):
        masses = np.asarray(masses, dtype=np.float64)
        if masses.ndim == 1 and masses.shape[0] == positions.shape[0]:
            masses = da.from_array(masses, chunks=(positions.chunks[0],))
    if masses.ndim != 1 or masses.shape[0] != positions.shape[0]:
        raise ValueError(f"masses must have shape ({positions.shape[0]},) (one per Dirac), got {masses.shape}")
    if any(math.isnan(c) for c in masses.chunks[0]):
        raise ValueError("masses have unknown chunk sizes (nan); call masses.compute_chunk_sizes() first")
    masses = masses.astype(np.float64).rechunk((positions.chunks[0],))
    total, smallest = (float(v) for v in da.compute(masses.sum(), masses.min()))
    if not (math.isfinite(total) and smallest >= 0 and total > 0):
        raise ValueError("masses must be finite, >= 0 and not all zero")
    return masses, total


def lost_worker(exc):
    """Whether ``exc`` (raised by an actor call or a task) says a worker died: its actors
    and their state are gone, the tiles must be rebuilt."""
    from distributed.scheduler import KilledWorker

    return (isinstance(exc, (OSError, KilledWorker))
            or isinstance(exc, RuntimeError) and "Actor was lost" in str(exc))


def _split(chunk, masses, offset, total, lo, hi):
    """The chunk's rows ``(positions, global ids, masses)`` per tile (a task on its worker);
    ``masses`` the chunk's raw masses (None: equal), ``total`` their sum over every chunk."""
    if not np.all(np.isfinite(chunk)):
        raise ValueError("positions contain nan or inf values")
    owner = tiling.tile_of(chunk, lo, hi)
    ids = offset + np.arange(chunk.shape[0])
    mass = np.full(chunk.shape[0], 1.0 / total) if masses is None else masses / total
    return [(chunk[owner == t], ids[owner == t], mass[owner == t]) for t in range(lo.shape[0])]


def _piece(split, t):
    return split[t]


class TileSet:
    """The tile actors of one solve (``tiles``, in k-d order), their rectangles ``box_lo``,
    ``box_hi`` (normalised coordinates), owned counts ``sizes`` and ``n_aggregates``, and the
    ``checkpoint``: each tile's owned weights after the last accepted Newton step (None
    before the first). ``rebuilds`` counts the rebuilds after lost workers. ``diagram``: the
    tiles' :class:`sdot._core.options.DiagramOptions`."""

    def __init__(self, client, positions, masses, total, density, centre, scale, tiles_per_worker,
                 aggregate_size, first_width, diagram):
        self.diagram = diagram
        self.client, self.positions, self.masses, self.total = client, positions, masses, total
        self.density, self.centre, self.scale = density, centre, scale
        self.aggregate_size, self.first_width = aggregate_size, first_width
        self.workers = len(live_workers(client))
        n = positions.shape[0]
        levels = tile_levels(n, self.workers, tiles_per_worker)
        self.lo, self.hi, _ = tiling.kd_tiles(positions[::max(1, n // SAMPLE)].compute(), levels)
        self.box_lo, self.box_hi = (self.lo - centre) / scale, (self.hi - centre) / scale
        self.checkpoint, self.rebuilds, self.tiles = None, -1, []
        self.rebuild()

    def rebuild(self):
        """New actors on the live workers (after waiting up to :data:`RESTART_WAIT` s for as
        many as at the start), with the checkpointed weights; their halos are to be set."""
        from dask import delayed
        from distributed import TimeoutError

        from .tile import Tile

        client, n = self.client, self.positions.shape[0]
        self.tiles, self.rebuilds = [], self.rebuilds + 1
        if self.rebuilds:
            try:
                client.wait_for_workers(self.workers, timeout=RESTART_WAIT)
            except TimeoutError:
                pass
        info = live_workers(client)
        workers = sorted(info)
        blocks = self.positions.to_delayed().ravel()
        mass_blocks = self.masses.to_delayed().ravel() if self.masses is not None else [None] * len(blocks)
        offsets = np.concatenate([[0], np.cumsum(self.positions.chunks[0])[:-1]])
        splits = client.compute([delayed(_split)(b, m, int(o), self.total, self.lo, self.hi)
                                 for b, m, o in zip(blocks, mass_blocks, offsets)])
        count = self.lo.shape[0]
        where = [workers[t * len(workers) // count] for t in range(count)]
        futures = []
        for t in range(count):          # loose restrictions: a worker may have died since
            pieces = [client.submit(_piece, s, t, workers=[where[t]], allow_other_workers=True, pure=False)
                      for s in splits]
            futures.append(client.submit(Tile, t, self.box_lo[t], self.box_hi[t], self.centre, self.scale,
                                         self.density, n, self.aggregate_size, info[where[t]]["nthreads"], self.diagram,
                                         *pieces,
                                         actor=True, workers=[where[t]], allow_other_workers=True))
        tiles = [f.result() for f in futures]
        sizes = gathered([t.sizes() for t in tiles])
        offsets = np.concatenate([[0], np.cumsum([s[1] for s in sizes])])
        gathered([t.set_offset(int(o), self.box_lo, self.box_hi, self.first_width) for t, o in zip(tiles, offsets[:-1])])
        if self.checkpoint is not None:
            gathered([t.set_weights(psi) for t, psi in zip(tiles, self.checkpoint)])
        self.tiles, self.n_aggregates, self.sizes = tiles, int(offsets[-1]), [s[0] for s in sizes]


def live_workers(client, timeout=RESTART_WAIT):
    """The scheduler's workers (address -> info), at least one.

    ``Client.scheduler_info()`` returns its cache when the scheduler does not answer in time,
    and that cache lists no workers: ask again for up to ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = client.scheduler_info()["workers"]
        if info:
            return info
        if time.monotonic() > deadline:
            raise RuntimeError(f"sdot.dask: the cluster has no live worker (waited {timeout:g} s)")
        time.sleep(0.2)


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
