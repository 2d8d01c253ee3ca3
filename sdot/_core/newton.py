"""Damped Newton on the Laguerre weights (Kitagawa, Merigot, Thibert, JEMS 2019).

Solve ``G(psi) = m`` where ``G_i`` is the mass of the Laguerre cell i. The
Jacobian is the weighted graph Laplacian ``DG = D - W`` with
``W_ij = (int of rho over facet ij) / (2 |y_i - y_j|)``; its constant null
space is fixed by a tiny diagonal regulariser. Each step solves
``DG d = m - G`` and shrinks ``t`` (by :data:`BACKTRACK`) until every cell keeps
at least ``eps0 = min(min m, min G(psi_0)) / 2`` and
``|G(psi + t d) - m| <= (1 - t/2) |G(psi) - m|``. The first ``t`` of a step is
not 1 but ``min(1, 4 t)`` of the last step's, ``min(1, 1.5 t)`` if the last step
was damped (where steps must be damped they stay damped for a while), and at most
:data:`HIDING_MARGIN` times the ``t`` at which a seed is certainly hidden
(:func:`.hiding.hiding_step`, from the fans of the current neighbours): every
rejected trial measured had an empty cell, and each costs a diagram. Measured on a
Gaussian image at 1e5 (4 point sets): 11 to 13 steps and 14 to 20 diagrams, against
12 to 14 steps and 21 to 25 diagrams by halving from ``min(1, 4 t)`` alone.

Exact duplicates are merged (one active representative carries the group's
mass) and zero-mass Diracs are inactive, so every active cell has a positive
target. The start is the Voronoi diagram (psi = 0); if a cell is then empty
(Dirac outside the support, or in a zero-density region) the seeds are shrunk
towards the densest pixel: ``psi_i = |y_i - c|^2 (1 - 1/s)`` gives the
Voronoi diagram of ``c + (y_i - c) / s``, and s doubles until all cells have mass.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat, geometry, hiding, integrate
from .polygons import offsets

REGULARISATION = 1e-9
#: The first damping trial of a step is ``min(1, GROWTH * t)``, ``t`` that of the last
#: step, or ``min(1, DAMPED_GROWTH * t)`` if the last step had to be damped.
GROWTH = 4.0
DAMPED_GROWTH = 1.5
#: The first trial is at most this share of the ``t`` that certainly hides a seed (cells
#: empty earlier than the fan test sees; measured at 1e4 and 1e5: 0.8 gave the fewest
#: diagrams and steps of 0.8, 0.85, 0.9, 0.95 and 0.999 over the box and a Gaussian image).
HIDING_MARGIN = 0.8
#: Factor of ``t`` after a rejected trial.
BACKTRACK = 0.7
#: Relative residual of the linear solves away from the solution (see :func:`_linear_rtol`).
FORCING = 1e-2


class Problem(NamedTuple):
    """A semi-discrete problem in the computation namespace."""

    seeds: object      # (n, 2)
    masses: object     # (n,), total = total density mass
    density: object    # (n_x, n_y) cell values, integral = total mass
    lo: object         # (2,)
    hi: object         # (2,)


class Evaluation(NamedTuple):
    """The diagram at some weights: ``cells``, per-cell ``moments`` (n, 4: mass,
    first moments and second moment about the seed) and per-edge ``facet``
    integrals of the density (n, V)."""

    cells: object
    moments: object
    facet: object


class Solution(NamedTuple):
    psi: object
    evaluation: object
    residual: object
    iterations: object
    converged: object


@_compat.jit_on_jax()
def group_duplicates(xp, seeds, masses, weights=None):
    """Representative of each Dirac among its exact duplicates, activity, targets.

    The representative is the duplicate of largest ``weights`` (it owns the
    power cell), the first one on ties or without weights.
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    o1 = xp.arange(n, dtype=xp.int64, device=dev) if weights is None else xp.argsort(-weights, stable=True)
    o1 = xp.take(o1, xp.argsort(xp.take(seeds[:, 1], o1), stable=True))
    perm = xp.take(o1, xp.argsort(xp.take(seeds[:, 0], o1), stable=True))
    s = xp.take(seeds, perm, axis=0)
    same = xp.all(s[1:, :] == s[:-1, :], axis=1)
    start = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), ~same])
    gid = xp.cumulative_sum(xp.astype(start, xp.int64)) - 1
    rep_sorted = xp.take(perm, xp.searchsorted(gid, gid))
    rep = xp.take(rep_sorted, xp.argsort(perm))
    group_mass = _compat.segment_sum(xp, masses, rep, n)
    active = (rep == xp.arange(n, dtype=rep.dtype, device=dev)) & (group_mass > 0)
    return rep, active, xp.where(active, group_mass, 0.0)


