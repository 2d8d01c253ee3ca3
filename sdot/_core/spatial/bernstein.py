"""Exact integrals of a Bernstein voxel density (a ``PolynomialGrid`` of degree ``p`` in 3D)
over the power cells: what :class:`..density.BernsteinDensity` asks in 3D.

``coefficients`` ``(n0, n1, n2, (p + 1)^3)`` hold per voxel the Bernstein coefficients of
the density in the voxel's own coordinates ``t in [0, 1]^3`` (``t0`` along axis 0), in C
order: ``k = (k0 (p + 1) + k1) (p + 1) + k2``. The cells' boundary triangles are split at the
voxel planes as for the piecewise-constant grid (:mod:`.faces`: its eager and its static
pieces), each piece integrated by :mod:`.bernstein_pieces` (the face reduction along x with
a polynomial primitive, Gauss rules exact for its degree), with what its row of voxels
gives (:mod:`.bernstein_columns`: the voxel's coefficients, the base column's part of the
primitive and the whole columns' from prefix tables). The degenerate boundary triangles
(two per facet of :func:`.polyhedra.facet_triangles`, zero area) are dropped first.

For the plan's derivatives, :func:`bernstein_facet_moments` (``int rho (1, u, u u^T) dS`` per
facet slot) and :func:`bernstein_axis_second_moments` take the same pieces (the kinds of
:func:`.bernstein_pieces.piece_moments`).

:func:`bernstein_polynomial_integrals` (and :func:`bernstein_potential_integrals`, the
gradient of W2^2 with respect to the coefficients) is the transpose of the linear map
``coefficients -> moments``, taken term by term: the pieces' voxels directly, the base
voxels through the base column's primitive, the tables through their prefix sums.

Eagerly, the pieces of each chunk of :mod:`.faces` are integrated in slices of
:class:`sdot._host.threads.HostSettings` ``piece_slice``, their per-point arrays laid out pieces last (:class:`.bernstein_pieces.Layout`);
under static shapes, the fans of :func:`.faces._static_pieces`, pieces first.
"""
from __future__ import annotations

import array_api_compat as aac

from ..._host import threads as host_threads
from .. import _compat, row_blocks
from ..moments import about_seeds
from . import faces
from .bernstein_columns import column, degree, prefix_tables, through_tables
from .bernstein_pieces import Layout, line_rule, piece_gradients, piece_moments, triangle_rule
from .polyhedra import facet_triangles
from .sensitivity import _facets_about_seeds


def rules(p: int):
    """The triangle rule (exact to ``3 p + 3``) and the line rule (exact to ``p + 2``)."""
    return triangle_rule(3 * p + 3), line_rule(p + 2)


# ----------------------------------------------------------------------------- public

def bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi):
    """``(moments (n, 5), facet (n, F))``: per cell its mass, first moments and second moment
    about the seed (``int rho``, ``int rho (x - y_i)``, ``int rho |x - y_i|^2``), and per facet
    slot the density integrated over the facet; as :func:`.integrate.cell_integrals` for a
    Bernstein grid ``coefficients`` ``(n0, n1, n2, (p + 1)^3)`` on the box ``[lo, hi]``."""
    tri, slot, valid = facet_triangles(xp, cells)
    return cell_integrals_of_triangles(xp, seeds, tri, slot, valid, cells.labels.shape[1], coefficients, lo, hi)


def bernstein_potential_integrals(xp, seeds, cells, psi, lo, hi, coefficient_shape):
    """Per voxel and basis function ``k``, ``sum_i int_(L_i & voxel) B_k(t) (|x - y_i|^2 - psi_i) dx``,
    of ``coefficient_shape`` ``(n0, n1, n2, (p + 1)^3)``: :func:`bernstein_polynomial_integrals`
    of ``(-psi_i, 0, 0, 0, 1)``, ``<result, coefficients> = sum_i (M_2,i - psi_i mass_i)``."""
    zeros = xp.zeros((psi.shape[0], 3), dtype=psi.dtype, device=aac.device(psi))
    coefficients = xp.concat([-psi[:, None], zeros, xp.ones_like(psi)[:, None]], axis=1)
    return bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape)


def bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape):
    """Per voxel and basis function ``k``, ``sum_i int_(L_i & voxel) B_k(t) (a_i + b_i . u + c_i |u|^2)``,
    ``u = x - y_i``, ``coefficients`` ``(n, 5)`` the rows ``(a_i, b_i, c_i)``: the transpose of
    ``coefficients -> moments`` of :func:`bernstein_cell_integrals`."""
    tri, _, valid = facet_triangles(xp, cells)
    return polynomial_integrals_of_triangles(xp, seeds, tri, valid, coefficients, coefficient_shape, lo, hi)


def bernstein_facet_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per facet slot ``(f0, f1, f2) = int_facet rho (1, u, u u^T) dS``, ``u = x - y_i``, shapes
    ``(n, F)``, ``(n, F, 3)``, ``(n, F, 3, 3)``: the contract of :func:`.integrate.facet_moments`
    for a Bernstein grid ``coefficients`` (``f0`` is the ``facet`` of :func:`bernstein_cell_integrals`)."""
    tri, slot, valid = facet_triangles(xp, cells)
    _, sums, origin = _triangle_integrals(xp, seeds, tri, slot, valid, cells.labels.shape[1], coefficients, lo, hi,
                                          "facet")
    return _facets_about_seeds(xp, sums, origin)


def bernstein_axis_second_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis ``a``, ``(n, 3)``: the parts of the
    second moment of :func:`bernstein_cell_integrals`."""
    tri, slot, valid = facet_triangles(xp, cells)
    sums, _, origin = _triangle_integrals(xp, seeds, tri, slot, valid, cells.labels.shape[1], coefficients, lo, hi,
                                          "axes")
    return sums[:, 4:] + 2.0 * origin * sums[:, 1:4] + sums[:, :1] * origin * origin


def cell_integrals_of_triangles(xp, seeds, triangles, slot, valid, F: int, coefficients, lo, hi):
    """:func:`bernstein_cell_integrals` of cells given by their boundary triangles
    (``triangles`` (n, T, 3, 3) relative to the seeds, ``slot``, ``valid`` (n, T), as in
    :mod:`.faces`). Eagerly in blocks of cells; the tables are computed once."""
    moments, facet, origin = _triangle_integrals(xp, seeds, triangles, slot, valid, F, coefficients, lo, hi, "cell")
    return about_seeds(xp, moments, origin), facet[..., 0]


def _triangle_integrals(xp, seeds, triangles, slot, valid, F: int, coefficients, lo, hi, kind):
    """The sums of :func:`_cell_block` of ``kind`` over cells given by their boundary triangles, about
    their origins (their first vertices, :func:`.faces._first_vertices`), and those origins."""
    slot = xp.astype(slot, xp.int64)
    valid = valid & _nondegenerate(xp, triangles)
    origin = faces._first_vertices(xp, triangles, valid)[0]
    tables = prefix_tables(xp, coefficients, lo, hi)
    per_cell, per_slot = row_blocks.blockwise(
        xp, lambda s, o, t, k, ok: _cell_block(xp, s, o, t, k, ok, F, coefficients, tables, lo, hi, kind),
        seeds, origin, triangles, slot, valid)
    return per_cell, per_slot, origin


def polynomial_integrals_of_triangles(xp, seeds, triangles, valid, coefficients, coefficient_shape, lo, hi):
    """:func:`bernstein_polynomial_integrals` of cells given by their boundary triangles."""
    shape = tuple(int(s) for s in coefficient_shape)
    valid = valid & _nondegenerate(xp, triangles)
    origin = faces._first_vertices(xp, triangles, valid)[0]
    parts = row_blocks.blockwise(
        xp, lambda s, o, t, ok, q: _polynomial_block(xp, s, o, t, ok, q, shape, lo, hi),
        seeds, origin, triangles, valid, coefficients)
    return through_tables(xp, parts[0], parts[1], shape, lo, hi)


