"""Derivatives of the optimal plan by implicit differentiation (the differentiable plan).

At the optimum the mass of every cell equals its target, ``G(psi, y, rho, box) = m``.
Along a perturbation ``(dy, dm, drho, dlo, dhi)`` the facet between cells i and j
(``e = y_j - y_i``, ``D = |e|``, ``u = x - y_i``) moves outward from cell i at the normal
speed ``w(u) = (dpsi_i - dpsi_j + 2 e.dy_j) / (2 D) + u.(dy_i - dy_j) / D``; a change of the box
``[lo, hi]`` (the grid's values kept) moves the density along ``V(x) = dlo + s'.(x - lo)``
(``s' = (dhi - dlo) / (hi - lo)`` per axis) and scales it by ``1 + tr s'``. With the facet
moments ``f0, f1, f2 = int_F rho (1, u, u u^T)`` and ``omega = w - V.n`` on each facet:

- ``dG_i = sum_F (omega_0 f0 + omega_1.f1) + int_{L_i} drho + tr(s') G_i``;
- ``dR_i = sum_F (omega_0 f1 + f2 omega_1) - G_i dy_i + int_{L_i} u drho + tr(s') R_i
  + G_i V(y_i) + s'.R_i`` for the first moments ``R_i = int_{L_i} u rho``;

``dG = dm`` gives ``dpsi`` by one solve with the Newton matrix (the weighted Laplacian of
the ``dpsi`` terms), and then ``db_i = dy_i + dR_i / G_i - R_i dm_i / G_i^2`` for the
barycentres ``b_i = y_i + R_i / G_i``. W2^2 has the first derivatives of
:mod:`.gradients`, and the pixel integrals of ``phi`` (``dW/drho``) change by those of
``-2 u.dy_i - dpsi_i`` on each cell (``phi`` is continuous: moving facets add nothing).

:func:`tangents` is this linear map (a Jacobian-vector product) and :func:`cotangents`
its transpose (a vector-Jacobian product), both in the array namespace ``xp``, with one
sparse solve each. Exact duplicates move as their group (their mass-weighted mean motion)
and share its cell; zero-mass Diracs have empty cells (their barycentre is their position).
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat, evaluation, newton_matrix, periodic
from .density import grid_density
from .gradients import GradientState, gradients

#: Regulariser of the Newton matrix in the derivative's solve (times its mean diagonal):
#: smaller than the Newton steps' (their FP32 solves need more), whose bias it would be.
REGULARISATION = {8: 1e-13, 4: 1e-7}


class Linearization(NamedTuple):
    """A solved problem, what its derivatives need (a pytree of arrays): the inputs
    (``seeds``, ``masses``, the density ``values`` on ``[lo, hi]``), the optimal ``cells``,
    their ``moments`` (n, d + 2) and Newton-matrix ``facet`` integrals, the weights ``psi``
    (mean 0 over the active Diracs), the duplicate groups ``rep``, ``active``, ``targets``; on a
    periodic domain the ``sites`` of the cells and the seed of each (``owner``, :mod:`.periodic`)."""

    seeds: object
    masses: object
    values: object
    lo: object
    hi: object
    cells: object
    moments: object
    facet: object
    psi: object
    rep: object
    active: object
    targets: object
    sites: object = None
    owner: object = None


class Facets(NamedTuple):
    """The facets of the optimal cells as a flat list (P,): cell ``row``, neighbour ``col``,
    ``e = y_col - y_row``, ``dist = |e|`` (1 where not ``valid``), and the density's moments
    ``f0`` (P,), ``f1`` (P, d), ``f2`` (P, d, d) over the facet, about ``y_row``."""

    row: object
    col: object
    valid: object
    e: object
    dist: object
    f0: object
    f1: object
    f2: object


def facets(xp, lin):
    """The :class:`Facets` of ``lin``'s cells (eagerly the slots with a neighbour only)."""
    sites = _sites(lin)
    f0, f1, f2 = _density(lin, lin.values).facet_moments(xp, sites, lin.cells)
    n, cap = lin.cells.labels.shape
    d = lin.seeds.shape[1]
    is_facet = xp.reshape((lin.cells.labels >= 0) & (f0 != 0), (-1,))
    slot, valid = _compat.rows_where(xp, is_facet)
    valid = valid & xp.take(is_facet, slot)
    row = slot // cap
    col = xp.where(valid, xp.take(xp.reshape(lin.cells.labels, (-1,)), slot), row)
    e = xp.take(sites, col, axis=0) - xp.take(sites, row, axis=0)
    dist = xp.where(valid, xp.sqrt(_compat.dot(e, e)), 1.0)
    keep = lambda a, shape: xp.where(xp.reshape(valid, (-1,) + (1,) * (len(shape) - 1)),  # noqa: E731
                                     xp.take(xp.reshape(a, (n * cap,) + shape[1:]), slot, axis=0), 0.0)
    if lin.owner is not None:       # a periodic domain: the facets of the sites are the seeds' (moments about the site)
        row, col = xp.take(lin.owner, row), xp.take(lin.owner, col)
    return Facets(row, col, valid, e, dist, keep(f0, (n * cap,)), keep(f1, (n * cap, d)),
                  keep(f2, (n * cap, d, d)))