def evaluate(xp, prob, psi, active, candidates=None, capacity=geometry.CAPACITY, previous=None,
             trial=None):
    """The :class:`Evaluation` at weights ``psi``: see :func:`geometry.power_cells` for
    ``candidates``, ``capacity`` and ``previous`` (cells at other weights).

    ``trial``: a predicate (may be traced) that the diagram is a damping trial, which
    :func:`_accept` rejects unless its cells are certified and none is empty. Eagerly,
    as soon as the update (or the rebuild) finds an active cell empty, the diagram is
    abandoned: uncertified cells, zero moments. (The damping's trials stay below the
    ``t`` at which :func:`.hiding.hiding_step` proves a seed hidden.)
    """
    stop = trial is not None and _compat.host_any(xp, trial)
    cells = geometry.power_cells(xp, prob.seeds, psi, active, prob.lo, prob.hi, candidates, capacity,
                                 previous=previous, stop_if_empty=stop)
    if stop and _compat.host_any(xp, ~cells.certified):
        return _without_integrals(xp, cells)
    moments, facet = integrate.cell_integrals(xp, prob.seeds, cells, prob.density, prob.lo, prob.hi)
    return Evaluation(cells, moments, facet)


def _without_integrals(xp, cells):
    """An :class:`Evaluation` of ``cells`` (uncertified: an abandoned trial, or a
    placeholder) with zero integrals."""
    n, cap = cells.labels.shape
    dev = aac.device(cells.count)
    dtype = cells.vertices.dtype
    return Evaluation(cells, xp.zeros((n, 4), dtype=dtype, device=dev), xp.zeros((n, cap), dtype=dtype, device=dev))


def newton_direction(xp, prob, ev, active, rhs, rtol=None):
    """Solve ``DG d = rhs`` (sparse, regularised weighted Laplacian), in the gauge mean(d) = 0,
    to a relative residual ``rtol`` (see :func:`._compat.solve_laplacian`).

    ``DG`` is singular along constants: the part of ``rhs`` along them (its
    mean, which is rounding error since both mass vectors sum to the same
    total) is removed first, and so is the mean of ``d`` after the solve.
    Otherwise the regulariser turns a rounding error of ``sum(rhs)`` into a
    huge constant shift of the weights, which costs FP32 all its precision.
    """
    rows, cols, w, diag, rhs = _laplacian(xp, prob.seeds, ev.cells, ev.facet, active, rhs)
    d = _compat.solve_laplacian(xp, rows, cols, w, diag, rhs, rtol, points=prob.seeds)
    return _centred(xp, d, active)


@_compat.jit_on_jax()
def _centred(xp, x, active):
    """``x`` minus its mean over the ``active`` entries (inactive entries set to 0)."""
    count = xp.maximum(xp.sum(xp.astype(active, x.dtype)), 1.0)
    return xp.where(active, x - xp.sum(xp.where(active, x, 0.0)) / count, 0.0)


def _laplacian(xp, seeds, cells, facet, active, rhs):
    """Entries ``(rows, cols, w)`` of ``W``, the diagonal and the centred right-hand side.

    ``W_ij = (int of rho over facet ij) / (2 |y_i - y_j|)``. Eagerly one entry per facet
    of nonzero integral, rows non-decreasing (:func:`_facet_entries`); traced one per
    edge slot, zero where there is no facet (in blocks of rows, see
    :func:`._compat.blockwise`).
    """
    n = cells.labels.shape[0]
    if _compat.is_traced(seeds, cells.labels, facet):
        rows = xp.arange(n, dtype=xp.int64, device=aac.device(seeds))
        rows_per_slot = xp.broadcast_to(rows[:, None], cells.labels.shape)
        other, w = _compat.slotwise(xp, lambda c, r, lab, f: _facet_weights(xp, seeds, r, lab, c, f),
                                    cells.count, (rows,), (cells.labels, facet), (rows_per_slot, 0.0))
        diag = _compat.row_sum(xp, w)
        rows, cols, w = (xp.reshape(a, (-1,)) for a in (rows_per_slot, other, w))
    else:
        rows, cols, w = _facet_entries(xp, seeds, cells, facet)
        diag = _compat.segment_sum(xp, w, rows, n)
    return (rows, cols, w) + _regularised(xp, diag, active, rhs)


