"""What a Newton step evaluates: the problem, the diagram at some weights with its integrals
(:func:`evaluate`), the solution, and the measures of the cell masses against their targets
that the solves (:mod:`.newton`, :mod:`.partial`, :mod:`.continuation`) test."""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat, damping, geometry, periodic
from .options import DIAGRAM


class Problem(NamedTuple):
    """A semi-discrete problem in the computation namespace: the Diracs ``seeds`` (n, d)
    and their ``masses`` (n,) against a ``density`` (a kind of :mod:`.density`, of the
    same total mass), whose box ``[lo, hi]`` is the domain of the cells; ``period`` (d,): the
    box's sides on its periodic axes, 0 on the others (:mod:`.periodic`), or None."""

    seeds: object
    masses: object
    density: object
    period: object = None

    @property
    def lo(self):
        return self.density.lo

    @property
    def hi(self):
        return self.density.hi


class Evaluation(NamedTuple):
    """The diagram at some weights: ``cells``, per-cell ``moments`` (n, d + 2: mass,
    first moments and second moment about the seed) and per-facet-slot ``facet``
    integrals of the density (n, V)."""

    cells: object
    moments: object
    facet: object


#: :attr:`Solution.status` codes.
CONVERGED, MAX_ITERATIONS, STALLED, UNSOUND = 0, 1, 2, 3


class Solution(NamedTuple):
    """A solve's weights, their evaluation against the density, the max cell-mass error,
    the Newton steps, whether it converged and why not (``status``: :data:`CONVERGED`,
    :data:`MAX_ITERATIONS`, :data:`STALLED` or :data:`UNSOUND`, a diagram not certified),
    the width it stopped at, its last damping, and whether a trial's cells overflowed their
    vertex capacity (only under tracing; such trials are rejected)."""

    psi: object
    evaluation: object
    residual: object
    iterations: object
    converged: object
    status: object
    width: object
    damping: object
    trials_overflowed: object