def _sites(lin):
    """The sites of ``lin``'s cells: the seeds, or on a periodic domain the seeds and their images."""
    return lin.seeds if lin.sites is None else lin.sites


def _cell_moments(xp, lin, values):
    """Per Dirac ``int_{L_i} (1, u) rho`` of the density of ``values`` (on a periodic domain,
    summed over the Dirac's sites, :mod:`.periodic`)."""
    mom = _density(lin, values).integrals(xp, _sites(lin), lin.cells)[0]
    return mom if lin.owner is None else periodic.folded_rows(xp, mom, lin.owner, lin.seeds.shape[0])


def _state(lin):
    return GradientState(lin.cells, lin.moments, lin.psi, lin.rep, lin.active, lin.targets, lin.sites, lin.owner)


def _no_periodic_domain_motion(lin, dlo, dhi):
    """Raise if the domain moves on a periodic domain: a tangent not None and not all 0 (``torch.func``
    passes zeros), or a cotangent wanted (True)."""
    moving = [d is True or (d is not None and d is not False and bool(_compat.namespace(d).any(d != 0)))
              for d in (dlo, dhi)]
    if lin.sites is not None and any(moving):
        raise NotImplementedError("derivatives with respect to the grid's domain are not implemented on a periodic "
                                  "domain (metric=PeriodicMetric) yet: the period moves with it")


class Tangents(NamedTuple):
    """Tangents (or cotangents) of the plan's outputs: ``barycenters`` (n, d),
    ``brenier_potential`` (n,), ``cell_masses`` (n,), ``distance`` (), ``potential`` (the pixel
    integrals of ``phi``, the density's shape); None for those not asked (not given)."""

    barycenters: object = None
    brenier_potential: object = None
    cell_masses: object = None
    distance: object = None
    potential: object = None


class Inputs(NamedTuple):
    """Tangents (or cotangents) of the inputs: ``seeds`` (n, d), ``masses`` (n,), ``values``
    (the density's shape), ``lo`` and ``hi`` (d,); None for zero."""

    seeds: object = None
    masses: object = None
    values: object = None
    lo: object = None
    hi: object = None


def _shares(xp, lin):
    """Each Dirac's share of its group's mass (0 in groups of zero mass), and the group's mass."""
    group = xp.take(lin.targets, lin.rep)
    return xp.where(group > 0, lin.masses / xp.where(group > 0, group, 1.0), 0.0), group


def _zeros(xp, lin, shape):
    return xp.zeros(shape, dtype=lin.seeds.dtype, device=aac.device(lin.seeds))


def _solve(xp, lin, rhs, solver, fresh=True):
    """``L x = rhs`` for the Newton matrix ``L`` at the optimum, in the gauge mean(x) = 0 over
    the active cells (``rhs`` centred first): symmetric, its own transpose. ``fresh``: the
    ``solver`` holds nothing of this problem (else its kept factors may precondition)."""
    prob = evaluation.Problem(lin.seeds, None, None)
    ev = evaluation.Evaluation(lin.cells, lin.moments, lin.facet)
    sites = None if lin.sites is None else (lin.sites, lin.owner)
    reg = REGULARISATION[8 if lin.seeds.dtype == xp.float64 else 4]
    rtol = xp.asarray(1e-13 if lin.seeds.dtype == xp.float64 else 1e-6, dtype=lin.seeds.dtype,
                      device=aac.device(lin.seeds))
    return newton_matrix.newton_direction(xp, prob, ev, lin.active, rhs, reg, solver, rtol=rtol,
                                   fresh=xp.asarray(fresh, device=aac.device(lin.seeds)), sites=sites)


