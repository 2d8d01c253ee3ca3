"""Exact integrals of a piecewise-constant voxel density over convex polyhedra.

The cells are given as a boundary triangle soup, independently of how they are
stored: per cell i up to ``T`` triangles ``(a, b, c)`` relative to its seed ``y_i``,
counter-clockwise seen from outside (``(b - a) x (c - a)`` points outward), tiling
the cell's boundary; each triangle carries the facet slot it lies on.

Face reduction (the divergence theorem along x): with ``G(x, y, z) =
int_{o_x}^{x} rho(s, y, z) f(s, y, z) ds``,

    int_P rho f = sum over the boundary triangles of int_tri G n_x dS.

Everything is relative to the cell's origin ``o`` (its first vertex): coordinates
``u = x - o_x`` (``v``, ``w`` likewise), moments about ``o`` (moved to the seed at the
end), and the primitive's base ``o_x``, so that ``G`` is of the cell's size whatever the
grid (a cell 1e-6 wide inside one voxel gets ``G_p = c u^{p+1} / (p + 1)``: no term of
the voxel's size cancels). Each triangle is split by the grid planes into pieces lying
in one voxel ``(i, j, k)``, where ``G_p`` (the primitive of ``u^p``, p = 0, 1, 2) is

    G_p = K_p + c u^{p+1} / (p + 1),
    K_p = T_p(d) + cb E^{p+1} / (p + 1) - c B^{p+1} / (p + 1),

``c`` the piece's voxel value, ``cb`` that of the voxel ``(i_b, j, k)`` of the base column
``i_b`` (the column of ``o``), ``E`` the side of the base column towards the piece and
``B`` the side of the piece's column towards the base (both relative to ``o``; 0 when
``i = i_b``), and ``T_p(d)`` the whole columns in between, from the differences ``d_m``
of the row prefix tables ``A_m[(j, k), i] = sum_{l<i} c_ljk (X_{l+1}^m - X_l^m)`` (``X``
relative to ``lo``; ``T_0 = d_1``, ``T_1 = d_2 / 2 - b d_1``, ``T_2 = d_3 / 3 - b d_2 +
b^2 d_1``, ``b = o_x - lo_x``). The moments integrate ``G_0``, ``G_1``, ``v G_0``,
``w G_0`` and ``G_2 + (v^2 + w^2) G_0``. ``int G n_x dS`` over a piece triangle is its
projected area times the mean of ``G`` over it, from the exact means of the monomials of
degree <= 3 over a triangle (from its vertices). The facet integrals sum ``c |piece|``
over the same pieces.

The splitting:

- eagerly (NumPy, torch, array_api_strict), chunk of triangles after chunk (the
  temporaries stay in the CPU caches): the soup stays a soup of triangles. Along each
  axis in turn, every triangle spanning more than one slab is cut at its lowest grid
  plane into three triangles (the apex's, and the quadrilateral on the other side in
  two), those below are done, those above go on; after each round only the triangles
  still spanning several slabs are kept (compacted), so the work follows the pieces
  there are. A triangle inside one voxel is never cut.
- under static shapes (JAX, traced or not: the kernels are jitted; array_api_strict
  without data-dependent shapes): the triangles are sorted by the number of voxels of
  their boxes and taken by segments; round r of a segment takes voxel r of the box of
  each of its triangles and clips the triangle to it, as a list of at most 9 directed
  edges (the triangle's 3, one per clip; no gather, and the clips no triangle of the
  segment needs are skipped); the piece is integrated as the fan of its edges from a
  point of it. A segment runs as many rounds as its first triangle has voxels.

Voxel indices are assigned structurally (slab after slab along each cut), never
read back from the cut coordinates; grid coordinates within a few ulps of a grid plane
are snapped onto it, so that a facet lying on a voxel plane goes to the same voxel
(the one above it) from both cells that share it. A (1, 1, 1) grid (the uniform density)
takes the closed forms of the tetrahedra from the seed instead, with no splitting (about
the first vertex for cells farther than :data:`FAR` from their seeds).
"""
from __future__ import annotations

import array_api_compat as aac

from ..._host import threads as host_threads
from .. import _compat, moments, row_blocks
from ..moments import about_seeds

#: Distance from a seed beyond which a cell is "far": its closed-form integrals on the
#: uniform density are taken about its first vertex (terms of size ``|x - y_i|^2`` cancel),
#: then moved to the seed (as in 2D).
FAR = moments.FAR

#: Grid coordinates within ``SNAP`` ulps of ``max(shape)`` of a grid plane are put on it.
SNAP = 16.0


# ----------------------------------------------------------------------------- public

def cell_integrals_of_triangles(xp, seeds, triangles, slot, valid, F: int, values, lo, hi):
    """Per cell ``(mass, M_u, M_v, M_w, M_2)`` about the seed ``(n, 5)``, and per facet slot
    the density integrated over the facet ``(n, F)``.

    ``seeds`` (n, 3); ``triangles`` (n, T, 3, 3) relative to the seeds, counter-clockwise
    seen from outside; ``slot`` (n, T) the facet slot of each triangle (0 <= slot < F);
    ``valid`` (n, T); ``values`` (n0, n1, n2) the voxel values on the box ``[lo, hi]``.
    ``M_u = int (x - y_i) rho`` (per axis), ``M_2 = int |x - y_i|^2 rho`` over the cell.
    Eagerly in blocks of cells (:func:`..row_blocks.blockwise`); the prefix tables are
    computed once.
    """
    slot = xp.astype(slot, xp.int64)
    if tuple(values.shape) == (1, 1, 1):
        origin = _far_origins(xp, triangles, valid)
        if origin is not None:
            triangles = triangles - origin[:, None, None, :]
        moments, facet = row_blocks.blockwise(
            xp, lambda t, k, ok: _uniform_integrals(xp, t, k, ok, F, values), triangles, slot, valid)
        return (moments if origin is None else about_seeds(xp, moments, origin)), facet
    origin = _first_vertices(xp, triangles, valid)[0]
    tables = prefix_tables(xp, values, lo, hi)
    moments, facet = row_blocks.blockwise(
        xp, lambda s, o, t, k, ok: _cell_integrals(xp, s, o, t, k, ok, F, values, tables, lo, hi),
        seeds, origin, triangles, slot, valid)
    return about_seeds(xp, moments, origin), facet


def polynomial_integrals_of_triangles(xp, seeds, triangles, valid, coefficients, values_shape, lo, hi):
    """Per voxel ``sum_i int_{voxel & L_i} (a_i + b_i . u + c_i |u|^2)``, ``u = x - y_i``, of shape
    ``values_shape``; ``coefficients`` (n, 5) the rows ``(a_i, b_i, c_i)``. The transpose of
    the linear map ``rho -> moments`` (mass, first moments, second moment about the seeds)
    of the face reduction, coefficient by coefficient (voxel values directly, and through
    the prefix tables): ``<result, rho> = sum(coefficients * moments)``."""
    shape = tuple(int(s) for s in values_shape)
    origin = _first_vertices(xp, triangles, valid)[0]
    parts = row_blocks.blockwise(
        xp, lambda s, o, t, ok, q: _polynomial_block(xp, s, o, t, ok, q, shape, lo, hi),
        seeds, origin, triangles, valid, coefficients)
    return _through_tables(xp, parts[0], parts[1], shape, lo, hi)


def potential_integrals_of_triangles(xp, seeds, triangles, valid, psi, values_shape, lo, hi):
    """Per voxel ``int_voxel phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i: the derivative of
    ``Q = sum_i int_{L_i} (|x - y_i|^2 - psi_i) rho`` with respect to each voxel value (cells
    fixed), :func:`polynomial_integrals_of_triangles` of ``(-psi_i, 0, 0, 0, 1)``."""
    zeros = xp.zeros((psi.shape[0], 3), dtype=psi.dtype, device=aac.device(psi))
    coefficients = xp.concat([-psi[:, None], zeros, xp.ones_like(psi)[:, None]], axis=1)
    return polynomial_integrals_of_triangles(xp, seeds, triangles, valid, coefficients, values_shape, lo, hi)


@_compat.jit_on_jax("shape")
def _through_tables(xp, g_tables, g_voxels, shape, lo, hi):
    """The gradients of the blocks (rows of ``g_tables``, w.r.t. the prefix tables, and of
    ``g_voxels``, w.r.t. the voxel values directly) summed, the first taken through the
    tables: ``A_m[r, i] = sum_{l < i} c[l, r] band_m[l]``, so
    ``dQ/dc[l, r] += band_m[l] sum_{i > l} dQ/dA_m[r, i]``."""
    n0, n1, n2 = shape
    g_tables, g_voxels = xp.sum(g_tables, axis=0), xp.sum(g_voxels, axis=0)
    xs = (hi[0] - lo[0]) * xp.arange(n0 + 1, dtype=g_voxels.dtype, device=aac.device(g_voxels)) / n0
    g_tables = xp.reshape(g_tables, (3, n1 * n2, n0 + 1))
    after = xp.flip(xp.cumulative_sum(xp.flip(g_tables, axis=2), axis=2), axis=2)[:, :, 1:]    # (3, R, n0)
    through = after[0, ...] * (xs[1:] - xs[:-1])[None, :]
    through = through + after[1, ...] * (xs[1:] ** 2 - xs[:-1] ** 2)[None, :]
    through = through + after[2, ...] * (xs[1:] ** 3 - xs[:-1] ** 3)[None, :]
    through = xp.permute_dims(xp.reshape(through, (n1, n2, n0)), (2, 0, 1))
    return xp.reshape(g_voxels, shape) + through


# ----------------------------------------------------------------------------- grid

@_compat.jit_on_jax()
def prefix_tables(xp, values, lo, hi):
    """``A_m`` (m = 1, 2, 3) flattened to ``(3, n1 n2 (n0 + 1))``: row ``r = j n2 + k``,
    column ``i``, ``A_m[r, i] = sum_{l<i} values[l, j, k] (X_{l+1}^m - X_l^m)``,
    ``X_l = l (hi_0 - lo_0) / n0`` (relative to ``lo``)."""
    n0, n1, n2 = values.shape
    dev = aac.device(values)
    xs = (hi[0] - lo[0]) * xp.arange(n0 + 1, dtype=values.dtype, device=dev) / n0
    rows = xp.reshape(xp.permute_dims(values, (1, 2, 0)), (n1 * n2, n0))
    zero = xp.zeros((n1 * n2, 1), dtype=values.dtype, device=dev)
    tables = []
    for m in (1, 2, 3):
        band = xs[1:] ** m - xs[:-1] ** m
        tables.append(xp.reshape(xp.concat([zero, xp.cumulative_sum(rows * band[None, :], axis=1)], axis=1), (-1,)))
    return xp.stack(tables)


