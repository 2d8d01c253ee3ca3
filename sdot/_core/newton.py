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

from . import _compat, balancing, continuation, damping, geometry, periodic, row_blocks, starts
from .evaluation import (CONVERGED, MAX_ITERATIONS, STALLED, UNSOUND, Solution, accept, at_width, errors, evaluate,
                         integrals_at, masked_min, relative_error, span, squared_diameter, within, worst_ratio)
from .newton_matrix import near_domain, newton_direction
from .options import DEFAULT


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


class _Run(NamedTuple):
    """What stays fixed during :func:`solve`: its arguments, the linear ``solver`` (its kept
    factors are this solve's), the domain's longest ``side``, the smallest target over the
    largest (``spread``), the Diracs' mean ``spacing``, the squared diameter ``reach2`` and the
    ``gauge`` (the Diracs whose mean weight the steps keep)."""

    xp: object
    prob: object
    tol: object
    active: object
    targets: object
    log: object
    options: object
    solver: object
    side: object
    spread: object
    spacing: object
    reach2: object
    gauge: object

    @property
    def dev(self):
        return aac.device(self.targets)

    def goal(self, width):
        """The targets of the stage at ``width``."""
        return continuation.stage_targets(self.xp, self.targets, self.active, width / self.side, self.options)

    def error(self, moments, width):
        """Max and Euclidean norms of the cell-mass error at ``width``."""
        return errors(self.xp, moments, self.goal(width), self.active)

    def floor_of(self, ev, width):
        return damping.mass_floor(self.xp, self.goal(width), ev.moments[:, 0], self.active)

    def on_sites(self, ev, *per_seed):
        """The sites of ``ev``'s cells and the arrays ``per_seed`` on them: the seeds and the
        arrays themselves, or on a periodic domain the seeds' images too (:mod:`.periodic`)."""
        prob = self.prob
        if prob.period is None:
            return (prob.seeds,) + per_seed
        sites, owner = periodic.sites_of(self.xp, prob, ev.cells)
        return (sites,) + tuple(self.xp.take(a, owner) for a in per_seed)

    def site_owner(self, ev):
        """The seed of each site of ``ev``'s cells on a periodic domain (:meth:`on_sites`), else None."""
        return None if self.prob.period is None else periodic.sites_of(self.xp, self.prob, ev.cells)[1]

    def at_width(self, width):
        return self.prob._replace(density=at_width(self.xp, self.prob.density, width, periodic.wrapping(self.prob)))

    def trial(self, stage_prob, width, psi, ev, floor, norm0, t):
        """``(evaluation, accepted)`` of the trial ``psi`` (``t``: its damping)."""
        xp = self.xp
        new = evaluate(xp, stage_prob, psi, self.active, capacity=ev.cells.labels.shape[1], previous=ev.cells,
                       trial=xp.asarray(True, device=self.dev), diagram=self.options.diagram)
        _, norm_t = self.error(new.moments, width)
        return new, accept(xp, new.moments, new.cells, self.active, floor, norm_t, norm0, t)