@_compat.jit_on_jax()
def group_duplicates(xp, seeds, masses, weights=None):
    """Representative of each Dirac among its exact duplicates, activity, targets.

    The representative is the duplicate of largest ``weights`` (it owns the
    power cell), the first one on ties or without weights.
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    perm = xp.arange(n, dtype=xp.int64, device=dev) if weights is None else xp.argsort(-weights, stable=True)
    for axis in reversed(range(seeds.shape[1])):        # lexicographic order of the positions
        perm = xp.take(perm, xp.argsort(xp.take(seeds[:, axis], perm), stable=True))
    s = xp.take(seeds, perm, axis=0)
    same = xp.all(s[1:, :] == s[:-1, :], axis=1)
    start = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), ~same])
    gid = xp.cumulative_sum(xp.astype(start, xp.int64)) - 1
    rep_sorted = xp.take(perm, xp.searchsorted(gid, gid))
    rep = xp.take(rep_sorted, xp.argsort(perm))
    group_mass = _compat.segment_sum(xp, masses, rep, n)
    active = (rep == xp.arange(n, dtype=rep.dtype, device=dev)) & (group_mass > 0)
    return rep, active, xp.where(active, group_mass, 0.0)


def evaluate(xp, prob, psi, active, candidates=None, capacity=None, previous=None,
             trial=None, diagram=DIAGRAM):
    """The :class:`Evaluation` at weights ``psi``: see :func:`.planar.power_cells` (the
    geometry of the dimension, :mod:`.geometry`) for ``candidates``, ``capacity``, ``previous`` (cells at other weights) and ``diagram``
    (its ``options``).

    ``trial``: a predicate (may be traced) that the diagram is a damping trial, which
    :func:`accept` rejects unless its cells are certified and none is empty. Eagerly,
    as soon as the update (or the rebuild) finds an active cell empty, the diagram is
    abandoned: uncertified cells, zero moments. (The damping's trials stay below the
    ``t`` at which the geometry's ``hiding_step`` proves a seed hidden.)
    """
    if prob.period is not None:
        return Evaluation(*periodic.evaluate(xp, prob, psi, active, capacity, previous, diagram, trial is not None))
    stop = trial is not None and _compat.host_any(xp, trial)
    geom = geometry.of_seeds(prob.seeds)
    capacity = geom.CAPACITY if capacity is None else capacity
    cells = geom.power_cells(xp, prob.seeds, psi, active, prob.lo, prob.hi, candidates, capacity,
                             previous=previous, stop_if_empty=stop, options=diagram)
    if stop and _compat.host_any(xp, ~cells.certified):
        return without_integrals(xp, cells, prob.seeds.shape[1])
    moments, facet = prob.density.integrals(xp, prob.seeds, cells)
    return Evaluation(cells, moments, facet)


def without_integrals(xp, cells, dim):
    """An :class:`Evaluation` of ``cells`` (uncertified: an abandoned trial, or a
    placeholder) in dimension ``dim`` with zero integrals."""
    n, cap = cells.labels.shape
    dev = aac.device(cells.count)
    dtype = cells.vertices.dtype
    return Evaluation(cells, xp.zeros((n, dim + 2), dtype=dtype, device=dev), xp.zeros((n, cap), dtype=dtype, device=dev))


@_compat.jit_on_jax()
def squared_diameter(xp, seeds, lo, hi):
    """``D^2``: the squared diameter of the box of the ``seeds`` and the domain ``[lo, hi]``.
    The weights of two nonempty cells differ by at most ``D^2``."""
    span = xp.concat([seeds, lo[None, :], hi[None, :]], axis=0)
    return xp.sum((xp.max(span, axis=0) - xp.min(span, axis=0)) ** 2)


@_compat.jit_on_jax()
def span(xp, d, active):
    """``max(d) - min(d)`` over the ``active`` entries."""
    return xp.max(xp.where(active, d, -xp.inf)) - xp.min(xp.where(active, d, xp.inf))


def masked_min(xp, x, mask):
    return xp.min(xp.where(mask, x, xp.inf))


def ratios(xp, moments, targets, active):
    """Each cell's mass over its target (inactive cells: their mass)."""
    return moments[:, 0] / xp.where(active, targets, 1.0)


def worst_ratio(xp, moments, targets, active):
    """The smallest ratio of a cell's mass to its target, over the active cells."""
    return masked_min(xp, ratios(xp, moments, targets, active), active)


def within(xp, moments, targets, active, low, high):
    """Whether every active cell holds between ``low`` and ``high`` times its target."""
    ratio = ratios(xp, moments, targets, active)
    return (masked_min(xp, ratio, active) >= low) & (xp.max(xp.where(active, ratio, 0.0)) <= high)


def relative_error(xp, moments, targets, active):
    """The largest relative cell-mass error, over the active cells."""
    e = xp.abs(moments[:, 0] - targets) / xp.where(active, targets, 1.0)
    return xp.max(xp.where(active, e, 0.0))


def integrals_at(xp, prob, cells, width):
    """The :class:`Evaluation` of ``cells`` against the density blurred to ``width``
    (0: the density itself)."""
    if prob.period is not None:
        sites, owner = periodic.sites_of(xp, prob, cells)
        moments, facet = at_width(xp, prob.density, width, periodic.wrapping(prob)).integrals(xp, sites, cells)
        return Evaluation(cells, periodic.folded_rows(xp, moments, owner, prob.seeds.shape[0]), facet)
    moments, facet = at_width(xp, prob.density, width).integrals(xp, prob.seeds, cells)
    return Evaluation(cells, moments, facet)


def at_width(xp, density, width, wrapping=None):
    """``density`` blurred to ``width`` (0: the density itself; ``wrapping``: on a periodic
    domain, per axis whether it wraps, :func:`.periodic.wrapping`)."""
    return _compat.cond(width > 0, lambda: density.blurred(xp, width, wrapping), lambda: density)


@_compat.jit_on_jax()
def errors(xp, moments, targets, active):
    """Max and Euclidean norms of the cell-mass error."""
    e = xp.where(active, moments[:, 0] - targets, 0.0)
    return xp.max(xp.abs(e)), xp.sqrt(xp.sum(e * e))


def accept(xp, moments, cells, active, eps0, norm_t, norm0, t):
    """:func:`.damping.accepted` of a trial's ``cells`` and ``moments``."""
    return damping.accepted(cells.certified & ~xp.any(cells.overflow), masked_min(xp, moments[:, 0], active), eps0,
                            norm_t, norm0, t)
