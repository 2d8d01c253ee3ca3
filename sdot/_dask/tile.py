"""One tile of the distributed solve: a dask actor that holds its Diracs, their halo, their
weights and the cells, on one worker.

The tile *owns* the Diracs of its rectangle (:mod:`.tiling`) and holds a *halo*: the Diracs
of other tiles within a width ``w0 2^level`` of the rectangle, with their weights (copies, sent by their
owners). The power diagram of owned and halo Diracs together (the NumPy core,
:func:`sdot._core.evaluation.evaluate`) gives the owned cells; they are the true cells when
:func:`.tiling.halo_certified` holds, else the client grows the halo. The owned cells give
the owned masses, W2^2's share and the owned rows of the Newton matrix
(:mod:`.tile_system`). Only weights of the halo and scalars leave a tile.

Every method runs on the tile's worker; the arrays are NumPy, in the coordinates of the
core's normalised problem (centred on the domain, divided by its longest side).
"""
from __future__ import annotations

import time

import numpy as np

from .._core import evaluation, geometry, newton_matrix
from .._host.threads import host_settings
from . import dimensions, tiling
from .tile_system import TileSystem, cells_of, kept


def _now():
    """``(wall, this thread's CPU)`` seconds."""
    return time.perf_counter(), time.thread_time()


#: Bands beyond a tile's halo whose Diracs its halo test sees by squares (the others by bands).
RING = 2


