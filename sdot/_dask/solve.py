"""The damped Newton method of :mod:`sdot._core.newton`, driven from the client over the tiles.

The same method and rules as the single-process solve (the start at the Voronoi diagram,
the Newton direction from ``DG d = m - G`` in the gauge of :func:`sdot._core.newton_matrix.near_domain`,
and the rules of :mod:`sdot._core.damping`: the forcing term of the linear solve, the first trial, the
damping test, the backtracking and the stall rule), with the values of :data:`sdot._core.options.DEFAULT`.
The client holds scalars and a checkpoint of the weights of the last accepted step (a
worker lost mid-step costs that step: :class:`.setup.TileSet`); weights, cells and the
Newton matrix's rows live on the tiles (:mod:`.tile`), the linear solve is :mod:`.cg`. A tile whose halo does not certify its
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
import warnings

import numpy as np

from .._core import damping
from .._core.options import DEFAULT
from . import cg, dimensions, setup
from .cg import gathered


@dataclasses.dataclass
class DaskSolution:
    """A distributed solve: W2^2 ``distance``, the max cell-mass error ``residual``,
    ``converged``, the Newton ``iterations``, the conjugate-gradient iterations of each step
    ``cg_iterations``, the halo growths ``halo_growths``, ``tiles`` (the actors, which hold
    the weights and cells), the wall ``seconds`` and ``timings``, the seconds by phase, and
    ``recoveries``: the rebuilds after a lost worker."""

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
    recoveries: int = 0

    def gather(self):
        """``(cell_masses, brenier_potential, barycenters)`` in the order of the positions
        (every array moves to the client: small problems and tests). The potential has mean 0
        over the active Diracs; duplicates other than the first hold no mass here."""
        parts = gathered([t.results() for t in self.tiles])
        n = sum(p[0].size for p in parts)
        masses, psi, bary = np.zeros(n), np.zeros(n), np.zeros((n, self.centre.shape[0]))
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

    def __init__(self, count, width):
        self.first, self.level, self.growths = width, [0] * count, 0

    def reset(self, tileset):
        """The halos of the tiles of ``tileset`` (new, or rebuilt) at their current levels."""
        self.set = tileset
        setup.with_halos(tileset.tiles, tileset.box_lo, tileset.box_hi, range(len(self.level)), self.level,
                         self.first)

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
            setup.with_halos(self.set.tiles, self.set.box_lo, self.set.box_hi, failed,
                             [self.level[k] for k in failed], self.first)
            for k, s in zip(failed, evaluate(failed)):
                summaries[k] = s


def _totals(summaries):
    if not summaries:
        return 0.0, 0.0, np.inf, np.inf, True
    return (max(s["err_max"] for s in summaries), math.sqrt(sum(s["err_sq"] for s in summaries)),
            min(s["min_mass"] for s in summaries), min(s["worst"] for s in summaries),
            all(s["certified"] for s in summaries))


class _Newton:
    """The client's state of the damped Newton method: the accepted diagram's ``summaries``,
    ``err`` and ``norm`` (max and 2-norm of the mass errors), the next first trial, the
    stalls, the steps and their conjugate-gradient iterations. A step changes it only once
    every tile has accepted its trial (and the weights are checkpointed): a step that a lost
    worker interrupts leaves it as it was, to be redone."""

    def __init__(self, halos, dim, tol, max_iter, options, log, clock):
        self.halos, self.dim, self.tol, self.max_iter, self.options, self.log, self.clock = \
            halos, dim, tol, max_iter, options, log, clock
        self.first, self.t, self.it, self.stalls, self.cg_iterations, self.floor = 1.0, 1.0, 0, 0, [], None

    @property
    def done(self):
        return not (self.err > self.tol and self.it < self.max_iter and not damping.stopped(self.stalls, self.options))

    def start(self, tiles):
        """The diagrams at the tiles' weights (the start, or the checkpoint of a rebuild)."""
        self.tiles, levels = tiles, self.halos.level
        summaries = self.halos.certified(_evaluated(tiles, levels, range(len(tiles))),
                                         lambda ks: _evaluated(tiles, levels, ks))
        err, norm, min_mass, worst, _ = _totals(summaries)
        self.clock("diagrams")
        if self.floor is None:
            if not worst > 0:
                raise NotImplementedError(
                    "the dask solve starts at the Voronoi diagram, where a Dirac's cell holds no mass: the "
                    "continuation of hard densities (zero regions, Diracs outside the support) is not distributed yet")
            targets = gathered([t.target_range() for t in tiles])
            low, high = min(r[0] for r in targets), max(r[1] for r in targets)
            self.floor, self.spread = float(damping.mass_floor(np, low, min_mass, True)), low / high
            if self.log:
                self.log(0, err, 0.0)
        self.summaries, self.err, self.norm = summaries, err, norm

    def step(self, tileset):
        """One damped Newton step over the tiles; the accepted weights go to ``tileset.checkpoint``."""
        tiles, options, norm, clock = self.tiles, self.options, self.norm, self.clock
        diag_sum, count, rhs_sum = (sum(v) for v in zip(*gathered([t.newton_system() for t in tiles])))
        count = max(count, 1)
        rtol = float(damping.linear_rtol(np, self.tol, norm, self.t, self.spread, options))
        clock("newton matrix")
        # new block factors every step: kept ones (the core's rent-or-buy) cost as much in
        # iterations as they save (2e5 Diracs, 2 workers: 17 iterations a step instead of 14,
        # factorisations 17 s instead of 22 s, conjugate gradient 13 s instead of 9.5 s)
        cg_iterations = cg.solve(tiles, options.regularisation, diag_sum / count, rhs_sum / count, rtol)
        clock("linear solve")
        near, near_count, total, count = (sum(v) for v in zip(*gathered([t.direction_sum() for t in tiles])))
        mean = near / near_count if near_count else total / max(count, 1)       # newton_matrix.near_domain's gauge
        halo_d = cg.routed(gathered([t.set_direction(mean) for t in tiles]))
        gathered([t.receive("d", halo_d.get(k, {})) for k, t in enumerate(tiles)])
        hidden_at = min(gathered([t.hiding_step() for t in tiles]))
        t = float(damping.first_trial(np, np.float64(self.first), hidden_at, self.dim, options))
        clock("direction")
        levels = self.halos.level
        def attempt(t):
            trial = self.halos.certified(_evaluated(tiles, levels, range(len(tiles)), t),
                                         lambda ks: _evaluated(tiles, levels, ks, t, again=True),
                                         lambda some: not _accepted(some, self.floor, t, norm))
            return trial, _accepted(trial, self.floor, t, norm)

        t, trial, ok = damping.backtracking(t, attempt, options)
        if ok:
            tileset.checkpoint = gathered([tile.accept() for tile in tiles])
            self.summaries = trial
            self.err, self.norm = _totals(trial)[:2]
            self.first = float(damping.next_first(np, t, self.first, options))
        self.stalls = int(damping.stalls_after(np, ok, t, self.stalls, options))
        self.t = t if ok else 0.0
        self.it += 1
        self.cg_iterations.append(cg_iterations)
        clock("diagrams")
        if self.log:
            self.log(self.it, self.err, t if ok else 0.0)