def solve(xp, prob, tol, max_iter, active, targets, log=None, capacity=None,
          options=DEFAULT):
    """Damped Newton from :func:`.starts.initial_weights`, through the widths of
    :mod:`.continuation` if the start needs them. Returns a :class:`Solution`.

    ``options`` (a :class:`.options.NewtonOptions`) holds the tuning values, the diagrams'
    and the linear solver's (``options.linear.solver()``, made here: under ``jax.jit``, once
    per trace, its first solve of each run ``fresh``). At a width
    ``s > 0`` Newton steps run until every cell is within ``options.stage_tol`` (relative)
    of its target (targets below ``options.wide_floor * s^options.floor_power`` times their
    mean raised to it, :func:`.continuation.stage_targets`); then ``s`` narrows (:func:`_narrowed`).
    At width 0 the steps run to ``tol``; a first
    step there that would hide a seed before ``options.hopeless_step`` sends the solve to the
    blur (back to its last width after the continuation), as does a direction wider than the
    squared diameter (:func:`_newton_step`). ``max_iter`` counts Newton
    steps. A step that no trial satisfies leaves the weights as they are; after
    ``options.stalls`` such steps in a row the solve stops (``Solution.status``).
    """
    psi, ev, width = starts.initial_weights(xp, prob, active, targets, options, capacity)
    dev = aac.device(psi)
    dim = prob.seeds.shape[1]           # the Diracs' mean spacing, (volume / n)^(1/d)
    run = _Run(xp, prob, tol, active, targets, log, options, options.linear.solver(), xp.max(prob.hi - prob.lo),
               masked_min(xp, targets, active) / xp.max(xp.where(active, targets, 0.0)),
               (xp.prod(prob.hi - prob.lo) / xp.maximum(xp.sum(xp.astype(active, psi.dtype)), 1.0)) ** (1.0 / dim),
               squared_diameter(xp, prob.seeds, prob.lo, prob.hi), near_domain(xp, prob.seeds, active))

    def cond(st):
        return ((st.width > 0) | (st.err > tol)) & (st.it < max_iter) & ~damping.stopped(st.stalls, options)

    def body(st):
        return _compat.cond(_stage_done(run, st), lambda: _narrowed(run, st), lambda: _newton_step(run, st))

    err0, _ = run.error(ev.moments, width)
    if log is not None:
        _compat.host_call(log, 0, err0, 0.0, width)
    zero = xp.asarray(0, device=dev)
    one = xp.asarray(1.0, dtype=psi.dtype, device=dev)
    held = [_Stage(psi, ev, width, xp.asarray(options.first_ratio, dtype=psi.dtype, device=dev), run.floor_of(ev, width),
                   zero, err0, one, one, zero, xp.asarray(False, device=dev), width > 0, width, zero,
                   xp.asarray(True, device=dev))]
    del ev        # the first diagram is the loop's alone: freed once a step replaces it (at 1e6 3D seeds, 5.6 GB)
    st = _compat.while_loop_taking(cond, body, held)
    # a solve stopped before the last width reports the density itself
    ev = _compat.cond(st.width > 0, lambda: integrals_at(xp, prob, st.ev.cells, xp.zeros_like(st.width)),
                      lambda: st.ev)
    err, _ = run.error(ev.moments, xp.zeros_like(st.width))
    sound = ev.cells.certified & ~xp.any(ev.cells.overflow)
    converged = (err <= tol) & sound & (st.width == 0)
    code = lambda c: xp.asarray(c, device=dev)      # noqa: E731
    status = xp.where(converged, code(CONVERGED), xp.where(~sound, code(UNSOUND), xp.where(
        damping.stopped(st.stalls, options), code(STALLED), code(MAX_ITERATIONS))))
    return Solution(st.psi, ev, err, st.it, converged, status, st.width, st.t, st.overflowed)


def _trials(run, stage_prob, st, d, rhs, norm0, t1, wide):
    """``(t, evaluation, accepted, overflowed, step)``: the damping's trials along ``d``, from
    ``t1`` then ``options.backtrack`` times smaller while rejected (:mod:`.damping`); where none
    is accepted after a stalled step, or at once where ``d`` is ``wide``, the line search of the
    dual along it (:mod:`.balancing`; ``step`` its scaled direction). One loop, one diagram per
    pass: one evaluation in a traced program instead of two (at 1e3 Diracs in 2D, 18% fewer
    equations)."""
    xp, options, active = run.xp, run.options, run.active
    scaled = balancing.direction(xp, d, rhs, active, run.reach2)

    def past(new):                  # beyond the line's maximum (or unsound): the search's side
        sound = new.cells.certified & ~xp.any(new.cells.overflow)
        return ~sound | (balancing.slope(xp, scaled, run.goal(st.width) - new.moments[:, 0], active) < 0)

    def cond(state):
        damped, t, _, tried, ok, _, search = state
        return xp.where(damped, ~tried | (~ok & damping.more_trials(t, options)),
                        balancing.more(search, options.balance_bisections))

    def body(state):
        damped, t, tried, overflowed, search = state[0], state[1], state[3], state[5], state[6]
        del state                   # eagerly, the rejected diagram is freed before the next one
        t = xp.where(damped, xp.where(tried, options.backtrack * t, t), balancing.next_t(xp, search))
        new, ok = run.trial(stage_prob, st.width, st.psi + t * xp.where(damped, d, scaled), st.ev, st.floor, norm0,
                            t)
        search = _compat.cond(damped, lambda: search, lambda: balancing.after(xp, search, t, new, past(new), ok))
        # the damping rejected its last trial after a stalled step: the line search next
        turn = damped & ~ok & ~damping.more_trials(t, options) & (st.stalls > 0)
        return damped & ~turn, t, new, xp.ones_like(tried), ok, overflowed | xp.any(new.cells.overflow), search

    no = xp.asarray(False, device=run.dev)
    state = (~wide, t1, st.ev, no, no, no, balancing.start(xp, st.ev, t1))
    damped, t, new, _, ok, overflowed, search = _compat.while_loop(cond, body, state)

    def searched():
        return balancing.result(search, t, new) + (no, scaled)
    return _compat.cond(damped, lambda: (t, new, ok, overflowed, d), searched)