@_compat.jit_on_jax()
def _nondegenerate(xp, triangles):
    """The triangles of nonzero area ``(n, T)``."""
    e1, e2 = triangles[..., 1, :] - triangles[..., 0, :], triangles[..., 2, :] - triangles[..., 0, :]
    cross = [e1[..., 1] * e2[..., 2] - e1[..., 2] * e2[..., 1], e1[..., 2] * e2[..., 0] - e1[..., 0] * e2[..., 2],
             e1[..., 0] * e2[..., 1] - e1[..., 1] * e2[..., 0]]
    return (cross[0] != 0.0) | (cross[1] != 0.0) | (cross[2] != 0.0)


def _scatter_rows(xp, values, ids, n: int):
    """``out[k] = sum of values[ids == k]`` for ``values`` ``(P, ...)``: one flat segment sum."""
    width = 1
    for s in values.shape[1:]:
        width *= int(s)
    flat_ids = ids[:, None] * width + xp.arange(width, dtype=ids.dtype, device=aac.device(ids))[None, :]
    out = _compat.segment_sum(xp, xp.reshape(values, (-1,)), xp.reshape(flat_ids, (-1,)), n * width)
    return xp.reshape(out, (n,) + tuple(values.shape[1:]))


# ----------------------------------------------------------------------------- kernels

#: The layouts of the eager kernels (pieces last) and of the static pieces (pieces first).
EAGER, STATIC = Layout(first=False), Layout(first=True)

def _sliced(xp, fn, X, index):
    """``fn(X, index)`` on slices of at most the host settings' ``piece_slice`` pieces (``X``
    (9, Q) the pieces' triangles, ``index`` their cells and voxels, 4 arrays (Q,)), its results
    (lists of arrays with the pieces first) concatenated: the temporaries of a slice stay in
    the CPU caches."""
    total, size = index[0].shape[0], host_threads.settings().piece_slice
    bounds = [(s, min(s + size, total)) for s in range(0, total, size)]
    parts = [fn([X[r, s:e] for r in range(9)], [a[s:e] for a in index]) for s, e in bounds]
    return [xp.concat(p, axis=0) for p in zip(*parts)]


#: Per kind of :func:`.bernstein_pieces.piece_moments`: its terms summed per cell, and per facet slot.
TERMS = {"cell": (5, 1), "axes": (7, 1), "facet": (0, 10)}


@_compat.jit_on_jax("F", "kind")
def _cell_block(xp, seeds, origin, triangles, slot, valid, F, coefficients, tables, lo, hi, kind="cell"):
    """:func:`cell_integrals_of_triangles` of one block of cells, about their ``origin``: the
    terms of :func:`.bernstein_pieces.piece_moments` of ``kind`` summed per cell ``(n, c)`` and
    per facet slot ``(n, F, f)`` (``(c, f)`` of :data:`TERMS`)."""
    n, T = valid.shape
    n0, n1, n2, _ = coefficients.shape
    p = degree(coefficients.shape)
    R = (p + 1) * (p + 1)
    grid = faces._Grid(xp, seeds + origin, (n0, n1, n2), lo, hi)
    flat = xp.reshape(coefficients, (n0 * n1 * n2, p + 1, R))
    rule = rules(p)
    flat_slot = xp.reshape(slot, (-1,))
    dev = aac.device(seeds)
    c, f = TERMS[kind]
    acc = tuple(xp.zeros((n,), dtype=seeds.dtype, device=dev) for _ in range(c)) \
        + tuple(xp.zeros((n * F,), dtype=seeds.dtype, device=dev) for _ in range(f))

    def add(acc, terms, cell, at):
        return tuple(a + _compat.segment_sum(xp, t, cell, n) for a, t in zip(acc[:c], terms[:c])) \
            + tuple(a + _compat.segment_sum(xp, t, at, n * F) for a, t in zip(acc[c:], terms[c:]))

    if not _compat.static_shapes(triangles, valid):
        for X, (cell, tri, i, j, k) in faces._eager_pieces(xp, grid, triangles, valid, origin):
            terms = _sliced(xp, lambda X, index: piece_moments(
                xp, column(xp, grid, p, EAGER, index[0], index[1:], (flat, tables))[0], X, rule, kind=kind), X,
                (cell, i, j, k))
            acc = add(acc, terms, cell, cell * F + xp.take(flat_slot, tri))
    else:
        def visit(X, live, normal, index, rows, acc):
            cell = rows // T
            col = column(xp, grid, p, STATIC, cell, index, (flat, tables))[0]
            terms = [xp.sum(t, axis=1) for t in piece_moments(xp, col, X, rule, normal, live, kind=kind)]
            return add(acc, terms, cell, cell * F + xp.take(flat_slot, rows))

        acc = faces._static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    per_cell = xp.stack(acc[:c], axis=1) if c else xp.zeros((n, 0), dtype=seeds.dtype, device=dev)
    return per_cell, xp.reshape(xp.stack(acc[c:], axis=1), (n, F, f))


