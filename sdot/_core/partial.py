"""Partial transport: a source lighter than the target (damped Newton on capped cells).

Dirac i takes its mass ``m_i`` from its capped cell ``C_i = L_i & B_i``, its Laguerre cell cut
by the ball ``B_i = {|x - y_i|^2 <= psi_i}``; the density outside every ball stays. The
weights solve ``G(psi) = m`` with ``G_i`` the mass of ``C_i`` (they maximise the concave dual
``sum_i m_i psi_i + int min(min_i |x - y_i|^2 - psi_i, 0) rho``; no gauge: the balls fix them).
The Jacobian is the weighted Laplacian of :mod:`.newton_matrix` (its facets cut by the balls)
plus the diagonal ``A_ii = (int of rho along the arcs of C_i) / (2 sqrt(psi_i))``: symmetric
and, where every cell has an arc, positive definite. The steps are damped as in
:mod:`.newton` (Kitagawa, Merigot and Thibert): every cell keeps at least half the smallest of
its target and its first mass, and the error norm falls by ``1 - t / 2``. (One Newton loop for
both is issue 60's: this one is eager and has no continuation.)

The start: see :func:`initial_weights`.

2D grids of one value per cell only, eagerly (NumPy, PyTorch, concrete JAX arrays); the
other cases are refused by :func:`check_supported`.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from . import _compat, geometry
from .newton import CONVERGED, MAX_ITERATIONS, STALLED, Evaluation, Solution
from .newton_matrix import _facet_entries
from .options import DEFAULT
from .planar.capped import capped_integrals
from .planar.polygons import box_cells

#: Bisections of the starting radii.
START_BISECTIONS = 30
#: The share of its target that each ball alone holds at the start.
START_SHARE = 0.5


def check_supported(dim, pixels):
    """Raise ``NotImplementedError`` for the partial transport this version does not solve
    (``pixels``: the density has one value per grid cell)."""
    if dim != 2:
        raise NotImplementedError(f"partial transport (a target heavier than the source) is solved in 2D; "
                                  f"this source is {dim}D")
    if not pixels:
        raise NotImplementedError("partial transport is solved against grids of one value per cell "
                                  "(Grid / PolynomialGrid of degree 0); this target is a polynomial or spline grid")


def evaluate(xp, prob, psi, active):
    """``(Evaluation, arc)`` of the capped cells at weights ``psi`` (``arc``: per cell the
    density along its arcs)."""
    cells = geometry.of_seeds(prob.seeds).power_cells(xp, prob.seeds, psi, active, prob.lo, prob.hi)
    moments, facet, arc = capped_integrals(xp, prob.seeds, cells, xp.where(active, psi, 0.0),
                                           prob.density.values, prob.lo, prob.hi)
    return Evaluation(cells, moments, facet), arc


def _direction(xp, prob, ev, arc, psi, active, rhs, solver):
    """Solve ``(D + A - W) d = rhs`` (see the module docstring)."""
    rows, cols, w = _facet_entries(xp, prob.seeds, ev.cells, ev.facet)
    n = psi.shape[0]
    radius = xp.sqrt(xp.where(active, psi, 1.0))
    diag = _compat.segment_sum(xp, w, rows, n) + xp.where(active, arc / (2.0 * radius), 1.0)
    return xp.where(active, solver.solve(xp, rows, cols, w, diag, xp.where(active, rhs, 0.0), fresh=None), 0.0)


def initial_weights(xp, prob, active, targets):
    """Balls of area ``m_i / mean density`` if each capped cell then holds mass; else (zero
    regions, Diracs far from the support) each ball alone in the box holding
    :data:`START_SHARE` of its target (a bisection on every radius at once), if each capped
    cell then holds mass."""
    mean = float(xp.sum(prob.density.values)) / math.prod(prob.density.values.shape)
    psi = xp.where(active, targets / (math.pi * max(mean, 1e-300)), 0.0)
    ev, arc = evaluate(xp, prob, psi, active)
    if not bool(xp.any(active & (ev.moments[:, 0] <= 0))):
        return psi, ev, arc
    alone = box_cells(xp, prob.seeds, prob.lo, prob.hi, active, 4)
    low = xp.zeros_like(psi)
    high = xp.full_like(psi, 2.0 * float(xp.sum((prob.hi - prob.lo) ** 2)))    # the box from anywhere in it
    high = high + xp.max(xp.sum(xp.maximum(prob.lo - prob.seeds, prob.seeds - prob.hi) ** 2, axis=1))
    for _ in range(START_BISECTIONS):
        mid = 0.5 * (low + high)
        mass = capped_integrals(xp, prob.seeds, alone, mid, prob.density.values, prob.lo, prob.hi)[0][:, 0]
        enough = mass >= START_SHARE * targets
        low, high = xp.where(enough, low, mid), xp.where(enough, mid, high)
    psi = xp.where(active, high, 0.0)
    ev, arc = evaluate(xp, prob, psi, active)
    if bool(xp.any(active & (ev.moments[:, 0] <= 0))):
        raise NotImplementedError("partial transport: no start found where every Dirac takes mass (Diracs far "
                                  "from the support of the target, or in its zero regions, are not solved yet)")
    return psi, ev, arc


def solve(xp, prob, tol, max_iter, active, targets, log=None, options=None):
    """Damped Newton for partial transport: a :class:`.newton.Solution` (``width`` 0). Of the
    :class:`.options.NewtonOptions` ``options``, the steps use ``growth`` (the first trial of a
    step, times the last step's), ``backtrack`` and ``min_step`` (the shortest trial: shorter,
    the solve stalls) and the linear solver."""
    options = DEFAULT if options is None else options
    solver = options.linear.solver()
    psi, ev, arc = initial_weights(xp, prob, active, targets)

    def errors(ev):
        e = xp.where(active, targets - ev.moments[:, 0], 0.0)
        return e, float(xp.max(xp.abs(e))), float(xp.sqrt(xp.sum(e * e)))

    e, err, norm = errors(ev)
    floor = 0.5 * min(float(xp.min(xp.where(active, targets, xp.inf))),
                      float(xp.min(xp.where(active, ev.moments[:, 0], xp.inf))))
    it, t, status = 0, 1.0, CONVERGED
    while err > tol:
        if it >= max_iter:
            status = MAX_ITERATIONS
            break
        d = _direction(xp, prob, ev, arc, psi, active, e, solver)
        t = min(1.0, options.growth * t)
        while t >= options.min_step:
            trial = xp.where(active, psi + t * d, 0.0)
            new, new_arc = evaluate(xp, prob, trial, active)
            e_new, err_new, norm_new = errors(new)
            smallest = float(xp.min(xp.where(active, new.moments[:, 0], xp.inf)))
            if smallest >= floor and norm_new <= (1.0 - 0.5 * t) * norm:
                break
            t *= options.backtrack
        if t < options.min_step:
            status = STALLED
            break
        psi, ev, arc, e, err, norm = trial, new, new_arc, e_new, err_new, norm_new
        it += 1
        if log is not None:
            log(it, err, t, 0.0)
    if err <= tol:
        status = CONVERGED
    dev = aac.device(psi)
    real = lambda v: xp.asarray(v, dtype=psi.dtype, device=dev)       # noqa: E731
    return Solution(psi, ev, real(err), xp.asarray(it, device=dev), xp.asarray(status == CONVERGED, device=dev),
                    xp.asarray(status, device=dev), real(0.0), real(t), xp.asarray(False, device=dev))