def _newton_step(run, st):
    """One Newton step at the stage's width (or the start of the continuation, or the
    return to its last width: see :func:`solve`)."""
    xp, prob, active, options = run.xp, run.prob, run.active, run.options
    dev = run.dev
    stage_prob = run.at_width(st.width)
    _, norm0 = run.error(st.ev.moments, st.width)
    # the hiding step bounds the first trial of the first step at each width, of the steps
    # after a damped one and of the continuation's (after a full step at width 0 a full step
    # rarely hides a seed, and the bound costs a pass over the cells); its fans,
    # eagerly on NumPy, on another core during the host's sparse solve
    geom = geometry.of_seeds(prob.seeds)
    bounded = st.new_width | (st.t < 1.0) | (st.width > 0)
    fans = None
    if not _compat.is_traced(bounded) and bool(bounded):
        fans = row_blocks.in_background(lambda: geom.fans(xp, *run.on_sites(st.ev, st.psi, active), st.ev.cells),
                                        st.psi)
    rhs = run.goal(st.width) - st.ev.moments[:, 0]
    d = newton_direction(xp, prob, st.ev, active, rhs, options.regularisation, run.solver,
                         damping.linear_rtol(xp, run.tol, norm0, st.t, run.spread, options), fresh=st.it == 0,
                         gauge=run.gauge)
    # a direction wider than the squared diameter of the seeds and the domain (no weights of
    # nonempty cells differ by more) is that of a Newton matrix with a null direction per
    # piece of the support: cells in separate pieces, their masses unbalanced (Diracs
    # sampled inside two discs, 1010 and 990 for equal masses, crawled 171 steps); the
    # blur joins the pieces, so the continuation starts from here (once)
    # (or one that is not finite: a Newton matrix without a facet of positive integral)
    wide = ~(span(xp, d, active) <= run.reach2)
    lost = (st.width == 0) & wide
    hidden_at = _compat.cond(bounded, lambda: geom.hiding_step(xp, *run.on_sites(st.ev, st.psi, d, active),
                                                                st.ev.cells, fans, run.site_owner(st.ev)),
                             lambda: xp.full_like(st.first, xp.inf))
    # a start whose cells all hold their share, but whose first step hides a seed almost at
    # once, is far from the solution in the Newton model (a density that jumps): the
    # continuation starts from here instead
    lost = lost | ((st.width == 0) & st.new_width & (hidden_at < options.hopeless_step))

    def proceed():
        t1 = damping.first_trial(xp, st.first, hidden_at, prob.seeds.shape[1], options)
        t, new, ok, overflowed, step = _trials(run, stage_prob, st, d, rhs, norm0, t1, wide)
        psi, ev = _compat.cond(ok, lambda: (st.psi + t * step, new), lambda: (st.psi, st.ev))
        err = run.error(ev.moments, st.width)[0]
        if run.log is not None:
            _compat.host_call(run.log, st.it + 1, err, xp.where(ok, t, 0.0), st.width)
        first = damping.next_first(xp, t, st.first, options)
        return st._replace(psi=psi, ev=ev, it=st.it + 1, err=err, first=xp.where(ok, first, st.first),
                           t=xp.where(ok, t, 0.0), stalls=damping.stalls_after(xp, ok, t, st.stalls, options),
                           overflowed=st.overflowed | overflowed, new_width=xp.zeros_like(st.new_width))

    def restart():
        width, ev = continuation.first_width(xp, prob, st.ev.cells, active, run.targets, options)
        return st._replace(ev=ev, width=width, ratio=xp.full_like(st.ratio, options.first_ratio),
                           floor=run.floor_of(ev, width), err=run.error(ev.moments, width)[0],
                           first=xp.ones_like(st.first), stalls=xp.zeros_like(st.stalls),
                           blurred=xp.asarray(True, device=dev), new_width=xp.asarray(True, device=dev))

    # lost again after the continuation: separate pieces whose cells' masses the loose
    # stages left unbalanced (the blur's tail alone joined them); back to the last width,
    # its stages and the next ones solved to ``options.tight_stage_tol^k`` at the k-th
    # return (at most ``options.returns``)
    def back():
        ev = integrals_at(xp, prob, st.ev.cells, st.last_width)
        return st._replace(ev=ev, width=st.last_width, ratio=xp.full_like(st.ratio, options.first_ratio),
                           floor=run.floor_of(ev, st.last_width), err=run.error(ev.moments, st.last_width)[0],
                           first=xp.ones_like(st.first), stalls=xp.zeros_like(st.stalls), returns=st.returns + 1,
                           new_width=xp.asarray(True, device=dev))
    return _compat.cond(lost & ~st.blurred, restart,
                        lambda: _compat.cond(lost & (st.returns < options.returns) & (st.last_width > 0), back, proceed))


