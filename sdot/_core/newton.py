"""Damped Newton on the Laguerre weights (Kitagawa, Merigot, Thibert, JEMS 2019).

Solve ``G(psi) = m`` where ``G_i`` is the mass of the Laguerre cell i. The
Jacobian is the weighted graph Laplacian ``DG = D - W`` with
``W_ij = (int of rho over facet ij) / (2 |y_i - y_j|)``; its constant null
space is fixed by a tiny diagonal regulariser. Each step solves
``DG d = m - G`` and shrinks ``t`` (by ``backtrack``) until every cell keeps
at least ``eps0 = min(min m, min G(psi_0)) / 2`` and
``|G(psi + t d) - m| <= (1 - t/2) |G(psi) - m|``. The first ``t`` of a step is
not 1 but ``min(1, 4 t)`` of the last step's, ``min(1, 1.5 t)`` if the last step
was damped (where steps must be damped they stay damped for a while), and at most
``hiding_margin`` times the ``t`` at which a seed is certainly hidden (the geometry's
``hiding_step``, from the fans of the current neighbours; at the first step, after a
damped one and in the continuation): trials beyond it are rejected for an empty cell, and
each costs a diagram. These rules are :mod:`.damping`'s, shared with partial transport and the
distributed solve.

Exact duplicates are merged (one active representative carries the group's
mass) and zero-mass Diracs are inactive, so every active cell has a positive
target. The start is the Voronoi diagram (psi = 0) if every cell holds 1% of its target
(unless its first step hides a seed before ``hopeless_step``: a density that jumps, such as
a disc on a grey background, then goes through the continuation as below).
Otherwise (Diracs outside the support, zero regions, holes, separate pieces) the
solve starts from the best of Voronoi and two maps of the Diracs into the support's
box (:mod:`.starts`) against the density blurred by
:mod:`.continuation`, positive in the support's box, and narrows the blur to 0 as the cells
allow: every stage starts where each cell holds a share of its target, the
condition under which the damped Newton method converges.

The tuning values (``backtrack``, ``hiding_margin``...) are the fields of
:class:`.options.NewtonOptions`, passed down from :func:`solve`.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat, balancing, continuation, damping, geometry, row_blocks, starts
from .newton_matrix import near_domain, newton_direction
from .options import DEFAULT, DIAGRAM


class Problem(NamedTuple):
    """A semi-discrete problem in the computation namespace: the Diracs ``seeds`` (n, d)
    and their ``masses`` (n,) against a ``density`` (a kind of :mod:`.density`, of the
    same total mass), whose box ``[lo, hi]`` is the domain of the cells."""

    seeds: object
    masses: object
    density: object

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
    :func:`_accept` rejects unless its cells are certified and none is empty. Eagerly,
    as soon as the update (or the rebuild) finds an active cell empty, the diagram is
    abandoned: uncertified cells, zero moments. (The damping's trials stay below the
    ``t`` at which the geometry's ``hiding_step`` proves a seed hidden.)
    """
    stop = trial is not None and _compat.host_any(xp, trial)
    geom = geometry.of_seeds(prob.seeds)
    capacity = geom.CAPACITY if capacity is None else capacity
    cells = geom.power_cells(xp, prob.seeds, psi, active, prob.lo, prob.hi, candidates, capacity,
                             previous=previous, stop_if_empty=stop, options=diagram)
    if stop and _compat.host_any(xp, ~cells.certified):
        return _without_integrals(xp, cells, prob.seeds.shape[1])
    moments, facet = prob.density.integrals(xp, prob.seeds, cells)
    return Evaluation(cells, moments, facet)


def _without_integrals(xp, cells, dim):
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
def _span(xp, d, active):
    """``max(d) - min(d)`` over the ``active`` entries."""
    return xp.max(xp.where(active, d, -xp.inf)) - xp.min(xp.where(active, d, xp.inf))


def _masked_min(xp, x, mask):
    return xp.min(xp.where(mask, x, xp.inf))


def _ratios(xp, moments, targets, active):
    """Each cell's mass over its target (inactive cells: their mass)."""
    return moments[:, 0] / xp.where(active, targets, 1.0)


def _worst_ratio(xp, moments, targets, active):
    """The smallest ratio of a cell's mass to its target, over the active cells."""
    return _masked_min(xp, _ratios(xp, moments, targets, active), active)