def solve(client, positions, masses, total, density, centre, scale, tol, max_iter, tiles_per_worker=None, halo=8.0,
          aggregate_size=32, options=DEFAULT, log=None, max_recoveries=3):
    """Solve on the workers of ``client``: see :func:`sdot.dask.solve`. Returns a :class:`DaskSolution`.

    A worker lost during the solve (:func:`.setup.lost_worker`, at most ``max_recoveries``
    times) costs the tiles' rebuild from the last checkpointed weights and the step it
    interrupted (a warning says so)."""
    start = time.perf_counter()
    clock = _Clock()
    n = positions.shape[0]
    width = halo * dimensions.mean_spacing(density.lo, density.hi, n)      # in mean spacings
    tileset, halos, newton, recoveries, stale = None, None, None, 0, True
    while True:
        try:
            if tileset is None:
                tileset = setup.TileSet(client, positions, masses, total, density, centre, scale, tiles_per_worker,
                                        aggregate_size, width, options.diagram)
                halos = _Halos(len(tileset.tiles), width)
                newton = _Newton(halos, positions.shape[1], tol, max_iter, options, log, clock)
                clock("tiles")
            elif stale:
                tileset.rebuild()
                clock("recovery")
            if stale:
                halos.reset(tileset)
                clock("halos")
                newton.start(tileset.tiles)
                stale = False
            if newton.done:
                break
            newton.step(tileset)
        except Exception as exc:                # a lost worker is recovered, the rest raised
            if not setup.lost_worker(exc) or recoveries >= max_recoveries:
                raise
            recoveries, stale = recoveries + 1, True
            warnings.warn(f"sdot.dask: a worker was lost ({type(exc).__name__}: {exc}); the tiles are rebuilt "
                          f"from the weights of Newton step {newton.it if newton else 0}", RuntimeWarning,
                          stacklevel=3)
            clock("recovery")
    distance = sum(s["distance"] for s in newton.summaries) * scale * scale
    return DaskSolution(distance, newton.err, bool(newton.err <= tol), newton.it, newton.cg_iterations,
                        halos.growths, tileset.tiles, scale, centre, time.perf_counter() - start, clock.seconds,
                        recoveries)


def _accepted(summaries, floor, t, norm):
    """The damping test on the tiles' ``summaries`` (of a trial at ``t``): certified cells,
    each keeps ``floor``, the error's norm below ``(1 - t/2) norm``. On some of the tiles:
    False if they reject the trial already (the others can only add error, lower masses)."""
    _, norm_t, min_t, _, sound = _totals(summaries)
    return bool(damping.accepted(sound, min_t, floor, norm_t, norm, t))


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