def _density(lin, values):
    return grid_density(values, lin.lo, lin.hi)


def tangents(xp, lin, fac, dx, solver, wanted=Tangents(True, True, True, True, True), fresh=True):
    """The plan's output tangents (:class:`Tangents`, those ``wanted``) along the input
    tangents ``dx`` (:class:`Inputs`); ``fac`` the :func:`facets` of ``lin``; the sparse solve
    by ``solver`` (``fresh``: see :func:`_solve`)."""
    n, d = lin.seeds.shape
    _no_periodic_domain_motion(lin, dx.lo, dx.hi)
    share, group = _shares(xp, lin)
    g, r = lin.moments[:, 0], lin.moments[:, 1:d + 1]
    dy = _zeros(xp, lin, (n, d)) if dx.seeds is None else dx.seeds
    dm = _zeros(xp, lin, (n,)) if dx.masses is None else dx.masses
    # the groups move as one: the mass-weighted mean motion, the summed masses
    dY = xp.where(lin.active[:, None], _compat.segment_sum(xp, share[:, None] * dy, lin.rep, n), dy)
    dT = xp.where(lin.active, _compat.segment_sum(xp, dm, lin.rep, n), 0.0)
    # sources: the density's change, the box's
    src_g, src_r = _zeros(xp, lin, (n,)), _zeros(xp, lin, (n, d))
    if dx.values is not None:
        mom = _cell_moments(xp, lin, dx.values)
        src_g, src_r = src_g + mom[:, 0], src_r + mom[:, 1:d + 1]
    v0, rate = _box_motion(xp, lin, dx)
    vy = v0[None, :] + rate[None, :] * (lin.seeds - lin.lo[None, :])        # V(y_i)
    tr = xp.sum(rate)
    src_g = src_g + tr * g
    src_r = src_r + tr * r + g[:, None] * vy + rate[None, :] * r
    # facets: the part of the speed that does not depend on dpsi
    e_over = fac.e / fac.dist[:, None]
    dY_row, dY_col = xp.take(dY, fac.row, axis=0), xp.take(dY, fac.col, axis=0)
    w0 = _compat.dot(e_over, dY_col) - _compat.dot(e_over, xp.take(vy, fac.row, axis=0))
    w1 = (dY_row - dY_col) / fac.dist[:, None] - rate[None, :] * e_over
    known_g = _compat.segment_sum(xp, w0 * fac.f0 + _compat.dot(w1, fac.f1), fac.row, n)
    rhs = xp.where(lin.active, dT - known_g - src_g, 0.0)
    dpsi = _solve(xp, lin, rhs, solver, fresh)
    w0 = w0 + (xp.take(dpsi, fac.row) - xp.take(dpsi, fac.col)) / (2.0 * fac.dist)
    facet_r = w0[:, None] * fac.f1 + xp.sum(fac.f2 * w1[:, None, :], axis=2)
    dR = _compat.segment_sum(xp, facet_r, fac.row, n) - g[:, None] * dY + src_r
    out = {}
    if wanted.barycenters is not None:
        has = g > 0
        safe = xp.where(has, g, 1.0)
        db = xp.where(has[:, None], dY + dR / safe[:, None] - r * (dT / (safe * safe))[:, None], dy)
        out["barycenters"] = xp.take(db, lin.rep, axis=0)
    if wanted.brenier_potential is not None:
        out["brenier_potential"] = _potential_tangent(xp, lin, dpsi, dy, dx)
    if wanted.cell_masses is not None:
        g_rep = xp.take(g, lin.rep)
        d_share = xp.where(group > 0, (dm - share * xp.take(dT, lin.rep)) / xp.where(group > 0, group, 1.0), 0.0)
        out["cell_masses"] = xp.take(xp.where(lin.active, dT, 0.0), lin.rep) * share + g_rep * d_share
    if wanted.distance is not None:
        out["distance"] = _distance_tangent(xp, lin, dx, dy, dm, vy, rate, tr)
    if wanted.potential is not None:
        coef = xp.concat([-dpsi[:, None], -2.0 * dY, _zeros(xp, lin, (n, 1))], axis=1)
        out["potential"] = _polynomial_integrals(xp, lin, coef)
    return Tangents(**out)