def _narrowed(run, st):
    """The next width: the largest ``width / r`` at which every cell holds
    ``options.admissible`` of its target, ``r`` from ``st.ratio`` down to ``options.min_ratio``
    (the last one taken even if not admissible), each next ``r`` from
    :func:`.continuation.next_ratio`; 0 instead if that first ``r`` was admissible and the
    density itself is too (every cell holds ``options.final_admissible`` of its target and
    none more than ``options.most_admissible`` times it). The next ``ratio`` is ``2 r - 1``, at
    most ``options.max_ratio``."""
    xp, prob, active, options = run.xp, run.prob, run.active, run.options
    dev = run.dev

    def at(width):
        ev = integrals_at(xp, prob, st.ev.cells, width)
        worst = worst_ratio(xp, ev.moments, run.goal(width), active)
        return worst >= options.admissible, ev, worst

    def width_for(ratio):
        return xp.where(st.width / ratio > options.min_width * run.side, st.width / ratio, 0.0)

    now = worst_ratio(xp, st.ev.moments, run.goal(st.width), active)

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
        return within(xp, ev0.moments, run.targets, active, options.final_admissible, options.most_admissible), ev0
    near = (st.width <= options.zero_check * run.spacing) | (worst >= 0.5 * now)
    to_zero, ev0 = _compat.cond(ok & (tries == 1) & (width > 0) & near & (st.returns == 0), at_zero, lambda: (no, ev))
    width, ev = _compat.cond(to_zero, lambda: (xp.zeros_like(width), ev0), lambda: (width, ev))
    ratio = xp.minimum(2.0 * ratio - 1.0, options.max_ratio)
    # the narrowest width reached, the density itself next: cells left in its zero region are lifted
    psi, ev = _compat.cond((width == 0) & ~to_zero,
                           lambda: continuation.lifted(xp, prob, st.psi, ev, active, run.targets, options),
                           lambda: (st.psi, ev))
    return st._replace(psi=psi, ev=ev, width=width, ratio=ratio, floor=run.floor_of(ev, width),
                       err=run.error(ev.moments, width)[0], stalls=xp.zeros_like(st.stalls),
                       first=xp.ones_like(st.first), last_width=st.width, new_width=xp.asarray(True, device=dev))


def _stage_done(run, st):
    """Whether the stage at a width > 0 is solved: every cell within ``options.stage_tol``
    (relative) of its stage target, ``options.tight_stage_tol^k`` after the k-th return."""
    xp = run.xp
    tight = xp.full_like(st.err, run.options.tight_stage_tol) ** xp.astype(st.returns, st.err.dtype)
    limit = xp.where(st.returns > 0, tight, run.options.stage_tol)
    return (st.width > 0) & (relative_error(xp, st.ev.moments, run.goal(st.width), run.active) <= limit)