class _Grid:
    """The voxel grid as the kernels see it: shape, voxel sides, per cell its origin
    ``origins`` relative to ``lo`` (``sl``) and the column of the origin (``base``)."""

    def __init__(self, xp, origins, shape, lo, hi):
        self.shape = tuple(int(s) for s in shape)
        dev = aac.device(origins)
        self.n = xp.asarray(self.shape, dtype=origins.dtype, device=dev)
        self.h = (hi - lo) / self.n
        self.scale = self.n / (hi - lo)
        self.sl = origins - lo                                            # (n, 3)
        column = xp.astype(xp.floor(self.sl[:, 0] * self.scale[0]), xp.int64)
        self.base = xp.minimum(xp.maximum(column, 0), self.shape[0] - 1)   # (n,)
        self.tol = SNAP * float(xp.finfo(origins.dtype).eps) * max(self.shape)

    def index(self, xp, g, axis):
        """Voxel index along ``axis`` of grid coordinates ``g``: within ``tol`` below a grid
        plane, the voxel above it; clamped to the grid."""
        i = xp.astype(xp.floor(g + self.tol), xp.int64)
        return xp.minimum(xp.maximum(i, 0), self.shape[axis] - 1)

    def ranges(self, xp, X, sl, axis):
        """Lowest and highest voxel index along ``axis`` of the triangles ``X`` (9 rows,
        relative to their cells' origins, at ``sl`` relative to ``lo`` along ``axis``)."""
        g = [(sl + X[3 * k + axis]) * self.scale[axis] for k in range(3)]
        low = self.index(xp, xp.minimum(xp.minimum(g[0], g[1]), g[2]), axis)
        high = self.index(xp, xp.maximum(xp.maximum(g[0], g[1]), g[2]), axis)
        return low, high

    def top(self, xp, X, sl, axis):
        """Highest voxel index along ``axis`` of the triangles ``X``."""
        g = [(sl + X[3 * k + axis]) * self.scale[axis] for k in range(3)]
        return self.index(xp, xp.maximum(xp.maximum(g[0], g[1]), g[2]), axis)

    def plane(self, xp, index, sl, axis):
        """Coordinate of the grid plane ``index`` along ``axis`` relative to the origins at ``sl``."""
        return xp.astype(index, sl.dtype) * self.h[axis] - sl


class _Voxel:
    """What a piece in voxel ``(i, j, k)`` needs (see the module docstring): its density
    ``c``, that of the cell's base voxel ``cb`` (``(i_b, j, k)``), the table entries ``at``
    and ``at_base`` whose difference ``d`` sums the whole columns between, the sides ``E``
    (of the base column) and ``B`` (of the piece's) relative to the cell's origin, nearest
    each other (0 in the base column), and with ``tables``, the constants ``K_p`` of
    ``G_p = K_p + c u^{p+1} / (p + 1)`` on the piece."""

    def __init__(self, xp, grid, i, j, k, bx, ib, tables=None, flat_values=None):
        n0, n1, n2 = grid.shape
        h = grid.h[0]
        after, before = i > ib, i < ib
        row = (j * n2 + k) * (n0 + 1)
        self.at = row + xp.where(before, i + 1, i)
        self.at_base = row + xp.where(after, ib + 1, ib)
        self.voxel, self.base_voxel = (i * n1 + j) * n2 + k, (ib * n1 + j) * n2 + k
        xi, xb = xp.astype(i, bx.dtype) * h - bx, xp.astype(ib, bx.dtype) * h - bx
        self.B = xp.where(after, xi, xp.where(before, xi + h, 0.0))
        self.E = xp.where(after, xb + h, xp.where(before, xb, 0.0))
        self.bx = bx
        if flat_values is not None:
            self.c, self.cb = xp.take(flat_values, self.voxel), xp.take(flat_values, self.base_voxel)
        if tables is not None:
            d1, d2, d3 = (xp.take(tables[m, :], self.at) - xp.take(tables[m, :], self.at_base) for m in range(3))
            cE, cB = self.cb * self.E, self.c * self.B
            self.K0 = d1 + cE - cB
            self.K1 = 0.5 * (d2 + cE * self.E - cB * self.B) - bx * d1
            self.K2 = (d3 + cE * self.E * self.E - cB * self.B * self.B) / 3.0 - bx * d2 + bx * bx * d1

    def fan(self):
        """The values as columns (P, 1), for the fan triangles of each piece (P, K)."""
        out = object.__new__(_Voxel)
        out.__dict__.update({k: (v if k in ("at", "at_base", "voxel", "base_voxel") else v[:, None])
                             for k, v in self.__dict__.items()})
        return out


# ----------------------------------------------------------------------------- piece moments

class _Means:
    """The projected area ``W = int n_x dS`` of the triangles ``(p0, p1, p2)`` (9 arrays),
    their areas, and the means over them of the monomials
    ``u, v, w, u^2, uv, uw, r = v^2 + w^2, u^3, ur`` (exact: from the vertices, as
    ``mean(fg) = (sum f_k g_k + S_f S_g) / 12`` and ``mean(fgh) = (S_f S_g S_h + sum f_k g_k S_h
    + sum f_k h_k S_g + sum g_k h_k S_f + 2 sum f_k g_k h_k) / 60`` for linear f, g, h,
    ``S_f = f_0 + f_1 + f_2``)."""

    def __init__(self, xp, X, area=True, normal=None):
        u0, u1, u2 = X[0], X[3], X[6]
        v0, v1, v2 = X[1], X[4], X[7]
        w0, w1, w2 = X[2], X[5], X[8]
        e1v, e1w, e2v, e2w = v1 - v0, w1 - w0, v2 - v0, w2 - w0
        cx = e1v * e2w - e1w * e2v
        self.W = 0.5 * cx
        if area:
            e1u, e2u = u1 - u0, u2 - u0
            cy, cz = e1w * e2u - e1u * e2w, e1u * e2v - e1v * e2u
            if normal is None:
                self.area = 0.5 * xp.sqrt(cx * cx + cy * cy + cz * cz)
            else:                       # signed, along the normal
                self.area = 0.5 * (cx * normal[0] + cy * normal[1] + cz * normal[2])
        su, sv, sw = u0 + u1 + u2, v0 + v1 + v2, w0 + w1 + w2
        uu0, uu1, uu2 = u0 * u0, u1 * u1, u2 * u2
        quu = uu0 + uu1 + uu2
        quv = u0 * v0 + u1 * v1 + u2 * v2
        quw = u0 * w0 + u1 * w1 + u2 * w2
        r0, r1, r2 = v0 * v0 + w0 * w0, v1 * v1 + w1 * w1, v2 * v2 + w2 * w2
        sr = r0 + r1 + r2
        svw = sv * sv + sw * sw
        self.u = su / 3.0
        self.v = sv / 3.0
        self.w = sw / 3.0
        self.uu = (quu + su * su) / 12.0
        self.uv = (quv + su * sv) / 12.0
        self.uw = (quw + su * sw) / 12.0
        self.r = (sr + svw) / 12.0
        self.uuu = (su * (su * su + 3.0 * quu) + 2.0 * (uu0 * u0 + uu1 * u1 + uu2 * u2)) / 60.0
        self.ur = (su * (svw + sr) + 2.0 * (quv * sv + quw * sw + u0 * r0 + u1 * r1 + u2 * r2)) / 60.0