def _box_motion(xp, lin, dx):
    """``(dlo, s')``: the box's translation and relative stretch per axis (zeros if none)."""
    d = lin.seeds.shape[1]
    dlo = _zeros(xp, lin, (d,)) if dx.lo is None else dx.lo
    dhi = _zeros(xp, lin, (d,)) if dx.hi is None else dx.hi
    return dlo, (dhi - dlo) / (lin.hi - lin.lo)


def _polynomial_integrals(xp, lin, coef):
    """Per pixel the integral of the polynomial of coefficients ``coef`` (n, k) of each Dirac
    (:func:`.planar.sensitivity.polynomial_integrals`; on a periodic domain, on every site)."""
    if lin.owner is not None:
        coef = xp.take(coef, lin.owner, axis=0)
    return _density(lin, lin.values).polynomial_integrals(xp, _sites(lin), lin.cells, coef)


def _distance_tangent(xp, lin, dx, dy, dm, vy, rate, tr):
    """``dW``: the first derivatives of :mod:`.gradients` along ``dx``, and the box's term
    ``tr(s') int phi rho + sum_i int_{L_i} 2 u.V rho``."""
    n, d = lin.seeds.shape
    state = _state(lin)
    needs = (dx.seeds is not None, dx.masses is not None, dx.values is not None)
    gy, gm, grho = gradients(xp, lin.seeds, lin.masses, _density(lin, lin.values), state, needs)
    total = xp.zeros((), dtype=lin.seeds.dtype, device=aac.device(lin.seeds))
    if gy is not None:
        total = total + xp.sum(gy * dy)
    if gm is not None:
        total = total + xp.sum(gm * dm)
    if grho is not None:
        total = total + xp.sum(grho * dx.values)
    if dx.lo is not None or dx.hi is not None:
        g, r = lin.moments[:, 0], lin.moments[:, 1:d + 1]
        q = _axis_second_moments(xp, lin)
        live = lin.active
        w = xp.sum(xp.where(live, lin.moments[:, -1], 0.0))
        phi_rho = w - xp.sum(xp.where(live, lin.psi * g, 0.0))
        moved = 2.0 * (_compat.dot(vy, r) + _compat.dot(q, xp.broadcast_to(rate[None, :], q.shape)))
        total = total + tr * phi_rho + xp.sum(xp.where(live, moved, 0.0))
    return total


def _axis_second_moments(xp, lin):
    return _density(lin, lin.values).axis_second_moments(xp, lin.seeds, lin.cells)


def _potential_tangent(xp, lin, dpsi, dy, dx):
    """The tangent of the plan's ``brenier_potential`` (see :func:`.plan._plan_arrays`): the
    group's weight, mean 0 over the Diracs of positive mass; a zero-mass Dirac's
    ``min(psi) - D^2`` (``D`` the diameter of the seeds and the box)."""
    lives = xp.take(lin.active, lin.rep)
    ranked = xp.where(lin.active, lin.psi, xp.inf)
    lowest = xp.argmin(ranked)
    d_min = xp.take(dpsi, xp.reshape(lowest, (1,)))[0]
    d_diam2 = _diameter_tangent(xp, lin, dy, dx)
    out = xp.where(lives, xp.take(dpsi, lin.rep), d_min - d_diam2)
    count = xp.maximum(xp.sum(xp.astype(lives, out.dtype)), 1.0)
    return out - xp.sum(xp.where(lives, out, 0.0)) / count


def _span(xp, lin, dy, dx):
    d = lin.seeds.shape[1]
    dlo = _zeros(xp, lin, (d,)) if dx.lo is None else dx.lo
    dhi = _zeros(xp, lin, (d,)) if dx.hi is None else dx.hi
    span = xp.concat([lin.seeds, lin.lo[None, :], lin.hi[None, :]], axis=0)
    return span, xp.concat([dy, dlo[None, :], dhi[None, :]], axis=0)


def _diameter_tangent(xp, lin, dy, dx):
    """The tangent of ``D^2 = sum_a (max_a - min_a)^2`` over the seeds and the box's corners."""
    span, d_span = _span(xp, lin, dy, dx)
    top, bottom = xp.argmax(span, axis=0), xp.argmin(span, axis=0)
    d = span.shape[1]
    axes = xp.arange(d, dtype=xp.int64, device=aac.device(span))
    pick = lambda a, idx: xp.take(xp.reshape(a, (-1,)), idx * d + axes)     # noqa: E731
    width = pick(span, top) - pick(span, bottom)
    return xp.sum(2.0 * width * (pick(d_span, top) - pick(d_span, bottom)))


def cotangents(xp, lin, fac, ct, solver, wanted=Inputs(True, True, True, True, True), fresh=True):
    """The transpose of :func:`tangents`: the input cotangents (:class:`Inputs`, those
    ``wanted``) of the output cotangents ``ct`` (:class:`Tangents`)."""
    n, d = lin.seeds.shape
    _no_periodic_domain_motion(lin, wanted.lo, wanted.hi)
    share, group = _shares(xp, lin)
    g, r = lin.moments[:, 0], lin.moments[:, 1:d + 1]
    c_dy, c_dY, c_dR = (_zeros(xp, lin, (n, d)) for _ in range(3))
    c_dm, c_dT, c_dpsi = (_zeros(xp, lin, (n,)) for _ in range(3))
    c_vy, c_rate = _zeros(xp, lin, (n, d)), _zeros(xp, lin, (d,))
    c_tr = xp.zeros((), dtype=lin.seeds.dtype, device=aac.device(lin.seeds))
    c_dlo, c_dhi = _zeros(xp, lin, (d,)), _zeros(xp, lin, (d,))
    c_values = None
    if ct.barycenters is not None:
        c_db = _compat.segment_sum(xp, ct.barycenters, lin.rep, n)
        has = g > 0
        safe = xp.where(has, g, 1.0)
        c_dY = c_dY + xp.where(has[:, None], c_db, 0.0)
        c_dR = c_dR + xp.where(has[:, None], c_db / safe[:, None], 0.0)
        c_dT = c_dT - xp.where(has, xp.sum(c_db * r, axis=1) / (safe * safe), 0.0)
        c_dy = c_dy + xp.where(has[:, None], 0.0, c_db)
    if ct.brenier_potential is not None:
        p_psi, p_span = _potential_cotangent(xp, lin, ct.brenier_potential)
        c_dpsi = c_dpsi + p_psi
        c_dy, c_dlo, c_dhi = c_dy + p_span[:n, :], c_dlo + p_span[n, :], c_dhi + p_span[n + 1, :]
    if ct.cell_masses is not None:
        safe_group = xp.where(group > 0, group, 1.0)
        g_rep = xp.take(g, lin.rep)
        c_dT = c_dT + _compat.segment_sum(xp, ct.cell_masses * share * (1.0 - g_rep / safe_group), lin.rep, n)
        c_dm = c_dm + xp.where(group > 0, ct.cell_masses * g_rep / safe_group, 0.0)
    if ct.distance is not None:
        state = _state(lin)
        needs = (wanted.seeds is not None, wanted.masses is not None, wanted.values is not None)
        gy, gm, grho = gradients(xp, lin.seeds, lin.masses, _density(lin, lin.values), state, needs)
        c_dy = c_dy if gy is None else c_dy + ct.distance * gy
        c_dm = c_dm if gm is None else c_dm + ct.distance * gm
        c_values = None if grho is None else ct.distance * grho
        if wanted.lo is not None or wanted.hi is not None:
            live = lin.active
            w = xp.sum(xp.where(live, lin.moments[:, -1], 0.0))
            c_tr = c_tr + ct.distance * (w - xp.sum(xp.where(live, lin.psi * g, 0.0)))
            c_vy = c_vy + ct.distance * 2.0 * xp.where(live[:, None], r, 0.0)
            q = _axis_second_moments(xp, lin)
            c_rate = c_rate + ct.distance * 2.0 * xp.sum(xp.where(live[:, None], q, 0.0), axis=0)
    if ct.potential is not None:
        mom = _cell_moments(xp, lin, ct.potential)
        c_dpsi = c_dpsi - mom[:, 0]
        c_dY = c_dY - 2.0 * mom[:, 1:d + 1]
    # dR = sum_F (w0 f1 + f2 w1) - g dY + src_r
    c_facet_r = xp.take(c_dR, fac.row, axis=0)
    c_dY = c_dY - g[:, None] * c_dR
    c_src_r = c_dR
    c_w0 = xp.sum(c_facet_r * fac.f1, axis=1)
    c_w1 = xp.sum(fac.f2 * c_facet_r[:, None, :], axis=2)          # f2 is symmetric
    half = c_w0 / (2.0 * fac.dist)
    c_dpsi = c_dpsi + _compat.segment_sum(xp, half, fac.row, n) - _compat.segment_sum(xp, half, fac.col, n)
    c_rhs = _solve(xp, lin, c_dpsi, solver, fresh)
    c_rhs = xp.where(lin.active, c_rhs, 0.0)
    c_dT = c_dT + c_rhs
    c_src_g = -c_rhs
    c_k = -xp.take(c_rhs, fac.row)
    c_w0a = c_w0 + c_k * fac.f0
    c_w1 = c_w1 + c_k[:, None] * fac.f1
    e_over = fac.e / fac.dist[:, None]
    c_dY = c_dY + _compat.segment_sum(xp, c_w0a[:, None] * e_over, fac.col, n)
    c_vy = c_vy - _compat.segment_sum(xp, c_w0a[:, None] * e_over, fac.row, n)
    c_w1 = c_w1 / fac.dist[:, None]
    c_dY = c_dY + _compat.segment_sum(xp, c_w1, fac.row, n) - _compat.segment_sum(xp, c_w1, fac.col, n)
    c_rate = c_rate - xp.sum(c_w1 * fac.e, axis=0)
    # sources
    if wanted.values is not None:
        coef = xp.concat([c_src_g[:, None], c_src_r, _zeros(xp, lin, (n, 1))], axis=1)
        part = _polynomial_integrals(xp, lin, coef)
        c_values = part if c_values is None else c_values + part
    c_tr = c_tr + xp.sum(c_src_g * g) + xp.sum(c_src_r * r)
    c_vy = c_vy + g[:, None] * c_src_r
    c_rate = c_rate + xp.sum(c_src_r * r, axis=0)
    # the box: vy = dlo + rate (y - lo), tr = sum(rate), rate = (dhi - dlo) / (hi - lo)
    c_rate = c_rate + xp.sum(c_vy * (lin.seeds - lin.lo[None, :]), axis=0) + c_tr
    c_dlo = c_dlo + xp.sum(c_vy, axis=0) - c_rate / (lin.hi - lin.lo)
    c_dhi = c_dhi + c_rate / (lin.hi - lin.lo)
    # the groups
    c_dy = c_dy + share[:, None] * xp.take(xp.where(lin.active[:, None], c_dY, 0.0), lin.rep, axis=0) \
        + xp.where(lin.active[:, None], 0.0, c_dY)
    c_dm = c_dm + xp.take(xp.where(lin.active, c_dT, 0.0), lin.rep)
    if c_values is None and wanted.values is not None:
        c_values = xp.zeros_like(lin.values)
    return Inputs(*(c if w is not None else None for c, w in zip((c_dy, c_dm, c_values, c_dlo, c_dhi), wanted)))