def _facet_entries(xp, seeds, cells, facet):
    """Eagerly, ``(rows, cols, w)`` of the edge slots with a neighbour and a nonzero
    facet integral, in slot order: a few operations on those entries alone (measured
    at 1e4 cells of 16 slots: about 1 ms against 6 to 10 ms for the kernel over every slot
    with the flattening after it)."""
    n, cap = cells.labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(seeds))[None, :]
    is_facet = (k < cells.count[:, None]) & (cells.labels >= 0) & (facet != 0)
    slot = xp.nonzero(xp.reshape(is_facet, (-1,)))[0]
    rows = slot // cap
    cols = xp.take(xp.reshape(cells.labels, (-1,)), slot)
    dx, dy = offsets(xp, seeds, rows, cols[:, None])
    dist = xp.sqrt(dx[:, 0] * dx[:, 0] + dy[:, 0] * dy[:, 0])
    return rows, cols, xp.take(xp.reshape(facet, (-1,)), slot) / (2.0 * dist)


@_compat.jit_on_jax()
def _facet_weights(xp, seeds, rows, labels, count, facet):
    """Kernel of :func:`_laplacian` for the cells ``rows``: the neighbour of each edge
    slot (the cell itself where none) and its weight, ``(other, w)`` (n, V)."""
    cap = labels.shape[1]
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(rows))[None, :]
    is_facet = (k < count[:, None]) & (labels >= 0)
    other = xp.where(is_facet, labels, rows[:, None])
    dx, dy = offsets(xp, seeds, rows, other)
    dist = xp.sqrt(dx * dx + dy * dy)
    return other, xp.where(is_facet, facet / (2.0 * xp.where(is_facet, dist, 1.0)), 0.0)


@_compat.jit_on_jax()
def _regularised(xp, diag, active, rhs):
    """:func:`_laplacian`'s regularised diagonal and centred right-hand side."""
    scale = xp.sum(diag) / xp.maximum(xp.sum(xp.astype(active, diag.dtype)), 1.0)
    diag = xp.where(active, diag + REGULARISATION * scale, 1.0)
    return diag, _centred(xp, rhs, active)


def _masked_min(xp, x, mask):
    return xp.min(xp.where(mask, x, xp.inf))