class Tile:
    """The actor of tile ``index`` of box ``[lo, hi)`` (normalised coordinates, ``d`` each: 2D or 3D).

    ``pieces``: the ``(positions, global ids, masses)`` of its Diracs, one triple per chunk
    of the input (raw coordinates, normalised here by ``centre`` and ``scale``, exactly as
    the single-process solve does). ``density``: the normalised density
    (:class:`sdot._core.density.PixelDensity`). ``aggregate_size``: Diracs per aggregate of
    the coarse space of the preconditioner. ``diagram``: the
    :class:`sdot._core.options.DiagramOptions` of its diagrams.
    """

    def __init__(self, index, lo, hi, centre, scale, density, total, aggregate_size, threads, diagram, *pieces):
        heap_for_temporaries()
        self.dim = lo.shape[0]
        positions = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros((0, self.dim))
        self.index, self.lo, self.hi, self.density, self.total = index, lo, hi, density, total
        self.threads, self.diagram = threads, diagram
        self.seeds = (positions - centre) / scale
        self.ids = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int64)
        masses = np.concatenate([p[2] for p in pieces]) if pieces else np.zeros(0)
        n = self.seeds.shape[0]
        if n:
            _, self.active, self.targets = evaluation.group_duplicates(np, self.seeds, masses)
        else:
            self.active, self.targets = np.zeros(0, bool), np.zeros(0)
        levels = max(0, int(np.round(np.log2(max(n, 1) / aggregate_size))))
        self.aggregates = tiling.kd_tiles(self.seeds, levels)[2]
        self.n_aggregates = 2 ** levels
        self.psi, self.d = np.zeros(n), np.zeros(n)
        self.factor = None
        self.seconds = {}
        self.exports = {}
        self.set_halo([], -1)

    # -- the halo -------------------------------------------------------------------

    def _spent(self, name, start):
        """Add the wall and thread CPU seconds since ``start`` (:func:`_now`) to ``name``."""
        wall, cpu = _now()
        self.seconds[name] = self.seconds.get(name, 0.0) + wall - start[0]
        self.seconds[name + " cpu"] = self.seconds.get(name + " cpu", 0.0) + cpu - start[1]

    def timings(self):
        """Seconds spent by this tile in its diagrams, trials, factorisations and the
        conjugate gradient's local work: wall (``name``) and the thread's CPU (``name cpu``)."""
        return dict(self.seconds)

    def sizes(self):
        """``(owned Diracs, aggregates)``."""
        return self.seeds.shape[0], self.n_aggregates

    def target_range(self):
        """``(smallest, largest)`` active target (``inf, -inf`` if none)."""
        t = self.targets[self.active]
        return float(np.min(t, initial=np.inf)), float(np.max(t, initial=-np.inf))

    def set_offset(self, offset, box_lo, box_hi, first_width):
        """The first global aggregate id of this tile, and the distance band of each owned
        Dirac from every tile's rectangle: band 0 within ``first_width``, band ``k`` within
        ``first_width * 2^k`` (and not ``k - 1``), the last band beyond (:data:`.tiling.BANDS`)."""
        self.aggregates = self.aggregates + offset
        self.first_aggregate = offset
        self.edges = first_width * 2.0 ** np.arange(tiling.BANDS)
        self.bands = np.stack([np.searchsorted(self.edges, tiling.distance_to_box(self.seeds, a, b), side="left")
                               for a, b in zip(box_lo, box_hi)]).astype(np.int8)

    def halo_for(self, other, level):
        """The owned Diracs within ``first_width * 2^level`` of the rectangle of tile ``other``
        (its bands up to ``level``): kept as the rows sent to it, and returned as a piece of its
        halo (positions, activity, aggregates, weights, Newton direction)."""
        rows = np.flatnonzero(self.bands[other] <= level)
        self.exports[other] = rows
        return (self.seeds[rows], self.active[rows], self.aggregates[rows], self.psi[rows], self.d[rows])

    def set_halo(self, pieces, level):
        """The halo of bands up to ``level``: ``pieces`` a list of ``(tile, piece of halo_for)``.
        The diagram is to be rebuilt (:meth:`evaluate`)."""
        self.level = level
        self.sources = [t for t, _ in pieces]
        self.counts = [p[0].shape[0] for _, p in pieces]
        parts = list(zip(*[p for _, p in pieces])) or [[np.zeros((0, self.dim))], [np.zeros(0, bool)],
                                                        [np.zeros(0, np.int64)], [np.zeros(0)], [np.zeros(0)]]
        halo_seeds, halo_active, self.halo_aggregates, self.halo_psi, self.halo_d = (np.concatenate(a) for a in parts)
        self.local_seeds = np.concatenate([self.seeds, halo_seeds])
        self.local_active = np.concatenate([self.active, halo_active])
        self.everything = self.local_seeds.shape[0] == self.total
        self.ev = None

    def send(self, name):
        """``{tile: values of the rows it holds in its halo}`` of the owned vector ``name``
        (``psi``, ``d`` or the conjugate gradient's ``z``)."""
        values = getattr(self, name) if name != "z" else self.system.z
        return {t: values[rows] for t, rows in self.exports.items()}

    def receive(self, name, pieces):
        """The halo's values of vector ``name`` from ``pieces`` ``{tile: values}``."""
        values = np.concatenate([pieces[t] for t in self.sources]) if self.sources else np.zeros(0)
        setattr(self, "halo_" + name, values)

    # -- cells and masses -------------------------------------------------------------

    def evaluate(self, tops, boxes, t=0.0, trial=False):
        """The diagram at weights ``psi + t d`` (owned and halo): its summary
        ``dict(certified, halo_ok, worst, err_max, err_sq, min_mass, distance)``.
        ``tops``: per tile and distance band from this tile's rectangle the largest weight at
        ``t``, ``boxes``: the squares just beyond the halo and their largest weights (the halo
        test, see :meth:`weights_beyond_halos`); ``trial``: a damping trial, built from the
        current diagram and abandoned at an empty cell."""
        if not self.seeds.shape[0]:             # a tile without Diracs: nothing to compute
            self.trial = (t, None) if trial else None
            return dict(certified=True, halo_ok=True, err_max=0.0, err_sq=0.0, min_mass=np.inf, worst=np.inf,
                        distance=0.0)
        psi = np.concatenate([self.psi, self.halo_psi])
        if t:
            psi = psi + t * np.concatenate([self.d, self.halo_d])
        previous = cells_of(self.ev) if trial and self.ev is not None else None
        capacity = None if self.ev is None else self.ev.cells.labels.shape[1]
        # one diagram at a time besides the one being built: a trial replaces the last one
        # (rejected), a new diagram both (the halo grew)
        self.trial = None
        if not trial:
            self.ev = None
        prob = evaluation.Problem(self.local_seeds, None, self.density)
        start = _now()
        with host_settings(threads=self.threads):
            ev = evaluation.evaluate(np, prob, psi, self.local_active, capacity=capacity, previous=previous,
                                 trial=np.asarray(True) if trial else None, diagram=self.diagram)
        self._spent("trial" if trial else "diagram", start)
        summary = self._summary(ev, psi, tops, boxes)
        if trial:
            self.trial = (t, kept(ev))
        else:
            self.ev = kept(ev)
        return summary

    def weights_beyond_halos(self, t, levels):
        """The bounds of the other tiles' halo tests (:func:`.tiling.halo_certified` and
        :func:`.tiling.boxes_certified`) at weights ``psi + t d``, for tiles of halo ``levels``:
        per tile ``T`` and distance band from its rectangle the largest weight of the owned
        active Diracs (``-inf`` where none, and for this tile itself), ``(tiles, BANDS + 1)``,
        and ``{T: (lo, hi, largest weights)}`` of the Diracs of the bands just beyond its halo
        in each square of its halo width (cube of a quarter of it in 3D, :data:`.dimensions.BOX_SIDE`;
        :func:`.tiling.box_maxima`)."""
        count = len(levels)
        out = np.full((count, tiling.BANDS + 1), -np.inf)
        boxes = {}
        if self.seeds.shape[0]:
            psi = np.where(self.active, self.psi + t * self.d if t else self.psi, -np.inf)
            slots = np.arange(count)[:, None] * (tiling.BANDS + 1) + self.bands
            np.maximum.at(out.reshape(-1), slots.reshape(-1), np.broadcast_to(psi, slots.shape).reshape(-1))
            for other, level in enumerate(levels):          # a loop over the tiles
                ring = (self.bands[other] > level) & (self.bands[other] <= level + RING) & self.active
                if other != self.index and np.any(ring):
                    boxes[other] = tiling.box_maxima(self.seeds[ring], psi[ring],
                                                     self.edges[level] * dimensions.BOX_SIDE[self.dim])
        out[self.index] = -np.inf
        return out, boxes

    def accept(self):
        """Take the last trial: the weights move to ``psi + t d``; returns the owned weights
        (the client's checkpoint)."""
        t, self.ev = self.trial
        self.psi = self.psi + t * self.d
        self.halo_psi = self.halo_psi + t * self.halo_d
        self.trial = None
        return self.psi

    def set_weights(self, psi):
        """The owned weights ``psi`` (a checkpoint, on a rebuilt tile before its halo is set)."""
        self.psi = np.asarray(psi, dtype=np.float64)

    def _summary(self, ev, psi, tops, boxes):
        n = self.seeds.shape[0]
        cells = ev.cells
        certified = bool(cells.certified) and not bool(np.any(cells.overflow))
        mass = ev.moments[:n, 0]
        halo_ok = True
        if certified and n and not self.everything:
            # every band at its least distance; the cells that fail see the first bands by boxes
            vertices, count = dimensions.vertices_in_use(cells, n)
            bands = np.max(tops, axis=0)
            ok = tiling.halo_certified(self.seeds, psi[:n], vertices, count, self.active, self.lo, self.hi,
                                       self.edges[self.level:], bands[self.level + 1:])
            rows = np.flatnonzero(~ok)
            if rows.size:
                boxes = list(boxes) + [(np.zeros((0, self.dim)), np.zeros((0, self.dim)), np.zeros(0))]
                box_lo, box_hi, top = (np.concatenate([b[i] for b in boxes]) for i in range(3))
                far = slice(self.level + RING + 1, None)
                ok[rows] = (tiling.halo_certified(self.seeds[rows], psi[rows], vertices[rows], count[rows],
                                                  self.active[rows], self.lo, self.hi, self.edges[self.level + RING:],
                                                  bands[far])
                            & tiling.boxes_certified(self.seeds[rows], psi[rows], vertices[rows], count[rows],
                                                     box_lo, box_hi, top, self.aggregates[rows]))
            halo_ok = bool(np.all(ok))
        a = self.active
        err = np.where(a, mass - self.targets, 0.0)
        return dict(certified=certified, halo_ok=halo_ok, err_max=float(np.max(np.abs(err), initial=0.0)),
                    err_sq=float(np.sum(err * err)), min_mass=float(np.min(mass[a], initial=np.inf)),
                    worst=float(np.min(mass[a] / self.targets[a], initial=np.inf)),
                    distance=float(np.sum(ev.moments[:n, -1][a])))

    def results(self):
        """``(global ids, cell masses, weights, barycentres, active)`` of the owned Diracs
        (inactive ones, duplicates and zero masses, hold no mass)."""
        n = self.seeds.shape[0]
        if not n:
            return self.ids, np.zeros(0), self.psi, self.seeds, self.active
        mom = self.ev.moments[:n]
        safe = np.where(mom[:, 0] > 0, mom[:, 0], 1.0)
        bary = self.seeds + np.where(mom[:, :1] > 0, mom[:, 1:-1] / safe[:, None], 0.0)
        return self.ids, np.where(self.active, mom[:, 0], 0.0), self.psi, bary, self.active

    # -- the Newton system --------------------------------------------------------------

    def newton_system(self):
        """The owned rows of the Newton matrix at the current diagram (kept), and the scalars
        of its regularisation and of the centring of the right-hand side:
        ``(sum of the diagonal, active count, sum of the active right-hand side)``."""
        n = self.seeds.shape[0]
        self.system = TileSystem(n, self.local_seeds, self.ev, self.active,
                                 self.targets - (self.ev.moments[:n, 0] if n else 0.0),
                                 np.concatenate([self.aggregates, self.halo_aggregates]), self.first_aggregate,
                                 self.n_aggregates)
        # the facets' integrals are in the rows now; the trials need the cells, the results the moments
        if n:
            self.ev = self.ev._replace(facet=None)
        return self.system.scalars()

    def start_solve(self, regularisation, scale, mean, refactor=True):
        """See :meth:`.tile_system.TileSystem.start`, with the rows of ``z`` for the halos.
        ``refactor=False``: the factors of the last solve made so (new ones the first time),
        kept between Newton steps; else new ones, freed with the system (:meth:`set_direction`)."""
        start = _now()
        out = self.system.start(regularisation, scale, mean, None if refactor else self.factor)
        self._spent("factor", start)
        self.factor = self.system.factor if not refactor else None    # kept only to be reused
        return out + (self.send("z"),)

    def cg_update(self, alpha):
        """See :meth:`.tile_system.TileSystem.update`; with the rows of ``z`` for the halos."""
        start = _now()
        out = self.system.update(alpha) + (self.send("z"),)
        self._spent("cg", start)
        return out

    def cg_direction(self, beta, coarse, pieces):
        """See :meth:`.tile_system.TileSystem.direction_times_matrix` (``pieces``: ``{tile:
        rows of its z}``)."""
        start = _now()
        halo_z = np.concatenate([pieces[t] for t in self.sources]) if self.sources else np.zeros(0)
        out = self.system.direction_times_matrix(beta, coarse, halo_z)
        self._spent("cg", start)
        return out

    def direction_sum(self):
        """``(sum, count)`` of the solution over the active Diracs near the domain
        (:func:`.newton_matrix.near_mask`: the gauge), then over all the active ones."""
        near = newton_matrix.near_mask(np, self.seeds, self.active)
        x = self.system.x
        return float(np.sum(x[near])), int(np.sum(near)), float(np.sum(x[self.active])), int(np.sum(self.active))

    def set_direction(self, mean):
        """The Newton direction: the solution minus ``mean`` (0 on inactive Diracs);
        returns its rows for the other tiles' halos."""
        self.d = np.where(self.active, self.system.x - mean, 0.0)
        self.system = None
        return self.send("d")

    def hiding_step(self):
        """The smallest step that certainly hides an owned Dirac (:func:`.planar.hiding_step`)
        at the current diagram and direction (halo directions received); ``inf`` in 3D (no bound
        there yet, as in one process)."""
        n = self.seeds.shape[0]
        if not n:
            return np.inf
        geom = geometry.of(self.dim)
        psi = np.concatenate([self.psi, self.halo_psi])
        owned = self.local_active & (np.arange(self.local_seeds.shape[0]) < n)
        d = np.concatenate([self.d, self.halo_d])
        with host_settings(threads=self.threads):
            # the fans see every Dirac of the diagram; the steps count for the owned ones
            cells = cells_of(self.ev)
            fans = geom.fans(np, self.local_seeds, psi, self.local_active, cells)
            return float(geom.hiding_step(np, self.local_seeds, psi, d, owned, cells, fans))


#: glibc's largest dynamic mmap threshold on 64-bit hosts (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_THRESHOLD = 32 << 20


def heap_for_temporaries():
    """Let this process's NumPy temporaries up to :data:`MMAP_THRESHOLD` bytes reuse the heap.

    A dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_=65536``, and setting it
    turns off glibc's dynamic mmap threshold: every array above 128 KiB is then mapped and
    unmapped afresh, and its pages faulted in each time (2e5 Diracs: the tiles' trials took
    3.3 times the CPU of the same tiles in one process). ``mallopt`` restores the thresholds
    that glibc would reach by itself (mmap 32 MiB, trim twice that). No-op off glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)        # M_MMAP_THRESHOLD
        libc.mallopt(-1, 2 * MMAP_THRESHOLD)    # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass
