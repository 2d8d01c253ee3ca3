"""The Newton matrix and direction (see :mod:`.newton`).

The Jacobian of the cell masses is the weighted graph Laplacian ``DG = D - W`` with
``W_ij = (int of rho over facet ij) / (2 |y_i - y_j|)``; it is singular along constants,
fixed by a tiny diagonal regulariser (:func:`regularised_diagonal`), and the direction is
taken of mean 0 (over the Diracs near the domain in the solve: :func:`near_domain`).
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat, periodic, row_blocks


def newton_direction(xp, prob, ev, active, rhs, regularisation, solver, rtol=None, fresh=None, gauge=None,
                     sites=None):
    """Solve ``DG d = rhs`` (sparse weighted Laplacian, regularised by
    :func:`regularised_diagonal`), to a relative residual ``rtol`` with the ``solver`` (see
    :class:`.linear_solvers.LinearSolver`), in the gauge where ``d`` has mean 0 over the ``gauge``
    Diracs (a mask; the ``active`` ones if None, :func:`near_domain` in the solve).

    ``DG`` is singular along constants: the part of ``rhs`` along them (its
    mean, which is rounding error since both mass vectors sum to the same
    total) is removed first, and so is the mean of ``d`` after the solve.
    Otherwise the regulariser turns a rounding error of ``sum(rhs)`` into a
    huge constant shift of the weights, which costs FP32 all its precision.

    On a periodic domain (:mod:`.periodic`), ``ev``'s cells are those of the sites ``(sites,
    owner)`` (the seeds and their images; found from ``prob.period`` if None).
    """
    if prob.period is not None and sites is None:
        sites = periodic.sites_of(xp, prob, ev.cells)
    if sites is None:
        rows, cols, w, diag, rhs = _laplacian(xp, prob.seeds, ev.cells, ev.facet, active, rhs, regularisation)
    else:
        rows, cols, w, diag, rhs = _periodic_laplacian(xp, *sites, ev, active, rhs, regularisation)
    d = solver.solve(xp, rows, cols, w, diag, rhs, rtol, points=prob.seeds, fresh=fresh)
    return _centred(xp, d, active, active if gauge is None else gauge)


@_compat.jit_on_jax()
def near_domain(xp, seeds, active):
    """The active Diracs within half the domain's size of its box (``seeds`` centred on the
    domain and scaled by its longest side), or all the active ones if none is: those whose
    mean weight the Newton steps keep.

    A mean over every Dirac let a far one's weight (1e3 domain sizes away: about 2e6) shift
    the others' by its share, whose rounding moved the facets of Diracs 1e-7 apart past
    what their masses allow.
    """
    near = near_mask(xp, seeds, active)
    return xp.where(xp.any(near), near, active)


def near_mask(xp, seeds, active):
    """The active Diracs within half the domain's size of its box (see :func:`near_domain`;
    the distributed solve takes the mean over its tiles' with the same fallback)."""
    return active & xp.all(xp.abs(seeds) <= 1.0, axis=1)


@_compat.jit_on_jax()
def _centred(xp, x, active, basis):
    """``x`` minus its mean over the ``basis`` entries, 0 on the inactive ones."""
    count = xp.maximum(xp.sum(xp.astype(basis, x.dtype)), 1.0)
    return xp.where(active, x - xp.sum(xp.where(basis, x, 0.0)) / count, 0.0)


def _laplacian(xp, seeds, cells, facet, active, rhs, regularisation):
    """Entries ``(rows, cols, w)`` of ``W``, the diagonal (regularised by
    :func:`regularised_diagonal`) and the centred right-hand side.

    ``W_ij = (int of rho over facet ij) / (2 |y_i - y_j|)``. Eagerly one entry per facet
    of nonzero integral, rows non-decreasing (:func:`_facet_entries`); traced one per
    edge slot, zero where there is no facet (in blocks of rows, see
    :func:`.row_blocks.blockwise`).
    """
    n = cells.labels.shape[0]
    if _compat.static_shapes(seeds, cells.labels, facet, rhs):     # rhs: traced under a derivative rule
        rows = xp.arange(n, dtype=xp.int64, device=aac.device(seeds))
        rows_per_slot = xp.broadcast_to(rows[:, None], cells.labels.shape)
        other, w = row_blocks.slotwise(xp, lambda c, r, lab, f: _facet_weights(xp, seeds, r, lab, c, f),
                                    cells.count, (rows,), (cells.labels, facet), (rows_per_slot, 0.0))
        diag = _compat.row_sum(xp, w)
        rows, cols, w = (xp.reshape(a, (-1,)) for a in (rows_per_slot, other, w))
    else:
        rows, cols, w = _facet_entries(xp, seeds, cells, facet)
        diag = _compat.segment_sum(xp, w, rows, n)
    return (rows, cols, w) + _regularised(xp, diag, active, rhs, regularisation)