def _within(xp, moments, targets, active, low, high):
    """Whether every active cell holds between ``low`` and ``high`` times its target."""
    ratio = _ratios(xp, moments, targets, active)
    return (_masked_min(xp, ratio, active) >= low) & (xp.max(xp.where(active, ratio, 0.0)) <= high)


def _relative_error(xp, moments, targets, active):
    """The largest relative cell-mass error, over the active cells."""
    e = xp.abs(moments[:, 0] - targets) / xp.where(active, targets, 1.0)
    return xp.max(xp.where(active, e, 0.0))


def integrals_at(xp, prob, cells, width):
    """The :class:`Evaluation` of ``cells`` against the density blurred to ``width``
    (0: the density itself)."""
    moments, facet = _at_width(xp, prob.density, width).integrals(xp, prob.seeds, cells)
    return Evaluation(cells, moments, facet)


def _at_width(xp, density, width):
    """``density`` blurred to ``width`` (0: the density itself)."""
    return _compat.cond(width > 0, lambda: density.blurred(xp, width), lambda: density)


def initial_weights(xp, prob, active, targets, options, capacity=None):
    """The start: ``(psi, evaluation, width)``, the evaluation against the density blurred
    to ``width`` (0: the density itself).

    The Voronoi diagram (psi = 0) if every cell holds ``options.start_admissible`` of its
    target; else the best of it and the starts of :mod:`.starts` (the similarity and the
    ranks, which move the Diracs into the support's box): one that is admissible against
    the density itself, else the one whose poorest cell holds the largest share against the
    widest blur (a cell that misses the domain holds nothing; a cluster of Diracs 1e-5
    wide keeps its cells 1e-10 of their targets under a similarity, a few thousandths
    under the ranks). Unless that start is admissible, the continuation starts at the
    narrowest of the widths ``options.widest / 4^k`` (of the domain's size) at which every
    cell holds ``options.admissible`` of its target, and every wider one too (the widest if none).
    """
    zero = xp.zeros(prob.seeds.shape[:1], dtype=prob.seeds.dtype, device=aac.device(prob.seeds))
    ev = evaluate(xp, prob, zero, active, capacity=capacity, diagram=options.diagram)
    fair = _worst_ratio(xp, ev.moments, targets, active) >= options.start_admissible
    side = xp.max(prob.hi - prob.lo)
    widest = options.widest * side

    def score(ev):
        now = _worst_ratio(xp, ev.moments, targets, active)
        wide = _worst_ratio(xp, integrals_at(xp, prob, ev.cells, widest).moments, targets, active)
        return xp.where(now >= options.start_admissible, 2.0 + now, wide)

    def candidate(k):
        """The Voronoi start's evaluation (k = 0), or the similarity's (1), or the ranks' (2)."""
        psi1 = _compat.cond(k == 1, lambda: starts.similarity_weights(xp, prob, options),
                            lambda: starts.rank_weights(xp, prob, targets, options))
        return psi1, evaluate(xp, prob, psi1, active, capacity=ev.cells.labels.shape[1], diagram=options.diagram)

    def try_start(k, best):             # a loop, not three calls: one diagram, one score in the traced program
        psi1, ev1 = _compat.cond(k == 0, lambda: (zero, ev), lambda: candidate(k))
        s1 = score(ev1)
        return _compat.cond((k == 0) | (s1 > best[2]), lambda: (psi1, ev1, s1), lambda: best)

    def moved():
        return _compat.fori_loop(0, 3, try_start, (zero, ev, xp.full_like(side, -xp.inf)))[:2]
    psi, ev = _compat.cond(fair, lambda: (zero, ev), moved)
    fair = _worst_ratio(xp, ev.moments, targets, active) >= options.start_admissible
    width, ev = _compat.cond(fair, lambda: (xp.zeros_like(widest), ev),
                             lambda: first_width(xp, prob, ev.cells, active, targets, options))
    return psi, ev, width