def _moment_terms(xp, vox, X, live=None, normal=None):
    """Per triangle its share ``(mass, M_u, M_v, M_w, M_2, facet)`` (moments about the cell's
    origin; the facet share signed along ``normal`` if given): ``int G n_x dS`` for the
    primitives ``G_0``, ``G_1``, ``v G_0``, ``w G_0``, ``G_2 + (v^2 + w^2) G_0``."""
    m = _Means(xp, X, normal=normal)
    c, K0, W = vox.c, vox.K0, m.W
    out = [W * (K0 + c * m.u), W * (vox.K1 + 0.5 * c * m.uu), W * (K0 * m.v + c * m.uv),
           W * (K0 * m.w + c * m.uw), W * (vox.K2 + K0 * m.r + c * (m.uuu / 3.0 + m.ur)), c * m.area]
    if live is not None:
        out = [xp.where(live, a, 0.0) for a in out]
    return out


def _polynomial_terms(xp, vox, X, q, live=None):
    """Per triangle the coefficients ``(a1, a2, a3, a_c, a_cb)`` of ``d1, d2, d3`` (the table
    differences), ``c`` and ``cb`` in its share of ``Q = g M_2 + beta . M_1 + kappa m``
    (moments about the cell's origin; ``q = (kappa, beta_u, beta_v, beta_w, g)``, the
    polynomial's coefficients about the origin): the transpose of :func:`_moment_terms`."""
    m = _Means(xp, X, area=False)
    W, bx, B, E = m.W, vox.bx, vox.B, vox.E
    kappa, g = q[0], q[4]
    a2, a1 = g * W, q[1] * W                             # of K2 and K1
    a0 = W * (g * m.r + q[2] * m.v + q[3] * m.w + kappa)
    ac = W * (g * (m.uuu / 3.0 + m.ur) + 0.5 * q[1] * m.uu + q[2] * m.uv + q[3] * m.uw + kappa * m.u)
    out = [a2 * bx * bx - a1 * bx + a0, 0.5 * a1 - a2 * bx, a2 / 3.0,
           ac - B * (a0 + B * (0.5 * a1 + B * a2 / 3.0)), E * (a0 + E * (0.5 * a1 + E * a2 / 3.0))]
    if live is not None:
        out = [xp.where(live, a, 0.0) for a in out]
    return out


# ----------------------------------------------------------------------------- eager pieces

def _cut(xp, X, axis, offset):
    """The triangles ``X`` (9, P) (the coordinates of their corners) cut by the plane
    ``coordinate[axis] = offset`` (P,): three triangles each, ``(9, 3P)`` (the
    apex's, then the two of the quadrilateral on the other side), their side (True: above)
    and whether they exist (a triangle the plane does not cross is the second one)."""
    rows = _rows(X)
    d = [rows[3 * k + axis] - offset for k in range(3)]
    s = [dk > 0 for dk in d]
    one = (s[0] == s[2]) & (s[1] != s[0])         # the apex: the vertex alone on its side
    two = (s[0] == s[1]) & (s[2] != s[0])

    def rotate(a0, a1, a2):
        return (xp.where(one, a1, xp.where(two, a2, a0)), xp.where(one, a2, xp.where(two, a0, a1)),
                xp.where(one, a0, xp.where(two, a1, a2)))

    crossing = (s[0] != s[1]) | (s[1] != s[2])
    dA, dB, dC = rotate(*d)
    sA, sB, _ = rotate(*s)
    tB = xp.where(crossing, dA / xp.where(crossing, dA - dB, 1.0), 0.0)
    tC = xp.where(crossing, dA / xp.where(crossing, dA - dC, 1.0), 0.0)
    A, B, C, p, q = [], [], [], [], []
    for a in range(3):
        ca, cb, cc = rotate(rows[a], rows[3 + a], rows[6 + a])
        A.append(ca), B.append(cb), C.append(cc)
        if a == axis:
            p.append(xp.where(crossing, offset, ca)), q.append(xp.where(crossing, offset, ca))
        else:
            p.append(ca + tB * (cb - ca)), q.append(ca + tC * (cc - ca))
    out = [xp.concat([t1, t2, t3]) for t1, t2, t3 in zip(A + p + q, p + B + C, p + C + q)]
    yes = xp.ones(crossing.shape, dtype=xp.bool, device=aac.device(crossing))
    return xp.stack(out), xp.concat([sA, sB, sB]), xp.concat([crossing, yes, crossing])


def _rows(X):
    """The rows of a 2-d array, as a list."""
    return [X[r, :] for r in range(X.shape[0])]


def _split_axis(xp, grid, X, key, s, axis, bits):
    """The triangles ``X`` (9, P) (their corners relative to their cells' origins, at ``s``
    (P,) relative to ``lo`` along ``axis``) cut along ``axis`` into slabs: ``(X, key)``
    with the slab of each piece appended to its ``key`` (shifted by ``bits``).

    Round after round, the triangles spanning several slabs are cut at their lowest plane:
    those below it are done, those above it go on; the slab range of each is inherited
    (the lowest one structurally: one more than its parent's)."""
    low, high = grid.ranges(xp, _rows(X), s, axis)
    done = low == high
    go = xp.nonzero(~done)[0]
    if not go.shape[0]:                                 # the common case: nothing to cut
        return X, xp.bitwise_or(xp.bitwise_left_shift(key, bits), low)
    ready = xp.nonzero(done)[0]
    out_X = [xp.take(X, ready, axis=1)]
    out_key = [xp.bitwise_or(xp.bitwise_left_shift(xp.take(key, ready), bits), xp.take(low, ready))]
    M = xp.take(xp.stack([key, low, high]), go, axis=1)
    X, s = xp.take(X, go, axis=1), xp.take(s, go)
    while X.shape[1]:
        cut, side, exists = _cut(xp, X, axis, grid.plane(xp, M[1, :] + 1, s, axis))
        M, s = xp.concat([M, M, M], axis=1), xp.concat([s, s, s])
        low = M[1, :] + xp.astype(side, xp.int64)
        high = xp.where(side, xp.maximum(xp.minimum(M[2, :], grid.top(xp, _rows(cut), s, axis)), low), low)
        last = low == high
        fin = xp.nonzero(exists & last)[0]
        out_X.append(xp.take(cut, fin, axis=1))
        out_key.append(xp.bitwise_or(xp.bitwise_left_shift(xp.take(M[0, :], fin), bits), xp.take(low, fin)))
        more = xp.nonzero(exists & ~last)[0]
        X, s = xp.take(cut, more, axis=1), xp.take(s, more)
        M = xp.take(xp.stack([M[0, :], low, high]), more, axis=1)
    return xp.concat(out_X, axis=1), xp.concat(out_key)