def _periodic_laplacian(xp, sites, owner, ev, active, rhs, regularisation):
    """:func:`_laplacian` on a periodic domain: the entries of the ``sites`` folded onto the
    seeds (their ``owner``, :func:`.periodic.folded_entries`)."""
    rows, cols, w = periodic.folded_entries(xp, *_facet_entries(xp, sites, ev.cells, ev.facet), owner)
    diag = _compat.segment_sum(xp, w, rows, active.shape[0])
    return (rows, cols, w) + _regularised(xp, diag, active, rhs, regularisation)


def _facet_entries(xp, seeds, cells, facet):
    """Eagerly, ``(rows, cols, w)`` of the edge slots with a neighbour and a nonzero
    facet integral, in slot order: by the compiled kernel (:mod:`sdot._host.compiled.laplacian`) where
    it runs, else a few operations on those entries alone (measured at 1e4 cells of 16 slots:
    about 1 ms against 6 to 10 ms for the kernel over every slot with the flattening after it)."""
    from .._host.compiled import laplacian

    found = _compat.compiled_call(xp, laplacian.facet_entries, seeds, cells.labels, cells.count, facet)
    if found is not None:
        return found
    n, cap = cells.labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(seeds))[None, :]
    is_facet = (k < cells.count[:, None]) & (cells.labels >= 0) & (facet != 0)
    slot = xp.nonzero(xp.reshape(is_facet, (-1,)))[0]
    rows = slot // cap
    cols = xp.take(xp.reshape(cells.labels, (-1,)), slot)
    dist = _distances(xp, seeds, rows, cols[:, None])[:, 0]
    return rows, cols, xp.take(xp.reshape(facet, (-1,)), slot) / (2.0 * dist)


@_compat.jit_on_jax()
def _facet_weights(xp, seeds, rows, labels, count, facet):
    """Kernel of :func:`_laplacian` for the cells ``rows``: the neighbour of each edge
    slot (the cell itself where none) and its weight, ``(other, w)`` (n, V)."""
    cap = labels.shape[1]
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(rows))[None, :]
    is_facet = (k < count[:, None]) & (labels >= 0)
    other = xp.where(is_facet, labels, rows[:, None])
    dist = _distances(xp, seeds, rows, other)
    return other, xp.where(is_facet, facet / (2.0 * xp.where(is_facet, dist, 1.0)), 0.0)


def _distances(xp, seeds, rows, j):
    """``|y_j - y_row|``, of ``j``'s shape ``(m, V)`` (``rows`` (m,)), in any dimension: one
    gather per coordinate (NumPy gathers rows of a few coordinates several times slower)."""
    square = None
    for axis in range(seeds.shape[1]):
        x = seeds[:, axis]
        delta = _compat.flat_take(x, j) - xp.take(x, rows)[:, None]
        square = delta * delta if square is None else square + delta * delta
    return xp.sqrt(square)


@_compat.jit_on_jax("regularisation")
def _regularised(xp, diag, active, rhs, regularisation):
    """:func:`_laplacian`'s regularised diagonal and centred right-hand side."""
    scale = xp.sum(diag) / xp.maximum(xp.sum(xp.astype(active, diag.dtype)), 1.0)
    return regularised_diagonal(xp, diag, active, regularisation, scale), _centred(xp, rhs, active, active)


#: Rows whose diagonal is below this share of the mean get a regulariser relative to their own
#: (:func:`regularised_diagonal`).
SMALL_ROW = 1e-3
#: ... and never below this share of the mean one's (rows of no facet integral get one too).
REGULARISATION_FLOOR = 1e-6


def regularised_diagonal(xp, diag, active, regularisation, scale):
    """The Newton matrix's diagonal ``diag`` (of mean ``scale`` over the ``active`` rows) with
    ``regularisation * min(scale, max(diag_i / SMALL_ROW, REGULARISATION_FLOOR * scale))``
    added to the active rows, 1 on the others: ``regularisation`` times the mean diagonal,
    but at most ``regularisation / SMALL_ROW`` times the row's own.

    Either fixes the constant null direction of the Laplacian. The mean's alone outweighed
    the diagonal of a Dirac 1e6 domain sizes away (facet integrals over distances of 1e6)
    and halved its Newton step, so that no damping was accepted; rows of a thousandth of
    the mean or more keep it (their directions unchanged).
    """
    own = xp.maximum(diag / SMALL_ROW, REGULARISATION_FLOOR * scale)
    return xp.where(active, diag + regularisation * xp.minimum(scale, own), 1.0)