def first_width(xp, prob, cells, active, targets, options):
    """``(width, evaluation)``: the continuation's first width for the diagram ``cells``, the
    narrowest of ``options.widest / 4^k`` (of the domain's size) at which every cell holds
    ``options.admissible`` of its target, and every wider one too (the widest if none),
    and the evaluation there."""
    side = xp.max(prob.hi - prob.lo)
    dev = aac.device(cells.count)

    def narrower(state):            # the widest first, kept whatever; then each narrower one while admissible
        width, _, ev, k = state
        trial = xp.where(k == 0, width, width / 4.0)
        ev_trial = integrals_at(xp, prob, cells, trial)
        ratio = _worst_ratio(xp, ev_trial.moments, targets, active)
        ok = (k == 0) | ((trial > options.min_width * side) & (ratio >= options.admissible))
        width, ev = _compat.cond(ok, lambda: (trial, ev_trial), lambda: (width, ev))
        return width, ok, ev, k + 1
    # the evaluation rides in the loop: one integration in a traced program
    start = (options.widest * side, xp.asarray(True, device=dev), _without_integrals(xp, cells, prob.seeds.shape[1]),
             xp.asarray(0, device=dev))
    width, _, ev, _ = _compat.while_loop(lambda state: state[1], narrower, start)
    return width, ev


class _Stage(NamedTuple):
    """The state of :func:`solve`: the weights and their evaluation against the density
    blurred to ``width`` (0: the density itself), the next narrowing ``ratio``, the
    damping's mass ``floor`` for this width, the Newton steps done, the max error against
    the targets, the next first trial ``first``, the last damping ``t`` and how many steps
    in a row stalled (no trial accepted), whether a trial's cells overflowed, whether
    the solve went through the continuation (from the start or from :func:`solve`'s restart),
    the last width > 0 and how many times the solve returned to it (its stages then solved
    more tightly), and whether no step was taken at this width yet."""

    psi: object
    ev: object
    width: object
    ratio: object
    floor: object
    it: object
    err: object
    first: object
    t: object
    stalls: object
    overflowed: object
    blurred: object
    last_width: object
    returns: object
    new_width: object