def _eager_triangles(xp, triangles, valid, origin=None, uniform=False):
    """Chunk after chunk of the valid triangles: ``X`` (9, C) relative to the seeds, or to
    the cells' ``origin`` (n, 3) relative to the seeds if given (rows: the coordinates of
    the corners), ``index`` (C,) their flat index into ``(n, T)``. Chunks of the host
    settings' ``triangle_chunk`` triangles (``uniform_triangle_chunk`` for the closed forms on
    a (1, 1, 1) grid, ``uniform``)."""
    n, T = valid.shape
    keep = xp.nonzero(xp.reshape(valid, (-1,)))[0]
    flat = xp.reshape(triangles, (n * T, 9))
    chosen = host_threads.settings()
    total, size = keep.shape[0], chosen.uniform_triangle_chunk if uniform else chosen.triangle_chunk
    for start in range(0, total, size):
        index = keep[start:min(start + size, total)]
        rows = xp.take(flat, index, axis=0)
        if origin is None:
            yield xp.stack([rows[:, r] for r in range(9)]), index
        else:
            o = [xp.take(origin[:, a], index // T) for a in range(3)]
            yield xp.stack([rows[:, r] - o[r % 3] for r in range(9)]), index


def _eager_pieces(xp, grid, triangles, valid, origin):
    """Chunk after chunk of the valid triangles, their pieces in one voxel each, as
    triangles: ``X`` (9, Q) relative to the cells' origins, and per piece its cell, the
    flat index into ``(n, T)`` of the triangle it comes from, and its voxel ``i, j, k``."""
    n, T = valid.shape
    bits = [max(int(m - 1).bit_length(), 1) for m in (n, T) + grid.shape]     # of the fields of a key
    if sum(bits) > 62:
        raise ValueError(f"sdot: {n} cells of {T} triangles on a grid of {grid.shape} voxels: too many for "
                         "64-bit piece keys (integrate in blocks of fewer cells)")
    for X, index in _eager_triangles(xp, triangles, valid, origin):
        # a key per piece: the cell, the triangle in the cell, the voxel, as bit fields
        cell = index // T
        key = xp.bitwise_or(xp.bitwise_left_shift(cell, bits[1]), index - cell * T)
        done = 0
        for axis in range(3):
            if grid.shape[axis] > 1:
                owner = xp.bitwise_right_shift(key, bits[1] + done) if done else cell
                X, key = _split_axis(xp, grid, X, key, xp.take(grid.sl[:, axis], owner), axis, bits[2 + axis])
            else:
                key = xp.bitwise_left_shift(key, bits[2 + axis])
            done += bits[2 + axis]
        fields = []
        for b in bits[:1:-1]:
            fields.append(xp.bitwise_and(key, (1 << b) - 1))
            key = xp.bitwise_right_shift(key, b)
        t = xp.bitwise_and(key, (1 << bits[1]) - 1)
        cell = xp.bitwise_right_shift(key, bits[1])
        yield X, (cell, cell * T + t, fields[2], fields[1], fields[0])


def _cell_integrals_eager(xp, grid, origin, triangles, slot, valid, F, flat_values, tables):
    """:func:`_cell_integrals`, eagerly."""
    n, T = valid.shape
    dtype, dev = triangles.dtype, aac.device(triangles)
    moments = [xp.zeros((n,), dtype=dtype, device=dev) for _ in range(5)]
    facet = xp.zeros((n * F,), dtype=dtype, device=dev)
    flat_slot = xp.reshape(slot, (-1,))
    for X, (cell, tri, i, j, k) in _eager_pieces(xp, grid, triangles, valid, origin):
        vox = _Voxel(xp, grid, i, j, k, xp.take(grid.sl[:, 0], cell), xp.take(grid.base, cell), tables, flat_values)
        terms = _moment_terms(xp, vox, _rows(X))
        moments = [m + _compat.segment_sum(xp, t, cell, n) for m, t in zip(moments, terms)]
        facet = facet + _compat.segment_sum(xp, terms[5], cell * F + xp.take(flat_slot, tri), n * F)
    return xp.stack(moments, axis=1), xp.reshape(facet, (n, F))


def _polynomial_eager(xp, grid, origin, triangles, valid, q, scatter):
    """:func:`_polynomial_block`, eagerly."""
    n, T = valid.shape
    n0, n1, n2 = grid.shape
    dtype, dev = triangles.dtype, aac.device(triangles)
    acc = (xp.zeros((3 * n1 * n2 * (n0 + 1),), dtype=dtype, device=dev),
           xp.zeros((n0 * n1 * n2,), dtype=dtype, device=dev))
    for X, (cell, _, i, j, k) in _eager_pieces(xp, grid, triangles, valid, origin):
        vox = _Voxel(xp, grid, i, j, k, xp.take(grid.sl[:, 0], cell), xp.take(grid.base, cell))
        acc = scatter(vox, _polynomial_terms(xp, vox, _rows(X), [xp.take(q[a, :], cell) for a in range(5)]), acc)
    return acc[0][None, :], acc[1][None, :]


# ----------------------------------------------------------------------------- static pieces

def _clip(xp, A, B, ok, slot, axis, sign, plane, apply):
    """The pieces given by their directed boundary edges ``(A, B)`` ((P, E, 3) each, ``ok``
    (P, E) the edges in use) clipped to ``sign (x[axis] - plane) <= 0`` (``sign`` +-1, a
    0-d array, ``plane`` (P,)) where ``apply`` (P,); the new edge goes to slot ``slot``.

    Each edge is clipped on its own; the new edge, along the plane, goes from the point
    where the boundary leaves the half-space to the point where it comes back. No gather
    (they compile slowly under ``jax.jit``): a piece is convex, so there is one of each
    (their means if rounding makes more), found by one masked sum."""
    dev = aac.device(A)
    da, db = sign * (A[..., axis] - plane[:, None]), sign * (B[..., axis] - plane[:, None])
    on = apply[:, None]
    ia, ib = (da <= 0.0) | ~on, (db <= 0.0) | ~on
    leave, enter = ok & ia & ~ib, ok & ~ia & ib
    t = da / xp.where(ia == ib, -1.0, da - db)
    at_plane = xp.broadcast_to(plane[:, None], t.shape)
    cross = xp.stack([at_plane if c == axis else A[..., c] + t * (B[..., c] - A[..., c]) for c in range(3)]
                     + [xp.ones(t.shape, dtype=t.dtype, device=dev)], axis=2)                # (P, E, 4)
    weights = xp.stack([xp.astype(leave, t.dtype), xp.astype(enter, t.dtype)], axis=2)      # (P, E, 2)
    sums = xp.sum(weights[..., None] * cross[:, :, None, :], axis=1)                         # (P, 2, 4)
    ends = sums[..., :3] / xp.maximum(sums[..., 3:], 1.0)
    cross = cross[..., :3]
    new = (xp.arange(A.shape[1], dtype=xp.int64, device=dev) == slot)[None, :]
    closing = new & ((sums[:, 0, 3] > 0.0) & (sums[:, 1, 3] > 0.0))[:, None]
    A = xp.where(new[..., None], ends[:, :1, :], xp.where(enter[..., None], cross, A))
    B = xp.where(new[..., None], ends[:, 1:, :], xp.where(leave[..., None], cross, B))
    return A, B, (ok & (ia | ib)) | closing


#: Triangles per segment of the static path: the triangles sorted by their count of voxels,
#: each segment runs as many rounds as its first needs.
SEGMENT = 8192


def _static_pieces(xp, grid, triangles, valid, visit, acc):
    """``acc = visit(X, live, normal, (i, j, k), rows, acc)`` over the pieces of the valid
    triangles (relative to their cells' origins), in static shapes.

    The triangles are sorted by the count of voxels of their boxes (most first) and taken
    by segments of :data:`SEGMENT`; round r of a segment takes voxel r of the box of each
    of its triangles (``rows``, flat indices into ``(n, T)``) and the piece of the triangle
    in it: the triangles ``X`` (9 arrays (S, E), ``live`` where they count) from a point
    of the piece to its boundary edges (signed: their sum is the piece), ``normal`` the
    triangle's unit normal (3 arrays (S, 1)). The piece is the triangle clipped by the
    voxel's planes (those inside the box), as a list of edges: the triangle's 3, one per
    clip. A segment runs as many rounds as its first triangle has voxels; the invalid
    triangles (none) come last."""
    n, T = valid.shape
    P = n * T
    if P == 0:
        return acc
    dev = aac.device(triangles)
    dtype = triangles.dtype
    ok = xp.reshape(valid, (-1,))
    flat = xp.where(ok[:, None], xp.reshape(triangles, (P, 9)), 0.0)     # no junk from the unused slots
    cell = xp.arange(P, dtype=xp.int64, device=dev) // T
    X = [flat[:, r] for r in range(9)]
    boxes, axes_cut = xp.astype(ok, xp.int64), 0
    for a in range(3):
        lw, hg = grid.ranges(xp, X, xp.take(grid.sl[:, a], cell), a)
        boxes, axes_cut = boxes * (hg - lw + 1), axes_cut + (1 << a) * xp.astype(hg > lw, xp.int64)
    S = min(SEGMENT, P)
    # most voxels first, and among those of a count, by the axes they span: the clips no
    # triangle of a segment needs are skipped (a segment of triangles in one voxel clips none)
    order = xp.argsort(boxes * 8 + axes_cut, descending=True, stable=True)
    axes = [a for a in range(3) if grid.shape[a] > 1]
    within = xp.arange(S, dtype=xp.int64, device=dev)

    def segment(g, acc):
        at = g * S + within
        rows = xp.take(order, xp.minimum(at, P - 1))
        Xs = xp.take(flat, rows, axis=0)                                  # (S, 9)
        here = xp.take(ok, rows) & (at < P)
        sl = [xp.take(grid.sl[:, a], rows // T) for a in range(3)]
        corners = [Xs[:, r] for r in range(9)]
        low, high = [], []
        for a in range(3):
            lw, hg = grid.ranges(xp, corners, sl[a], a)
            low.append(lw), high.append(hg)
        size = [hg - lw + 1 for lw, hg in zip(low, high)]
        count = xp.where(here, size[0] * size[1] * size[2], 0)
        triangle = xp.reshape(Xs, (S, 3, 3))
        edges_a, edges_b = triangle, xp.concat([triangle[:, 1:, :], triangle[:, :1, :]], axis=1)
        two = (xp.zeros((S, 2, 3), dtype=dtype, device=dev), xp.zeros((S, 2), dtype=xp.bool, device=dev))
        e1 = [corners[3 + a] - corners[a] for a in range(3)]
        e2 = [corners[6 + a] - corners[a] for a in range(3)]
        normal = [e1[1] * e2[2] - e1[2] * e2[1], e1[2] * e2[0] - e1[0] * e2[2], e1[0] * e2[1] - e1[1] * e2[0]]
        length = xp.sqrt(normal[0] * normal[0] + normal[1] * normal[1] + normal[2] * normal[2])
        normal = [(c / xp.where(length > 0.0, length, 1.0))[:, None] for c in normal]

        def body(state):
            r, acc = state
            live = r < count
            rz = r % size[2]
            ry = (r // size[2]) % size[1]
            rx = r // (size[2] * size[1])
            index = [xp.minimum(low[0] + rx, high[0]), xp.minimum(low[1] + ry, high[1]),
                     xp.minimum(low[2] + rz, high[2])]
            offsets = (rx, ry, rz)
            A, B, on = edges_a, edges_b, xp.broadcast_to(live[:, None], (S, 3))
            for stage, a in enumerate(axes):                # the voxel's planes across a, below then above
                A, B, on = (xp.concat([A, two[0]], axis=1), xp.concat([B, two[0]], axis=1),
                            xp.concat([on, two[1]], axis=1))
                below, above = grid.plane(xp, index[a], sl[a], a), grid.plane(xp, index[a] + 1, sl[a], a)

                def clip(side, edges, a=a, stage=stage, below=below, above=above):
                    upper = xp.asarray(side > 0, device=dev)
                    needed = xp.where(upper, offsets[a] < size[a] - 1, offsets[a] > 0)
                    sign = 2.0 * side - 1.0
                    return _compat.cond(
                        xp.any(needed),
                        lambda: _clip(xp, *edges, 3 + 2 * stage + side, a, sign, xp.where(upper, above, below), needed),
                        lambda: edges)

                A, B, on = _compat.fori_loop(0, 2, clip, (A, B, on))
            weight = xp.astype(on, dtype)[..., None]
            O = xp.sum(weight * A, axis=1, keepdims=True) / xp.maximum(xp.sum(weight, axis=1, keepdims=True), 1.0)
            O = xp.broadcast_to(O, A.shape)
            tri = [Y[..., a] for Y in (O, A, B) for a in range(3)]
            return r + 1, visit(tri, on, normal, index, rows, acc)

        state = (xp.asarray(0, dtype=xp.int64, device=dev), acc)
        return _compat.while_loop(lambda s_: s_[0] < xp.max(count), body, state)[1]

    return _compat.fori_loop(0, -(-P // S), segment, acc)


# ----------------------------------------------------------------------------- kernels

@_compat.jit_on_jax("F")
def _cell_integrals(xp, seeds, origin, triangles, slot, valid, F, values, tables, lo, hi):
    """:func:`cell_integrals_of_triangles` of one block of cells, about their ``origin``
    (n, 3) relative to the seeds (``tables``: the :func:`prefix_tables` of ``values``)."""
    n, T = valid.shape
    grid = _Grid(xp, seeds + origin, values.shape, lo, hi)
    flat_values = xp.reshape(values, (-1,))
    if not _compat.static_shapes(triangles, valid):
        return _cell_integrals_eager(xp, grid, origin, triangles, slot, valid, F, flat_values, tables)
    flat_slot = xp.reshape(slot, (-1,))

    def visit(X, live, normal, index, rows, acc):
        cell = rows // T
        vox = _Voxel(xp, grid, index[0], index[1], index[2], xp.take(grid.sl[:, 0], cell), xp.take(grid.base, cell),
                     tables, flat_values).fan()
        terms = [xp.sum(t, axis=1) for t in _moment_terms(xp, vox, X, live, normal)]
        moments = tuple(a + _compat.segment_sum(xp, t, cell, n) for a, t in zip(acc[:5], terms))
        return moments + (acc[5] + _compat.segment_sum(xp, terms[5], cell * F + xp.take(flat_slot, rows), n * F),)

    zero = xp.zeros((n,), dtype=seeds.dtype, device=aac.device(seeds))
    acc = (zero,) * 5 + (xp.zeros((n * F,), dtype=seeds.dtype, device=aac.device(seeds)),)
    acc = _static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    return xp.stack(acc[:5], axis=1), xp.reshape(acc[5], (n, F))


@_compat.jit_on_jax("shape")
def _polynomial_block(xp, seeds, origin, triangles, valid, coefficients, shape, lo, hi):
    """Per block of cells, the gradient of ``Q = sum_i int_{L_i} (a_i + b_i . u + c_i |u|^2) rho``
    with respect to the prefix tables ``(1, 3 R (n0 + 1))`` and to the voxel values directly
    ``(1, n0 n1 n2)``; about the cells' ``origin`` (n, 3) relative to the seeds, where the
    polynomial is ``kappa + beta . (u - o) + c |u - o|^2`` (``q`` below)."""
    n, T = valid.shape
    n0, n1, n2 = shape
    grid = _Grid(xp, seeds + origin, shape, lo, hi)
    dev = aac.device(seeds)
    size = n1 * n2 * (n0 + 1)
    nvox = n0 * n1 * n2
    a, b, c = coefficients[:, 0], coefficients[:, 1:4], coefficients[:, 4]
    kappa = a + _compat.dot(b, origin) + c * _compat.dot(origin, origin)
    beta = b + 2.0 * c[:, None] * origin
    q = xp.stack([kappa, beta[:, 0], beta[:, 1], beta[:, 2], c])                # (5, n)

    def scatter(vox, terms, acc):
        """``acc`` plus the coefficients of ``d_m = A_m[at] - A_m[at_base]`` (into the
        tables' gradient) and of the voxel values ``c`` and ``cb``."""
        coef = xp.concat(terms[:3] + [-t for t in terms[:3]])
        at = xp.concat([vox.at + size * m for m in range(3)] + [vox.at_base + size * m for m in range(3)])
        return (acc[0] + _compat.segment_sum(xp, coef, at, 3 * size),
                acc[1] + _compat.segment_sum(xp, xp.concat(terms[3:]), xp.concat([vox.voxel, vox.base_voxel]),
                                             nvox))

    if not _compat.static_shapes(triangles, valid):
        return _polynomial_eager(xp, grid, origin, triangles, valid, q, scatter)

    def visit(X, live, normal, index, rows, acc):
        cell = rows // T
        vox = _Voxel(xp, grid, index[0], index[1], index[2], xp.take(grid.sl[:, 0], cell), xp.take(grid.base, cell))
        terms = _polynomial_terms(xp, vox.fan(), X, [xp.take(q[a, :], cell)[:, None] for a in range(5)], live)
        return scatter(vox, [xp.sum(t, axis=1) for t in terms], acc)

    acc = (xp.zeros((3 * size,), dtype=seeds.dtype, device=dev), xp.zeros((nvox,), dtype=seeds.dtype, device=dev))
    g_tables, g_voxels = _static_pieces(xp, grid, triangles - origin[:, None, None, :], valid, visit, acc)
    return g_tables[None, :], g_voxels[None, :]


@_compat.jit_on_jax("F")
def _uniform_integrals(xp, triangles, slot, valid, F, values):
    """:func:`cell_integrals_of_triangles` for a constant density ``c`` (one voxel), in
    closed form over the tetrahedra ``(0, a, b, c)`` from the seed: with
    ``D = a . (b x c)``, ``mass = c sum D / 6``, ``M_1 = c sum D (a + b + c) / 24``,
    ``M_2 = c sum D (|a|^2 + |b|^2 + |c|^2 + |a + b + c|^2) / 120``; the facet
    integrals sum ``c |(b - a) x (c - a)| / 2``. Eagerly on the valid triangles only, chunk
    by chunk (:func:`_eager_triangles`)."""
    n, T = valid.shape
    dtype, dev = triangles.dtype, aac.device(triangles)
    c = xp.reshape(values, (1,))
    cell_slot = xp.reshape(xp.arange(n, dtype=xp.int64, device=dev)[:, None] * F + slot, (-1,))
    if _compat.static_shapes(triangles, valid):
        ok = xp.reshape(valid, (-1,))
        flat = xp.where(ok[:, None], xp.reshape(triangles, (n * T, 9)), 0.0)    # no junk from unused slots
        terms = tetrahedra(xp, [flat[:, r] for r in range(9)])
        moments = xp.stack([xp.sum(xp.reshape(t, (n, T)), axis=1) for t in terms[:5]], axis=1)
        facet = _compat.segment_sum(xp, terms[5], cell_slot, n * F)
        return c * moments, c * xp.reshape(facet, (n, F))
    moments = [xp.zeros((n,), dtype=dtype, device=dev) for _ in range(5)]
    facet = xp.zeros((n * F,), dtype=dtype, device=dev)
    for X, index in _eager_triangles(xp, triangles, valid, uniform=True):
        terms = tetrahedra(xp, _rows(X))
        cell = index // T
        moments = [m + _compat.segment_sum(xp, t, cell, n) for m, t in zip(moments, terms)]
        facet = facet + _compat.segment_sum(xp, terms[5], xp.take(cell_slot, index), n * F)
    return c * xp.stack(moments, axis=1), c * xp.reshape(facet, (n, F))


def determinants(xp, a, b, c):
    """``a . (b x c)`` of the rows of ``a, b, c`` (T, 3): six times the signed volume of the
    tetrahedron ``(0, a, b, c)``, as :func:`tetrahedra` rounds it."""
    ax, ay, az, bx, by, bz, cx, cy, cz = (x[:, k] for x in (a, b, c) for k in range(3))
    return ax * (by * cz - bz * cy) + ay * (bz * cx - bx * cz) + az * (bx * cy - by * cx)


def tetrahedra(xp, X):
    """Per triangle ``(a, b, c)`` (9 arrays), the volume, first moments and second moment of
    the tetrahedron ``(0, a, b, c)`` (signed), and the triangle's area."""
    ax, ay, az, bx, by, bz, cx, cy, cz = X
    det = ax * (by * cz - bz * cy) + ay * (bz * cx - bx * cz) + az * (bx * cy - by * cx)
    sx, sy, sz = ax + bx + cx, ay + by + cy, az + bz + cz
    sq = ax * ax + ay * ay + az * az + bx * bx + by * by + bz * bz + cx * cx + cy * cy + cz * cz
    d24 = det / 24.0
    e1x, e1y, e1z, e2x, e2y, e2z = bx - ax, by - ay, bz - az, cx - ax, cy - ay, cz - az
    nx, ny, nz = e1y * e2z - e1z * e2y, e1z * e2x - e1x * e2z, e1x * e2y - e1y * e2x
    return [det / 6.0, d24 * sx, d24 * sy, d24 * sz, det / 120.0 * (sq + sx * sx + sy * sy + sz * sz),
            0.5 * xp.sqrt(nx * nx + ny * ny + nz * nz)]


# ----------------------------------------------------------------------------- far cells

def _far_origins(xp, triangles, valid):
    """Per cell, the first vertex of its first valid triangle (relative to the seed) if
    farther than :data:`FAR`, else 0; ``None`` eagerly when no cell is that far."""
    vertex, far = _first_vertices(xp, triangles, valid)
    return None if _compat.known_none(xp, far) else xp.where(far[:, None], vertex, 0.0)


@_compat.jit_on_jax()
def _first_vertices(xp, triangles, valid):
    """Per cell, the first vertex of its first valid triangle (0 for a cell without one),
    and whether it is farther than :data:`FAR`."""
    n, T = valid.shape
    first = xp.astype(xp.argmax(xp.astype(valid, xp.int8), axis=1), xp.int64)
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(triangles)) * T + first
    vertex = xp.take(xp.reshape(triangles, (n * T, 9)), rows, axis=0)[:, :3]
    some = xp.any(valid, axis=1)
    vertex = xp.where(some[:, None], vertex, 0.0)
    return vertex, xp.max(xp.abs(vertex), axis=1) > FAR
