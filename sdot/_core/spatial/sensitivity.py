"""The integrals of a voxel density the implicit differentiation of the transport plan needs
beyond those of :mod:`.faces`: per facet slot the density's moments of order 0, 1 and 2
over the facet (:func:`facet_moments_of_triangles`), and per cell its second moments along
each axis (:func:`axis_second_moments_of_triangles`).

The cells are boundary triangle soups as in :mod:`.faces`, and the splitting is that of
:mod:`.faces` (its eager pieces, its static pieces): each piece lies in one voxel, where
the integrand is a polynomial; its integral is the piece's area (projected area for the
face reduction) times the exact means of monomials over a triangle, from its vertices
(``mean(fg) = (sum f_k g_k + S_f S_g) / 12``, ``mean(fgh)`` as in :class:`.faces._Means`).
Everything is relative to each cell's origin (its first vertex) and moved to the seed at
the end, so that a cell far from its seed loses nothing to cancellation. A (1, 1, 1) grid
(the uniform density) takes closed forms instead, with no splitting: the triangles'
moments for the facets, the tetrahedra from the origin for the cells.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from . import faces

#: The pairs ``(a, b)``, ``a <= b``, of the second moments of a facet, in the order of
#: :func:`_facet_terms`.
PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))


# ----------------------------------------------------------------------------- public

def facet_moments_of_triangles(xp, seeds, triangles, slot, valid, F: int, values, lo, hi):
    """Per facet slot the moments of order 0, 1, 2 of the density over the facet.

    Parameters
    ----------
    xp : namespace
        The array namespace.
    seeds : array (n, 3)
        The seeds ``y_i``.
    triangles : array (n, T, 3, 3)
        The cells' boundary triangles relative to the seeds (as in :mod:`.faces`).
    slot : array (n, T)
        The facet slot of each triangle, ``0 <= slot < F``.
    valid : array (n, T)
        The triangles in use.
    F : int
        Facet slots per cell.
    values : array (n0, n1, n2)
        The voxel values on the box ``[lo, hi]``.
    lo, hi : array (3,)
        The box of the grid (unused on a (1, 1, 1) grid).

    Returns
    -------
    f0 : array (n, F)
        ``int_facet rho dS`` (the facet integrals of :func:`.faces.cell_integrals_of_triangles`).
    f1 : array (n, F, 3)
        ``int_facet rho u dS``, ``u = x - y_i``.
    f2 : array (n, F, 3, 3)
        ``int_facet rho u u^T dS``, symmetric.

    Every slot holding triangles is filled, the box's sides included; slots without any
    are zero. A facet on a voxel plane takes the voxel above it (as in :mod:`.faces`).
    """
    slot = xp.astype(slot, xp.int64)
    origin = faces._first_vertices(xp, triangles, valid)[0]
    if tuple(values.shape) == (1, 1, 1):
        sums = row_blocks.blockwise(xp, lambda o, t, k, ok: _uniform_facets(xp, o, t, k, ok, F, values),
                                 origin, triangles, slot, valid)
    else:
        sums = row_blocks.blockwise(xp, lambda s, o, t, k, ok: _facet_block(xp, s, o, t, k, ok, F, values, lo, hi),
                                 seeds, origin, triangles, slot, valid)
    return _facets_about_seeds(xp, sums, origin)


def axis_second_moments_of_triangles(xp, seeds, triangles, valid, values, lo, hi):
    """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis ``a``, ``(n, 3)`` (their sum is
    the second moment of :func:`.faces.cell_integrals_of_triangles`); arguments as
    :func:`facet_moments_of_triangles`."""
    origin = faces._first_vertices(xp, triangles, valid)[0]
    if tuple(values.shape) == (1, 1, 1):
        sums = row_blocks.blockwise(xp, lambda o, t, ok: _uniform_axes(xp, o, t, ok, values), origin, triangles, valid)
    else:
        tables = faces.prefix_tables(xp, values, lo, hi)
        sums = row_blocks.blockwise(
            xp, lambda s, o, t, ok: _axis_block(xp, s, o, t, ok, values, tables, lo, hi), seeds, origin, triangles,
            valid)
    # about the origin: mass, first moments, then the axes' second moments; moved to the seeds
    return sums[:, 4:] + 2.0 * origin * sums[:, 1:4] + sums[:, :1] * origin * origin


# ----------------------------------------------------------------------------- terms

def _facet_terms(xp, X, c, normal=None, live=None):
    """Per triangle ``(u, v, w)`` (9 arrays) with density ``c``: ``c A`` times the means of
    ``1, u, v, w`` and of the products of :data:`PAIRS`; ``A`` its area (signed along
    ``normal`` if given)."""
    e1 = [X[3 + a] - X[a] for a in range(3)]
    e2 = [X[6 + a] - X[a] for a in range(3)]
    cross = [e1[1] * e2[2] - e1[2] * e2[1], e1[2] * e2[0] - e1[0] * e2[2], e1[0] * e2[1] - e1[1] * e2[0]]
    if normal is None:
        area = 0.5 * xp.sqrt(cross[0] * cross[0] + cross[1] * cross[1] + cross[2] * cross[2])
    else:
        area = 0.5 * (cross[0] * normal[0] + cross[1] * normal[1] + cross[2] * normal[2])
    ca = c * area
    s = [X[a] + X[3 + a] + X[6 + a] for a in range(3)]
    out = [ca] + [ca * (s[a] / 3.0) for a in range(3)]
    out += [ca * ((X[a] * X[b] + X[3 + a] * X[3 + b] + X[6 + a] * X[6 + b] + s[a] * s[b]) / 12.0) for a, b in PAIRS]
    if live is not None:
        out = [xp.where(live, t, 0.0) for t in out]
    return out


def _axis_terms(xp, vox, X, live=None):
    """Per triangle its share of ``(mass, M_u, M_v, M_w, M_uu, M_vv, M_ww)`` about the cell's
    origin: ``int G n_x dS`` for ``G_0``, ``G_1``, ``v G_0``, ``w G_0``, ``G_2``, ``v^2 G_0``,
    ``w^2 G_0`` (see :mod:`.faces`)."""
    m = faces._Means(xp, X, area=False)
    u, v, w = (X[0], X[3], X[6]), (X[1], X[4], X[7]), (X[2], X[5], X[8])
    su = u[0] + u[1] + u[2]
    c, K0, W = vox.c, vox.K0, m.W
    out = [W * (K0 + c * m.u), W * (vox.K1 + 0.5 * c * m.uu), W * (K0 * m.v + c * m.uv),
           W * (K0 * m.w + c * m.uw), W * (vox.K2 + c * m.uuu / 3.0)]
    for f in (v, w):                    # mean(f^2) and mean(u f^2) from the vertices
        sf = f[0] + f[1] + f[2]
        qff = f[0] * f[0] + f[1] * f[1] + f[2] * f[2]
        quf = u[0] * f[0] + u[1] * f[1] + u[2] * f[2]
        uff = u[0] * f[0] * f[0] + u[1] * f[1] * f[1] + u[2] * f[2] * f[2]
        mean_ff = (qff + sf * sf) / 12.0
        mean_uff = (su * (sf * sf + qff) + 2.0 * (quf * sf + uff)) / 60.0
        out.append(W * (K0 * mean_ff + c * mean_uff))
    if live is not None:
        out = [xp.where(live, t, 0.0) for t in out]
    return out


def _facets_about_seeds(xp, sums, origin):
    """``(f0, f1, f2)`` about the seeds from the sums ``(n, F, 10)`` of :func:`_facet_terms`
    about the cells' ``origin`` (n, 3): ``f1 = g + f0 o``, ``f2 = h + g o^T + o g^T + f0 o o^T``."""
    f0, g = sums[..., 0], sums[..., 1:4]
    o = origin[:, None, :]
    f1 = g + f0[..., None] * o
    h = {}
    for k, (a, b) in enumerate(PAIRS):
        h[(a, b)] = h[(b, a)] = (sums[..., 4 + k] + g[..., a] * o[..., b] + o[..., a] * g[..., b]
                                 + f0 * o[..., a] * o[..., b])
    f2 = xp.stack([xp.stack([h[(a, b)] for b in range(3)], axis=-1) for a in range(3)], axis=-2)
    return f0, f1, f2


# ----------------------------------------------------------------------------- kernels

@_compat.jit_on_jax("F")
def _facet_block(xp, seeds, origin, triangles, slot, valid, F, values, lo, hi):
    """The sums ``(n, F, 10)`` of :func:`_facet_terms` over the pieces of one block of cells,
    about their ``origin`` (n, 3) relative to the seeds."""
    n, T = valid.shape
    n0, n1, n2 = values.shape
    grid = faces._Grid(xp, seeds + origin, values.shape, lo, hi)
    flat_values, flat_slot = xp.reshape(values, (-1,)), xp.reshape(slot, (-1,))
    acc = tuple(xp.zeros((n * F,), dtype=seeds.dtype, device=aac.device(seeds)) for _ in range(10))
    if not _compat.static_shapes(triangles, valid):
        for X, (cell, tri, i, j, k) in faces._eager_pieces(xp, grid, triangles, valid, origin):
            terms = _facet_terms(xp, faces._rows(X), xp.take(flat_values, (i * n1 + j) * n2 + k))
            at = cell * F + xp.take(flat_slot, tri)
            acc = tuple(a + _compat.segment_sum(xp, t, at, n * F) for a, t in zip(acc, terms))
    else:
        def visit(X, live, normal, index, rows, acc):
            c = xp.take(flat_values, (index[0] * n1 + index[1]) * n2 + index[2])[:, None]
            terms = _facet_terms(xp, X, c, normal, live)
            at = (rows // T) * F + xp.take(flat_slot, rows)
            return tuple(a + _compat.segment_sum(xp, xp.sum(t, axis=1), at, n * F) for a, t in zip(acc, terms))

        acc = faces._static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    return xp.reshape(xp.stack(acc, axis=1), (n, F, 10))


@_compat.jit_on_jax("F")
def _uniform_facets(xp, origin, triangles, slot, valid, F, values):
    """:func:`_facet_block` for a constant density (one voxel): the triangles' own moments,
    no splitting (eagerly on the valid triangles only, chunk by chunk)."""
    n, T = valid.shape
    c = xp.reshape(values, (1,))
    flat_slot = xp.reshape(slot, (-1,))
    cells_slots = xp.arange(n * T, dtype=xp.int64, device=aac.device(slot)) // T * F + flat_slot
    if _compat.static_shapes(triangles, valid):
        ok = xp.reshape(valid, (-1,))
        flat = xp.where(ok[:, None], xp.reshape(triangles - origin[:, None, None, :], (n * T, 9)), 0.0)
        terms = _facet_terms(xp, [flat[:, r] for r in range(9)], c)
        acc = [_compat.segment_sum(xp, t, cells_slots, n * F) for t in terms]
    else:
        acc = [xp.zeros((n * F,), dtype=triangles.dtype, device=aac.device(triangles)) for _ in range(10)]
        for X, index in faces._eager_triangles(xp, triangles, valid, origin, uniform=True):
            terms = _facet_terms(xp, faces._rows(X), c)
            at = xp.take(cells_slots, index)
            acc = [a + _compat.segment_sum(xp, t, at, n * F) for a, t in zip(acc, terms)]
    return xp.reshape(xp.stack(acc, axis=1), (n, F, 10))


@_compat.jit_on_jax()
def _axis_block(xp, seeds, origin, triangles, valid, values, tables, lo, hi):
    """The sums ``(n, 7)`` of :func:`_axis_terms` over the pieces of one block of cells, about
    their ``origin`` (n, 3) relative to the seeds (``tables``: :func:`.faces.prefix_tables`)."""
    n, T = valid.shape
    grid = faces._Grid(xp, seeds + origin, values.shape, lo, hi)
    flat_values = xp.reshape(values, (-1,))
    acc = tuple(xp.zeros((n,), dtype=seeds.dtype, device=aac.device(seeds)) for _ in range(7))
    if not _compat.static_shapes(triangles, valid):
        for X, (cell, _, i, j, k) in faces._eager_pieces(xp, grid, triangles, valid, origin):
            vox = faces._Voxel(xp, grid, i, j, k, xp.take(grid.sl[:, 0], cell), xp.take(grid.base, cell), tables,
                               flat_values)
            terms = _axis_terms(xp, vox, faces._rows(X))
            acc = tuple(a + _compat.segment_sum(xp, t, cell, n) for a, t in zip(acc, terms))
    else:
        def visit(X, live, normal, index, rows, acc):
            cell = rows // T
            vox = faces._Voxel(xp, grid, index[0], index[1], index[2], xp.take(grid.sl[:, 0], cell),
                               xp.take(grid.base, cell), tables, flat_values).fan()
            terms = _axis_terms(xp, vox, X, live)
            return tuple(a + _compat.segment_sum(xp, xp.sum(t, axis=1), cell, n) for a, t in zip(acc, terms))

        acc = faces._static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    return xp.stack(acc, axis=1)


@_compat.jit_on_jax()
def _uniform_axes(xp, origin, triangles, valid, values):
    """:func:`_axis_block` for a constant density (one voxel), in closed form over the
    tetrahedra ``(0, a, b, c)`` from the origin: with ``D = a . (b x c)``, ``int x_k^2 =
    D (a_k^2 + b_k^2 + c_k^2 + (a_k + b_k + c_k)^2) / 120`` (and the mass and first moments
    of :func:`.faces.tetrahedra`)."""
    n, T = valid.shape
    c = xp.reshape(values, (1,))

    def terms(X):
        out = faces.tetrahedra(xp, X)[:4]
        d120 = out[0] / 20.0
        for k in range(3):
            s = X[k] + X[3 + k] + X[6 + k]
            out.append(d120 * (X[k] * X[k] + X[3 + k] * X[3 + k] + X[6 + k] * X[6 + k] + s * s))
        return out

    if _compat.static_shapes(triangles, valid):
        ok = xp.reshape(valid, (-1,))
        flat = xp.where(ok[:, None], xp.reshape(triangles - origin[:, None, None, :], (n * T, 9)), 0.0)
        acc = [xp.sum(xp.reshape(t, (n, T)), axis=1) for t in terms([flat[:, r] for r in range(9)])]
    else:
        acc = [xp.zeros((n,), dtype=triangles.dtype, device=aac.device(triangles)) for _ in range(7)]
        for X, index in faces._eager_triangles(xp, triangles, valid, origin, uniform=True):
            acc = [a + _compat.segment_sum(xp, t, index // T, n) for a, t in zip(acc, terms(faces._rows(X)))]
    return c * xp.stack(acc, axis=1)