def solve(xp, prob, tol, max_iter, active, targets, log=None, capacity=None,
          options=DEFAULT):
    """Damped Newton from :func:`initial_weights`, through the widths of
    :mod:`.continuation` if the start needs them. Returns a :class:`Solution`.

    ``options`` (a :class:`.options.NewtonOptions`) holds the tuning values, the diagrams'
    and the linear solver's (``options.linear.solver()``, made here: under ``jax.jit``, once
    per trace, its first solve of each run ``fresh``). At a width
    ``s > 0`` Newton steps run until every cell is within ``options.stage_tol`` (relative)
    of its target (targets below ``options.wide_floor * s^options.floor_power`` times their
    mean raised to it, :func:`stage_targets`); then ``s`` narrows to 0 if every cell holds ``options.final_admissible``
    of its target against the density itself, else to ``s / r`` with the largest ``r`` (at
    most ``options.max_ratio``, halved in the exponent while a cell would hold less than
    ``options.admissible``); the density itself also asks that no cell hold more than
    ``options.most_admissible`` times its target. At width 0 the steps run to ``tol``; a first
    step there that would hide a seed before ``options.hopeless_step`` sends the solve to the
    blur (back to its last width after the continuation), as does a direction wider than the
    squared diameter. ``max_iter`` counts Newton
    steps. A step that no trial satisfies leaves the weights as they are; after
    ``options.stalls`` such steps in a row the solve stops (``Solution.status``).
    """
    psi, ev, width = initial_weights(xp, prob, active, targets, options, capacity)
    solver = options.linear.solver()        # this solve's: its kept factors are no other solve's
    dev = aac.device(psi)
    side = xp.max(prob.hi - prob.lo)
    spread = _masked_min(xp, targets, active) / xp.max(xp.where(active, targets, 0.0))
    dim = prob.seeds.shape[1]           # the Diracs' mean spacing, (volume / n)^(1/d)
    spacing = (xp.prod(prob.hi - prob.lo) / xp.maximum(xp.sum(xp.astype(active, psi.dtype)), 1.0)) ** (1.0 / dim)
    reach2 = squared_diameter(xp, prob.seeds, prob.lo, prob.hi)
    gauge = near_domain(xp, prob.seeds, active)      # the Diracs whose mean weight the steps keep


    def goal(width):
        return stage_targets(xp, targets, active, width / side, options)

    def error(mom, width):
        return _errors(xp, mom, goal(width), active)

    def floor_of(ev, width):
        return damping.mass_floor(xp, goal(width), ev.moments[:, 0], active)

    def at_width(width):
        return prob._replace(density=_at_width(xp, prob.density, width))

    def damped_step(stage_prob, stage_width, psi, ev, d, norm0, t1, floor):
        """Shrink ``t`` from ``t1`` until the step is accepted; ``(t, evaluation, accepted)``."""
        def trial(t):
            new = evaluate(xp, stage_prob, psi + t * d, active, capacity=ev.cells.labels.shape[1], previous=ev.cells,
                           trial=xp.asarray(True, device=dev), diagram=options.diagram)
            _, norm_t = error(new.moments, stage_width)
            return new, _accept(xp, new.moments, new.cells, active, floor, norm_t, norm0, t)

        def cond(state):
            t, _, ok, tried, _ = state
            return ~tried | (~ok & damping.more_trials(t, options))

        def loop_body(state):
            t = xp.where(state[3], options.backtrack * state[0], state[0])
            overflowed = state[4]
            del state                   # eagerly, the rejected diagram is freed before the next one
            new, ok = trial(t)
            return t, new, ok, xp.asarray(True, device=dev), overflowed | xp.any(new.cells.overflow)

        # the first trial runs in the loop's body too: one diagram in the traced program
        no = xp.asarray(False, device=dev)
        t, new, ok, _, overflowed = _compat.while_loop(cond, loop_body, (t1, ev, no, no, no))
        return t, new, ok, overflowed

    def newton_step(st):
        stage_prob = at_width(st.width)
        _, norm0 = error(st.ev.moments, st.width)
        # the hiding step bounds the first trial of the first step at each width, of the steps
        # after a damped one and of the continuation's (after a full step at width 0 a full step
        # rarely hides a seed, and the bound costs a pass over the cells); its fans,
        # eagerly on NumPy, on another core during the host's sparse solve
        geom = geometry.of_seeds(prob.seeds)
        bounded = st.new_width | (st.t < 1.0) | (st.width > 0)
        fans = None
        if not _compat.is_traced(bounded) and bool(bounded):
            fans = row_blocks.in_background(lambda: geom.fans(xp, prob.seeds, st.psi, active, st.ev.cells), st.psi)
        d = newton_direction(xp, prob, st.ev, active, goal(st.width) - st.ev.moments[:, 0], options.regularisation, solver,
                             damping.linear_rtol(xp, tol, norm0, st.t, spread, options), fresh=st.it == 0, gauge=gauge)
        # a direction wider than the squared diameter of the seeds and the domain (no weights of
        # nonempty cells differ by more) is that of a Newton matrix with a null direction per
        # piece of the support: cells in separate pieces, their masses unbalanced (Diracs
        # sampled inside two discs, 1010 and 990 for equal masses, crawled 171 steps); the
        # blur joins the pieces, so the continuation starts from here (once)
        # (or one that is not finite: a Newton matrix without a facet of positive integral)
        wide = ~(_span(xp, d, active) <= reach2)
        lost = (st.width == 0) & wide
        hidden_at = _compat.cond(bounded, lambda: geom.hiding_step(xp, prob.seeds, st.psi, d, active, st.ev.cells, fans),
                                 lambda: xp.full_like(st.first, xp.inf))
        # a start whose cells all hold their share, but whose first step hides a seed almost at
        # once, is far from the solution in the Newton model (a density that jumps): the
        # continuation starts from here instead
        lost = lost | ((st.width == 0) & st.new_width & (hidden_at < options.hopeless_step))

        def balance_trial(t, dd):
            new = evaluate(xp, stage_prob, st.psi + t * dd, active, capacity=st.ev.cells.labels.shape[1],
                           previous=st.ev.cells, trial=xp.asarray(True, device=dev), diagram=options.diagram)
            _, norm_t = error(new.moments, st.width)
            sound = new.cells.certified & ~xp.any(new.cells.overflow)
            past = ~sound | (balancing.slope(xp, dd, goal(st.width) - new.moments[:, 0], active) < 0)
            return new, past, _accept(xp, new.moments, new.cells, active, st.floor, norm_t, norm0, t)

        def proceed():
            t1 = damping.first_trial(xp, st.first, hidden_at, prob.seeds.shape[1], options)
            no = xp.asarray(False, device=dev)
            # a direction wider than the squared diameter (not finite included) that the blur
            # did not take: pieces balanced by a line search of the dual (:mod:`.balancing`);
            # damped, no trial reduced the residual (two Diracs against two pixels)
            def balanced():
                t, new, ok, scaled = balancing.balancing_step(
                    xp, balance_trial, d, goal(st.width) - st.ev.moments[:, 0], active, reach2, options.balance_bisections)
                return t, new, ok, no, scaled

            def damped():
                return damped_step(stage_prob, st.width, st.psi, st.ev, d, norm0, t1, st.floor) + (d,)
            t, new, ok, overflowed, step = _compat.cond(wide, lambda: (xp.zeros_like(st.t), st.ev, no, no, d), damped)
            # the step after a stalled one: if no damping is accepted again, the line search of
            # the dual along the direction (an ascent direction of the dual: <d, DG d> > 0);
            # one call for both cases: one line search in the traced program
            t, new, ok, overflowed, step = _compat.cond(
                wide | (~ok & (st.stalls > 0)), balanced, lambda: (t, new, ok, overflowed, step))
            psi, ev = _compat.cond(ok, lambda: (st.psi + t * step, new), lambda: (st.psi, st.ev))
            err = error(ev.moments, st.width)[0]
            if log is not None:
                _compat.host_call(log, st.it + 1, err, xp.where(ok, t, 0.0), st.width)
            first = damping.next_first(xp, t, st.first, options)
            return st._replace(psi=psi, ev=ev, it=st.it + 1, err=err, first=xp.where(ok, first, st.first),
                               t=xp.where(ok, t, 0.0), stalls=damping.stalls_after(xp, ok, t, st.stalls, options),
                               overflowed=st.overflowed | overflowed, new_width=xp.zeros_like(st.new_width))

        def restart():
            width, ev = first_width(xp, prob, st.ev.cells, active, targets, options)
            return st._replace(ev=ev, width=width, ratio=xp.full_like(st.ratio, options.first_ratio), floor=floor_of(ev, width),
                               err=error(ev.moments, width)[0], first=xp.ones_like(st.first), stalls=xp.zeros_like(st.stalls),
                               blurred=xp.asarray(True, device=dev), new_width=xp.asarray(True, device=dev))

        # lost again after the continuation: separate pieces whose cells' masses the loose
        # stages left unbalanced (the blur's tail alone joined them); back to the last width,
        # its stages and the next ones solved to ``options.tight_stage_tol^k`` at the k-th
        # return (at most ``options.returns``)
        def back():
            ev = integrals_at(xp, prob, st.ev.cells, st.last_width)
            return st._replace(ev=ev, width=st.last_width, ratio=xp.full_like(st.ratio, options.first_ratio),
                               floor=floor_of(ev, st.last_width), err=error(ev.moments, st.last_width)[0],
                               first=xp.ones_like(st.first), stalls=xp.zeros_like(st.stalls), returns=st.returns + 1,
                               new_width=xp.asarray(True, device=dev))
        return _compat.cond(lost & ~st.blurred, restart,
                            lambda: _compat.cond(lost & (st.returns < options.returns) & (st.last_width > 0), back, proceed))

    def narrowed(st):
        """The next width: the largest ``width / r`` admissible, ``r`` from ``st.ratio`` down
        to ``options.min_ratio`` (the last one taken even if not admissible), each next ``r``
        from :func:`.continuation.next_ratio`; 0 instead if that first ``r`` was admissible
        and the density itself is too."""
        def at(width):
            ev = integrals_at(xp, prob, st.ev.cells, width)
            worst = _worst_ratio(xp, ev.moments, goal(width), active)
            return worst >= options.admissible, ev, worst

        def width_for(ratio):
            return xp.where(st.width / ratio > options.min_width * side, st.width / ratio, 0.0)

        now = _worst_ratio(xp, st.ev.moments, goal(st.width), active)

        def cond(state):
            ratio, ok, _, _, tries = state
            return (tries == 0) | (~ok & (ratio > options.min_ratio))

        def body(state):
            ratio, _, _, worst, tries = state
            ratio = xp.where(tries > 0, continuation.next_ratio(xp, ratio, worst, now, options), ratio)
            return (ratio,) + at(width_for(ratio)) + (tries + 1,)
        no, zero = xp.asarray(False, device=dev), xp.zeros_like(st.it)
        ratio, ok, ev, worst, tries = _compat.while_loop(cond, body, (st.ratio, no, st.ev, now, zero))
        width = width_for(ratio)

        # the density itself, if the first narrowing was admissible and it is too (tried
        # only near the Diracs' spacing, or where the narrowing cost the poorest cell little)
        def at_zero():
            ev0 = integrals_at(xp, prob, st.ev.cells, xp.zeros_like(st.width))
            return _within(xp, ev0.moments, targets, active, options.final_admissible, options.most_admissible), ev0
        near = (st.width <= options.zero_check * spacing) | (worst >= 0.5 * now)
        to_zero, ev0 = _compat.cond(ok & (tries == 1) & (width > 0) & near & (st.returns == 0), at_zero, lambda: (no, ev))
        width, ev = _compat.cond(to_zero, lambda: (xp.zeros_like(width), ev0), lambda: (width, ev))
        ratio = xp.minimum(2.0 * ratio - 1.0, options.max_ratio)
        # the narrowest width reached, the density itself next: cells left in its zero region are lifted
        psi, ev = _compat.cond((width == 0) & ~to_zero, lambda: lifted(xp, prob, st.psi, ev, active, targets, options),
                               lambda: (st.psi, ev))
        return st._replace(psi=psi, ev=ev, width=width, ratio=ratio, floor=floor_of(ev, width), err=error(ev.moments, width)[0],
                           stalls=xp.zeros_like(st.stalls), first=xp.ones_like(st.first), last_width=st.width,
                           new_width=xp.asarray(True, device=dev))

    def stage_done(st):
        tight = xp.full_like(st.err, options.tight_stage_tol) ** xp.astype(st.returns, st.err.dtype)
        limit = xp.where(st.returns > 0, tight, options.stage_tol)
        return (st.width > 0) & (_relative_error(xp, st.ev.moments, goal(st.width), active) <= limit)

    def cond(st):
        return ((st.width > 0) | (st.err > tol)) & (st.it < max_iter) & ~damping.stopped(st.stalls, options)

    def body(st):
        return _compat.cond(stage_done(st), lambda: narrowed(st), lambda: newton_step(st))

    err0, _ = error(ev.moments, width)
    if log is not None:
        _compat.host_call(log, 0, err0, 0.0, width)
    zero = xp.asarray(0, device=dev)
    one = xp.asarray(1.0, dtype=psi.dtype, device=dev)
    held = [_Stage(psi, ev, width, xp.asarray(options.first_ratio, dtype=psi.dtype, device=dev), floor_of(ev, width), zero,
                   err0, one, one, zero, xp.asarray(False, device=dev), width > 0, width, zero, xp.asarray(True, device=dev))]
    del ev        # the first diagram is the loop's alone: freed once a step replaces it (at 1e6 3D seeds, 5.6 GB)
    st = _compat.while_loop_taking(cond, body, held)
    # a solve stopped before the last width reports the density itself
    ev = _compat.cond(st.width > 0, lambda: integrals_at(xp, prob, st.ev.cells, xp.zeros_like(st.width)),
                      lambda: st.ev)
    err, _ = error(ev.moments, xp.zeros_like(st.width))
    sound = ev.cells.certified & ~xp.any(ev.cells.overflow)
    converged = (err <= tol) & sound & (st.width == 0)
    code = lambda c: xp.asarray(c, device=dev)
    status = xp.where(converged, code(CONVERGED), xp.where(~sound, code(UNSOUND), xp.where(
        damping.stopped(st.stalls, options), code(STALLED), code(MAX_ITERATIONS))))
    return Solution(st.psi, ev, err, st.it, converged, status, st.width, st.t, st.overflowed)


@_compat.jit_on_jax("options")
def stage_targets(xp, targets, active, width, options):
    """The targets of the stage at ``width`` (of the domain's side): at ``width > 0`` each
    raised to at least ``options.wide_floor * width^options.floor_power`` times the mean
    target, then all scaled back to the same total; the targets themselves at width 0.

    Masses over six decades: at every narrowing of the blur the cells of tiny targets
    (1e-6 of the mean) were crushed by their neighbours' moves, steps damped to 0.02 (265
    Newton steps on an annulus, stalls on two discs). Raised, they shrink to their targets
    stage by stage (49 steps; 32 of 32 point sets on two discs and annuli converge, 28
    without the floor). Equal targets change only by rounding.
    """
    count = xp.maximum(xp.sum(xp.astype(active, targets.dtype)), 1.0)
    level = xp.where(width > 0, options.wide_floor * width ** options.floor_power * xp.sum(targets) / count, 0.0)
    raised = xp.where(active, xp.maximum(targets, level), 0.0)
    return raised * (xp.sum(targets) / xp.sum(raised))


def lifted(xp, prob, psi, ev, active, targets, options):
    """``(psi, evaluation)`` with the weights of the cells that hold less than
    ``options.final_admissible`` of their target raised until they hold it.

    Narrowed to the smallest width, the blur's tail still feeds cells of tiny targets
    outside the support (masses 1e-8 in the hole of an annulus, a few widths from its
    edge); against the density itself they hold nothing, their rows of the Newton matrix
    vanish, and the damping stalled at its floor. In a pass, the raises of those cells
    grow from ``h^2 / 1000`` (``h`` the mean spacing of the Diracs), doubled while a cell
    holds less (``G``), then are bisected (a cell that touches the support only at a
    corner would otherwise hold many times its target). Bisected together, neighbours
    can take each other's mass: a cell that holds too little at the end is put back to
    its ``G``, which lowered neighbours only help. A raised cell takes its neighbours'
    mass, and a neighbour of a tiny target may fall short in turn: up to
    ``options.lift_passes`` passes, each of at most ``options.lift_rounds`` doublings and
    ``options.lift_bisections`` bisections. Each round of a pass is one diagram.
    """
    n = xp.maximum(xp.sum(xp.astype(active, psi.dtype)), 1.0)
    power = 2.0 / prob.seeds.shape[1]         # h^2 = (volume / n)^(2/d)
    first = 1e-3 * xp.prod(prob.hi - prob.lo) ** power / n ** power
    cap = ev.cells.labels.shape[1]
    dev = aac.device(psi)
    yes, zero = xp.asarray(True, device=dev), xp.asarray(0, device=dev)

    def poor_of(ev):
        return active & (ev.moments[:, 0] < options.final_admissible * targets)

    def one_pass(state):
        psi, ev, k = state
        poor = poor_of(ev)

        def holding(step):
            new = evaluate(xp, prob, psi + step, active, capacity=cap, previous=ev.cells, diagram=options.diagram)
            return new, ~poor | (new.moments[:, 0] >= options.final_admissible * targets)

        def grow(state):
            step, _, k = state
            ok = holding(step)[1]
            return xp.where(ok, step, 2.0 * step), xp.any(~ok), k + 1

        def bisect(k, state):
            lo, hi = state
            mid = 0.5 * (lo + hi)
            ok = holding(mid)[1]
            return xp.where(ok, lo, mid), xp.where(ok, mid, hi)

        def restore(state):
            step, _, k = state
            ok = holding(step)[1]
            return xp.where(ok, step, grown), xp.any(~ok), k + 1

        more = lambda state: state[1] & (state[2] < options.lift_rounds)
        grown = _compat.while_loop(more, grow, (xp.where(poor, first, 0.0), yes, zero))[0]
        _, step = _compat.fori_loop(0, options.lift_bisections, bisect,
                                    (xp.where(grown > first, 0.5 * grown, 0.0), grown))
        step = _compat.while_loop(more, restore, (step, yes, zero))[0]
        return psi + step, holding(step)[0], k + 1

    psi, ev, _ = _compat.while_loop(lambda state: xp.any(poor_of(state[1])) & (state[2] < options.lift_passes),
                                    one_pass, (psi, ev, zero))
    return psi, ev


@_compat.jit_on_jax()
def _errors(xp, moments, targets, active):
    """Max and Euclidean norms of the cell-mass error."""
    e = xp.where(active, moments[:, 0] - targets, 0.0)
    return xp.max(xp.abs(e)), xp.sqrt(xp.sum(e * e))


def _accept(xp, moments, cells, active, eps0, norm_t, norm0, t):
    """:func:`.damping.accepted` of a trial's ``cells`` and ``moments``."""
    return damping.accepted(cells.certified & ~xp.any(cells.overflow), _masked_min(xp, moments[:, 0], active), eps0,
                            norm_t, norm0, t)