def initial_weights(xp, prob, active, capacity=geometry.CAPACITY):
    """Weights where every active cell has positive mass (see module docstring),
    with their :class:`Evaluation`."""
    dens = prob.density
    flat = xp.argmax(xp.reshape(dens, (-1,)))
    ny = dens.shape[1]
    ij = xp.stack([flat // ny, flat % ny])
    shape = xp.asarray(dens.shape, dtype=prob.seeds.dtype, device=aac.device(dens))
    centre = prob.lo + (xp.astype(ij, prob.seeds.dtype) + 0.5) / shape * (prob.hi - prob.lo)
    r2 = _compat.dot(prob.seeds - centre, prob.seeds - centre)

    def cond(state):
        _, ev, shrink = state
        return (_masked_min(xp, ev.moments[:, 0], active) <= 0) & (shrink < 2.0 ** 60)

    def body(state):
        _, _, shrink = state
        shrink = 2.0 * shrink
        psi = r2 * (1.0 - 1.0 / shrink)
        return psi, evaluate(xp, prob, psi, active, capacity=capacity), shrink

    # the first round (shrink 1: psi = 0) evaluates the Voronoi diagram; before
    # it, an Evaluation of the right shapes with no mass (one copy of evaluate)
    none = xp.zeros(r2.shape, dtype=xp.bool, device=aac.device(r2))
    placeholder = _without_integrals(xp, geometry.box_cells(xp, prob.seeds, prob.lo, prob.hi, none, capacity))
    half = xp.asarray(0.5, dtype=r2.dtype, device=aac.device(r2))
    psi, ev, _ = _compat.while_loop(cond, body, (xp.zeros_like(r2), placeholder, half))
    return psi, ev


def solve(xp, prob, tol, max_iter, active, targets, log=None, capacity=geometry.CAPACITY,
          min_step=2.0 ** -30):
    """Damped Newton from a start with non-empty cells. Returns a :class:`Solution`."""
    psi, ev = initial_weights(xp, prob, active, capacity)
    eps0 = 0.5 * xp.minimum(_masked_min(xp, targets, active), _masked_min(xp, ev.moments[:, 0], active))

    def error(mom):
        return _errors(xp, mom, targets, active)

    def damped_step(psi, ev, d, norm0, t1):
        """Shrink ``t`` from ``t1`` until the step is accepted (or ``t < min_step``)."""
        def trial(t):
            # the last trial (t <= min_step) is complete: the loop returns it even if rejected
            new = evaluate(xp, prob, psi + t * d, active, capacity=ev.cells.labels.shape[1],
                           previous=ev.cells, trial=t > min_step)
            err_t, norm_t = error(new.moments)
            return new, err_t, _accept(xp, new.moments, new.cells, active, eps0, norm_t, norm0, t)

        def cond(state):
            t, _, _, ok = state
            return ~ok & (t > min_step)

        def loop_body(state):
            t = BACKTRACK * state[0]
            del state                   # eagerly, the rejected diagram is freed before the next one
            return (t,) + trial(t)

        t, new, err_t, _ = _compat.while_loop(cond, loop_body, (t1,) + trial(t1))
        return psi + t * d, new, err_t, t

    def cond(state):
        _, _, it, err, _ = state
        return (err > tol) & (it < max_iter)

    def body(state):
        psi, ev, it, err, first = state
        _, norm0 = error(ev.moments)
        # the hiding step's fans, eagerly on NumPy on another core during the host's sparse solve
        fans = _compat.in_background(lambda: hiding.fans(xp, prob.seeds, psi, active, ev.cells), psi)
        d = newton_direction(xp, prob, ev, active, targets - ev.moments[:, 0], _linear_rtol(xp, tol, norm0))
        hidden_at = hiding.hiding_step(xp, prob.seeds, psi, d, active, ev.cells, fans)
        psi, ev, err, t = damped_step(psi, ev, d, norm0, xp.minimum(first, HIDING_MARGIN * hidden_at))
        if log is not None:
            _compat.host_call(log, it + 1, err, t)
        first = xp.minimum(xp.where(t < first, DAMPED_GROWTH * t, GROWTH * t), 1.0)   # the next step's
        return psi, ev, it + 1, err, first

    err0, _ = error(ev.moments)
    if log is not None:
        _compat.host_call(log, 0, err0, 0.0)
    it0 = xp.asarray(0, device=aac.device(psi))
    t0 = xp.asarray(1.0, dtype=psi.dtype, device=aac.device(psi))
    psi, ev, it, err, _ = _compat.while_loop(cond, body, (psi, ev, it0, err0, t0))
    sound = ev.cells.certified & ~xp.any(ev.cells.overflow)
    return Solution(psi, ev, err, it, (err <= tol) & sound)


def _linear_rtol(xp, tol, norm):
    """Relative residual of a Newton solve (an inexact Newton method).

    The residual ``r`` of ``DG d = rhs`` adds ``t r`` to the next masses' error, so
    ``|r| <= 0.1 tol`` (``|rhs|`` is the Euclidean ``norm`` of the mass error) keeps it a
    tenth of the tolerance; further from the solution the looser :data:`FORCING` is
    enough: the next error is then about ``C |rhs|^2 + FORCING |rhs|`` (undamped) or
    ``(1 - t + t FORCING) |rhs|``. Measured at 1e5 seeds (box and Gaussian image, tolerance
    1e-8): the same Newton steps and residuals as with a relative residual of 1e-5 to
    1e-7, in 42 and 146 conjugate gradient iterations instead of 73 and 159 with
    FORCING 1e-3. FORCING 1e-2 (now): box 1e5 the same 5 steps in 31 iterations instead
    of 43; Gaussian 1e5 11, 11, 11, 11 steps on 4 point sets instead of 12, 11, 13, 13
    (14 to 16 diagrams instead of 15 to 21); Gaussian 1e4 38 steps on 6 sets instead of 37.
    """
    return xp.maximum(0.1 * tol / xp.where(norm > 0, norm, 1.0), FORCING)


@_compat.jit_on_jax()
def _errors(xp, moments, targets, active):
    """Max and Euclidean norms of the cell-mass error."""
    e = xp.where(active, moments[:, 0] - targets, 0.0)
    return xp.max(xp.abs(e)), xp.sqrt(xp.sum(e * e))


@_compat.jit_on_jax()
def _accept(xp, moments, cells, active, eps0, norm_t, norm0, t):
    """Damping test: a sound diagram, every cell keeps ``eps0`` and the error decreases enough."""
    return (cells.certified & ~xp.any(cells.overflow)
            & (_masked_min(xp, moments[:, 0], active) >= eps0) & (norm_t <= (1.0 - 0.5 * t) * norm0))