@_compat.jit_on_jax("shape")
def _polynomial_block(xp, seeds, origin, triangles, valid, coefficients, shape, lo, hi):
    """Per block of cells, the gradient of ``Q = sum_i int_(L_i) (a_i + b_i . u + c_i |u|^2) rho``
    with respect to the tables ``(1, n1 n2 (n0 + 1), 3, R)`` and to the coefficients directly
    ``(1, n0 n1 n2, p + 1, R)``; about the cells' ``origin``."""
    n, T = valid.shape
    n0, n1, n2, _ = shape
    p = degree(shape)
    R = (p + 1) * (p + 1)
    rows_tables = n1 * n2 * (n0 + 1)
    nvox = n0 * n1 * n2
    grid = faces._Grid(xp, seeds + origin, (n0, n1, n2), lo, hi)
    dev, dtype = aac.device(seeds), seeds.dtype
    rule = rules(p)
    a, b, c = coefficients[:, 0], coefficients[:, 1:4], coefficients[:, 4]
    kappa = a + _compat.dot(b, origin) + c * _compat.dot(origin, origin)
    beta = b + 2.0 * c[:, None] * origin
    q = [kappa, beta[:, 0], beta[:, 1], beta[:, 2], c]

    def scatter(parts, acc):
        """``acc`` plus the gradients of the pieces: ``(voxel, d_voxels, at, d_tables)``."""
        voxel, d_voxels, at, d_tables = parts
        return (acc[0] + _scatter_rows(xp, d_tables, at, rows_tables),
                acc[1] + _scatter_rows(xp, d_voxels, voxel, nvox))

    def gradients(layout, X, cell, index, live=None):
        col, transpose = column(xp, grid, p, layout, cell, index)
        q_cell = [xp.take(t, cell) for t in q]
        (voxel, d_voxels), (at, d_tables) = transpose(piece_gradients(
            xp, col, X, rule, q_cell if live is None else [t[:, None] for t in q_cell], live))
        return [voxel, d_voxels, at, d_tables]

    acc = (xp.zeros((rows_tables, 3, R), dtype=dtype, device=dev), xp.zeros((nvox, p + 1, R), dtype=dtype, device=dev))
    if not _compat.static_shapes(triangles, valid):
        for X, (cell, _, i, j, k) in faces._eager_pieces(xp, grid, triangles, valid, origin):
            acc = scatter(_sliced(xp, lambda X, index: gradients(EAGER, X, index[0], index[1:]), X, (cell, i, j, k)),
                          acc)
        return acc[0][None, ...], acc[1][None, ...]

    def visit(X, live, normal, index, rows, acc):
        return scatter(gradients(STATIC, X, rows // T, index, live), acc)

    g_tables, g_voxels = faces._static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    return g_tables[None, ...], g_voxels[None, ...]