def _potential_cotangent(xp, lin, c_out):
    """The transpose of :func:`_potential_tangent`: cotangents of ``dpsi`` (n,) and of the
    span ``(dy, dlo, dhi)`` (n + 2, d)."""
    n, d = lin.seeds.shape
    lives = xp.take(lin.active, lin.rep)
    count = xp.maximum(xp.sum(xp.astype(lives, c_out.dtype)), 1.0)
    c = c_out - xp.where(lives, xp.sum(c_out) / count, 0.0)
    c_dpsi = _compat.segment_sum(xp, xp.where(lives, c, 0.0), lin.rep, n)
    c_min = xp.sum(xp.where(lives, 0.0, c))
    lowest = xp.argmin(xp.where(lin.active, lin.psi, xp.inf))
    c_dpsi = c_dpsi + xp.where(xp.arange(n, device=aac.device(c)) == lowest, c_min, 0.0)
    span, _ = _span(xp, lin, lin.seeds, Inputs())
    top, bottom = xp.argmax(span, axis=0), xp.argmin(span, axis=0)
    axes = xp.arange(d, dtype=xp.int64, device=aac.device(span))
    pick = lambda idx: xp.take(xp.reshape(span, (-1,)), idx * d + axes)     # noqa: E731
    weight = -2.0 * (pick(top) - pick(bottom)) * c_min
    rows = xp.arange(n + 2, dtype=xp.int64, device=aac.device(span))[:, None]
    c_span = xp.where(rows == top[None, :], weight[None, :], 0.0) - xp.where(rows == bottom[None, :], weight[None, :], 0.0)
    return c_dpsi, c_span
