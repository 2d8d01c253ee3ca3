"""The damped Newton method of :mod:`sdot._core.newton`, driven from the client over the tiles.

The same method and rules as the single-process solve (the start at the Voronoi diagram,
the Newton direction from ``DG d = m - G`` in the gauge ``mean(d) = 0``, the forcing term of
the linear solve, the first trial ``min(first, hiding_margin * hiding step)``, the damping
test: a certified diagram, every cell keeps ``eps0`` and ``|G - m|`` decreases by ``1 - t/2``,
the backtracking and the stall rule), with the values of :data:`sdot._core.options.DEFAULT`.
The client holds scalars only; weights, cells and the Newton matrix's rows live on the
tiles (:mod:`.tile`), the linear solve is :mod:`.cg`. A tile whose halo does not certify its
cells gets a halo twice as wide (:func:`.setup.with_halos`) and is evaluated again.

One difference: the start is always the Voronoi diagram (psi = 0), which the damped Newton
method needs to hold some mass in every cell (Kitagawa, Merigot, Thibert); the single-process
solve takes it only where every cell holds ``start_admissible`` of its target, and otherwise
starts from a similarity and a blurred density. Not yet distributed: that continuation (a
Voronoi cell without mass raises ``NotImplementedError``). The optimum is unique, so both
reach the same weights up to the tolerance.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from .._core.options import DEFAULT
from . import cg, setup
from .cg import gathered


@dataclasses.dataclass
class DaskSolution:
    """A distributed solve: W2^2 ``distance``, the max cell-mass error ``residual``,
    ``converged``, the Newton ``iterations``, the conjugate-gradient iterations of each step
    ``cg_iterations``, the halo growths ``halo_growths``, ``tiles`` (the actors, which hold
    the weights and cells), the wall ``seconds`` and ``timings``, the seconds by phase."""

    distance: float
    residual: float
    converged: bool
    iterations: int
    cg_iterations: list
    halo_growths: int
    tiles: list
    scale: float
    centre: object
    seconds: float
    timings: dict

    def gather(self):
        """``(cell_masses, brenier_potential, barycenters)`` in the order of the positions
        (every array moves to the client: small problems and tests). The potential has mean 0
        over the active Diracs; duplicates other than the first hold no mass here."""
        parts = gathered([t.results() for t in self.tiles])
        n = sum(p[0].size for p in parts)
        masses, psi, bary = np.zeros(n), np.zeros(n), np.zeros((n, 2))
        active = np.zeros(n, bool)
        for ids, m, w, b, a in parts:
            masses[ids], psi[ids], bary[ids], active[ids] = m, w, b, a
        psi = psi * self.scale ** 2
        psi = np.where(active, psi - psi[active].mean(), 0.0)
        return masses, psi, bary * self.scale + self.centre


class _Clock:
    """Wall seconds by phase: ``clock(name)`` adds the time since the last call to ``name``."""

    def __init__(self):
        self.seconds, self.last = {}, time.perf_counter()

    def __call__(self, name):
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now


class _Halos:
    """The halo width of each tile and the growth of those whose cells are not certified."""

    def __init__(self, tiles, box_lo, box_hi, width):
        self.tiles, self.box_lo, self.box_hi, self.first = tiles, box_lo, box_hi, width
        self.level = [0] * len(tiles)
        self.growths = 0
        setup.with_halos(tiles, box_lo, box_hi, range(len(tiles)), self.level, width)

    def certified(self, summaries, evaluate, rejected=lambda summaries: False):
        """``summaries`` with every tile's halo certified: tiles that fail grow (twice as wide)
        and ``evaluate(tiles)`` again (their summaries; all at once). Unless ``rejected(those
        that hold)``: a trial that the tiles whose cells are certified reject needs no more."""
        while True:
            if rejected([s for s in summaries if s["halo_ok"]]):
                return summaries
            failed = [k for k, s in enumerate(summaries) if s["certified"] and not s["halo_ok"]]
            if not failed:
                return summaries
            for k in failed:
                self.level[k] += 1
                self.growths += 1
            setup.with_halos(self.tiles, self.box_lo, self.box_hi, failed, [self.level[k] for k in failed], self.first)
            for k, s in zip(failed, evaluate(failed)):
                summaries[k] = s


def _totals(summaries):
    if not summaries:
        return 0.0, 0.0, np.inf, np.inf, True
    return (max(s["err_max"] for s in summaries), math.sqrt(sum(s["err_sq"] for s in summaries)),
            min(s["min_mass"] for s in summaries), min(s["worst"] for s in summaries),
            all(s["certified"] for s in summaries))


def solve(client, positions, density, centre, scale, tol, max_iter, tiles_per_worker=2, halo=8.0,
          aggregate_size=32, options=DEFAULT, log=None):
    """Solve on the workers of ``client``: see :func:`sdot.dask.solve`. Returns a :class:`DaskSolution`."""
    start = time.perf_counter()
    clock = _Clock()
    n = positions.shape[0]
    width = halo * math.sqrt(np.prod(density.hi - density.lo) / n)        # in mean spacings
    tiles, box_lo, box_hi, n_aggregates, sizes = setup.tiles_on_workers(
        client, positions, density, centre, scale, tiles_per_worker, aggregate_size, width)
    clock("tiles")
    halos = _Halos(tiles, box_lo, box_hi, width)
    clock("halos")
    summaries = halos.certified(_evaluated(tiles, halos.level, range(len(tiles))),
                                lambda ks: _evaluated(tiles, halos.level, ks))
    err, norm, min_mass, worst, certified = _totals(summaries)
    clock("diagrams")
    if not worst > 0:
        raise NotImplementedError(
            "the dask solve starts at the Voronoi diagram, where a Dirac's cell holds no mass: the "
            "continuation of hard densities (zero regions, Diracs outside the support) is not distributed yet")
    targets = gathered([t.target_range() for t in tiles])
    low, high = min(r[0] for r in targets), max(r[1] for r in targets)
    floor = 0.5 * min(low, min_mass)
    spread = low / high
    first, it, stalls, cg_iterations = 1.0, 0, 0, []
    if log:
        log(0, err, 0.0)
    while err > tol and it < max_iter and stalls < options.stalls:
        diag_sum, count, rhs_sum = (sum(v) for v in zip(*gathered([t.newton_system() for t in tiles])))
        count = max(count, 1)
        rtol = max(0.1 * tol / (norm if norm > 0 else 1.0), options.forcing * spread)
        clock("newton matrix")
        # new block factors every step: kept ones (the core's rent-or-buy) cost as much in
        # iterations as they save (2e5 Diracs, 2 workers: 17 iterations a step instead of 14,
        # factorisations 17 s instead of 22 s, conjugate gradient 13 s instead of 9.5 s)
        cg_iterations.append(cg.solve(tiles, options.regularisation * diag_sum / count, rhs_sum / count, rtol))
        clock("linear solve")
        total, count = (sum(v) for v in zip(*gathered([t.direction_sum() for t in tiles])))
        halo_d = cg.routed(gathered([t.set_direction(total / max(count, 1)) for t in tiles]))
        gathered([t.receive("d", halo_d.get(k, {})) for k, t in enumerate(tiles)])
        hidden_at = min(gathered([t.hiding_step() for t in tiles]))
        t = min(first, options.hiding_margin * hidden_at)
        clock("direction")
        ok = False
        while True:
            trial = halos.certified(_evaluated(tiles, halos.level, range(len(tiles)), t),
                                    lambda ks: _evaluated(tiles, halos.level, ks, t, again=True),
                                    lambda some: not _accepted(some, floor, t, norm))
            ok = _accepted(trial, floor, t, norm)
            err_t, norm_t = _totals(trial)[:2]
            if ok or options.backtrack * t <= 2.0 ** -30:
                break
            t *= options.backtrack
        it += 1
        clock("diagrams")
        if ok:
            gathered([tile.accept() for tile in tiles])
            summaries, err, norm = trial, err_t, norm_t
            first_next = min((options.damped_growth if t < first else options.growth) * t, 1.0)
            stalls = 0 if t >= options.stall_step else stalls + 1
            first = first_next
        else:
            stalls += 1
        if log:
            log(it, err, t if ok else 0.0)
    distance = sum(s["distance"] for s in summaries) * scale * scale
    return DaskSolution(distance, err, bool(err <= tol), it, cg_iterations, halos.growths, tiles, scale, centre,
                        time.perf_counter() - start, clock.seconds)


def _accepted(summaries, floor, t, norm):
    """The damping test on the tiles' ``summaries`` (of a trial at ``t``): certified cells,
    each keeps ``floor``, the error's norm below ``(1 - t/2) norm``. On some of the tiles:
    False if they reject the trial already (the others can only add error, lower masses)."""
    _, norm_t, min_t, _, sound = _totals(summaries)
    return sound and min_t >= floor and norm_t <= (1.0 - 0.5 * t) * norm


def _evaluated(tiles, levels, which, t=0.0, again=False):
    """The summaries of the diagrams of the tiles ``which`` at ``psi + t d`` (a trial if
    ``t > 0``), each tile's halo test bounded by the largest weights beyond its halo
    (:meth:`.tile.Tile.weights_beyond_halos`). ``again``: tiles whose halo grew, whose
    current diagram is rebuilt first (a trial's update starts from it)."""
    which = list(which)

    def bounds(t):
        sent = gathered([tile.weights_beyond_halos(t, levels) for tile in tiles])
        tops = np.array([s[0] for s in sent])
        return [(tops[:, k], [s[1][k] for s in sent if k in s[1]]) for k in range(len(tiles))]
    if again:
        now = bounds(0.0)
        gathered([tiles[k].evaluate(*now[k]) for k in which])
    at_t = bounds(t)
    return gathered([tiles[k].evaluate(*at_t[k], t, t > 0) for k in which])
