"""Exact integrals of a piecewise-constant grid density over polygons and edges.

Integrals over a cell become contour integrals (divergence theorem):
``int_P rho f = oint F dv`` with ``F(u, v) = int_{X_b}^{x} rho(s, y) f(s, y) ds``,
in seed-relative coordinates ``u = x - y_i``, ``v = y - y_i``; the base
``X_b`` is the left side of the grid column holding the seed, so that cells
inside one column need no prefix table at all (no cancellation). Edges are
split at every grid line, so that each piece lies in one pixel where F is a
polynomial: with the row prefix tables ``A_m[j, i] = sum_{k<i} c_kj (X_{k+1}^m -
X_k^m)``, ``F`` on pixel (i, j) is

    T_p + c_ij ((u^{p+1} - U_i^{p+1}) / (p+1)),   U_i = X_i - x_i,
    T_p = 1/(p+1) sum_m binom(p+1, m) (-x_i)^{p+1-m} (A_m[j, i] - A_m[j, i_s]),

for ``f = u^p``, times ``v^q`` for ``f = u^p v^q``. The integrand along a piece
is a polynomial of degree <= 3, integrated exactly by 2-point Gauss-Legendre.

The pieces of all edges are visited together, piece r of every edge at
iteration r: the breakpoints of an edge are the merge of its crossings with
the vertical and the horizontal grid lines (two arithmetic sequences), so
each iteration advances one of two counters per edge. Shapes stay static and
the loop runs ``max over edges of (crossings + 1)`` times (once for a
constant density on the box).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import array_api_compat as aac

from ..._host import threads as host_threads
from .. import _compat, row_blocks
from ..moments import about_seeds
from .polygons import FAR, gather

GAUSS = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def prefix_tables(xp, density, lo, hi):
    """``A_m`` (m = 1, 2, 3) of shape (3, n_y, n_x + 1) for a density ``(n_x, n_y)``."""
    nx = density.shape[0]
    dev = aac.device(density)
    xs = lo[0] + (hi[0] - lo[0]) * xp.arange(nx + 1, dtype=density.dtype, device=dev) / nx
    zero = xp.zeros((density.shape[1], 1), dtype=density.dtype, device=dev)
    tables = []
    for m in (1, 2, 3):
        band = xs[1:] ** m - xs[:-1] ** m                       # (nx,)
        terms = xp.permute_dims(density, (1, 0)) * band[None, :]  # (ny, nx)
        tables.append(xp.concat([zero, xp.cumulative_sum(terms, axis=1)], axis=1))
    return xp.stack(tables)


def clamp(xp, x, low, high):
    """``min(max(x, low), high)`` (faster than ``clip`` with array bounds)."""
    return xp.minimum(xp.maximum(x, low), high)


class Edges:
    """The edges of the cells as a flat list (P,): eagerly the valid edge slots only,
    under static shapes every slot ``(n V)`` (``valid`` marks the real ones); ``slot`` is the
    flat index ``i V + k`` of each, ``cell`` its cell; endpoints relative to the
    seed and in grid coordinates."""

    def __init__(self, xp, seeds, verts, count, lo, hi, grid_shape):
        n, cap, _ = verts.shape
        dev = aac.device(verts)
        k = xp.arange(cap, dtype=xp.int64, device=dev)[None, :]
        valid = xp.reshape(k < count[:, None], (-1,))
        slot, valid = _compat.rows_where(xp, valid)     # eagerly >= 1: a block may have no edge
        self.n, self.cap, self.slot, self.valid = n, cap, slot, valid
        self.cell = slot // cap
        k = slot % cap
        nxt = self.cell * cap + (k + 1) % xp.maximum(xp.take(count, self.cell), 1)
        flat = xp.reshape(verts, (n * cap, 2))
        self.a = xp.take(flat, slot, axis=0)
        self.b = xp.take(flat, nxt, axis=0)
        shape = xp.asarray(grid_shape, dtype=verts.dtype, device=dev)
        self.scale = shape / (hi - lo)
        self.origin = xp.take(seeds - lo, self.cell, axis=0)
        self._grid_coordinates(xp, shape)

    def _grid_coordinates(self, xp, shape):
        """The endpoints in grid coordinates and the grid lines each edge crosses."""
        self.shape_ = shape
        self.ga = clamp(xp, (self.origin + self.a) * self.scale, 0.0, shape)
        self.gb = clamp(xp, (self.origin + self.b) * self.scale, 0.0, shape)
        top = shape - 1.0                     # a point on the upper side is in the last pixel
        fa, fb = xp.minimum(xp.floor(self.ga), top), xp.minimum(xp.floor(self.gb), top)
        cross = xp.where(self.valid[:, None], xp.abs(fb - fa), 0.0)
        self.n_cross = xp.astype(cross, xp.int64)                  # (P, 2)
        # the m-th crossed line along each axis: fa + 1 + m going up, fa - m going down
        self.up = self.gb > self.ga
        self.first_line = xp.where(self.up, fa + 1.0, fa)
        den = self.gb - self.ga
        self.den = xp.where(den == 0, 1.0, den)

    def groups(self, xp):
        """Eagerly, the edges of up to 2 pieces, of 3 or 4, and the pieces of the others as
        edges of their own (:meth:`pieces`): the piece loop then runs at most 4 rounds,
        not as many as the longest edge has pieces (cells that cross many pixels: in empty
        regions, or on fine grids). Under static shapes, all edges at once."""
        if _compat.static_shapes(self.a):
            return [self]
        pieces = self.n_cross[:, 0] + self.n_cross[:, 1] + 1
        if _compat.to_int(xp.max(xp.where(self.valid, pieces, 0))) <= 4:
            return [self]
        out = []
        for low, high in ((0, 2), (2, 4)):
            idx, ok = _compat.true_entries(xp, self.valid & (pieces > low) & (pieces <= high))
            if _compat.host_any(xp, ok):
                out.append(self.subset(xp, idx, ok))
        idx, ok = _compat.true_entries(xp, self.valid & (pieces > 4))
        return out + [self.subset(xp, idx, ok).pieces(xp)]

    def pieces(self, xp):
        """Eagerly, every piece of every edge (its part in one pixel) as an edge of its own:
        the crossings of each edge with the grid lines, sorted along it."""
        dev = aac.device(self.a)
        counts = self.n_cross[:, 0] + self.n_cross[:, 1]                      # crossings per edge
        total = _compat.to_int(xp.sum(counts))
        P = counts.shape[0]
        edge = xp.arange(P, dtype=xp.int64, device=dev)
        # the crossings: edge of each, rank among its crossings, and the axis of that rank
        owner = xp.repeat(edge, counts) if total else xp.zeros((0,), dtype=xp.int64, device=dev)
        start = xp.cumulative_sum(counts) - counts
        rank = xp.arange(total, dtype=xp.int64, device=dev) - xp.take(start, owner)
        nx = xp.take(self.n_cross[:, 0], owner)
        axis = xp.astype(rank >= nx, xp.int64)
        m = rank - axis * nx
        line = xp.take(xp.reshape(self.first_line, (-1,)), owner * 2 + axis)
        sign = 2.0 * xp.astype(xp.take(xp.reshape(self.up, (-1,)), owner * 2 + axis), self.a.dtype) - 1.0
        t = (line + sign * xp.astype(m, line.dtype) - xp.take(xp.reshape(self.ga, (-1,)), owner * 2 + axis)) \
            / xp.take(xp.reshape(self.den, (-1,)), owner * 2 + axis)
        t = clamp(xp, t, 0.0, 1.0)
        # breakpoints of every edge: 0, its crossings, 1, sorted along the edge
        owner = xp.concat([edge, owner, edge])
        t = xp.concat([xp.zeros((P,), dtype=t.dtype, device=dev), t, xp.ones((P,), dtype=t.dtype, device=dev)])
        order = xp.argsort(t, stable=True)
        order = xp.take(order, xp.argsort(xp.take(owner, order), stable=True))
        owner, t = xp.take(owner, order), xp.take(t, order)
        last = xp.concat([owner[1:] != owner[:-1], xp.ones((1,), dtype=xp.bool, device=dev)])
        keep = xp.nonzero(~last)[0]                                          # piece [t_k, t_k+1]
        owner = xp.take(owner, keep)
        t0, t1 = xp.take(t, keep), xp.take(t, keep + 1)
        a, b = xp.take(self.a, owner, axis=0), xp.take(self.b, owner, axis=0)
        sub = object.__new__(Edges)
        sub.n, sub.cap, sub.scale = self.n, self.cap, self.scale
        sub.slot, sub.cell, sub.origin = (xp.take(v, owner, axis=0) for v in (self.slot, self.cell, self.origin))
        sub.valid = xp.take(self.valid, owner)
        sub.a, sub.b = a + t0[:, None] * (b - a), a + t1[:, None] * (b - a)
        sub._grid_coordinates(xp, self.shape_)
        return sub

    def subset(self, xp, idx, ok):
        """The edges ``idx`` (those where ``ok``; the others are padding)."""
        sub = object.__new__(Edges)
        sub.__dict__.update(self.__dict__)
        for name, value in self.__dict__.items():
            if name not in ("n", "cap", "scale", "shape_", "valid"):
                sub.__dict__[name] = xp.take(value, idx, axis=0)
        sub.valid = xp.take(self.valid, idx) & ok
        sub.n_cross = xp.where(sub.valid[:, None], sub.n_cross, 0)
        return sub

    def crossing(self, xp, m):
        """Edge parameter ``t`` of the m-th crossing along each axis (1 when exhausted)."""
        mf = xp.astype(m, self.ga.dtype)
        line = self.first_line + xp.where(self.up, mf, -mf)
        t = clamp(xp, (line - self.ga) / self.den, 0.0, 1.0)
        return xp.where(m < self.n_cross, t, 1.0)

    def per_cell(self, xp, values):
        """Sum of per-edge ``values`` (P,) over each cell, (n,)."""
        return _compat.segment_sum(xp, xp.where(self.valid, values, 0.0), self.cell, self.n)

    def per_slot(self, xp, values):
        """Per-edge ``values`` (P,) as ``(n, V)``, zero on empty slots (summed over the
        pieces of an edge, see :meth:`pieces`)."""
        values = xp.where(self.valid, values, 0.0)
        return xp.reshape(_compat.segment_sum(xp, values, self.slot, self.n * self.cap), (self.n, self.cap))


class Piece(NamedTuple):
    """Piece r of every edge (P,): endpoints ``p``, ``q`` (P, 2) relative to the
    seed, pixel ``ix``, ``iy``, ``live`` where the edge has a piece r."""

    p: object
    q: object
    ix: object
    iy: object
    live: object


def visit_pieces(xp, e, grid_shape, visit, acc):
    """``acc = visit(piece, acc)`` for every piece rank r (see the module docstring)."""
    dev = aac.device(e.a)
    pieces = e.n_cross[:, 0] + e.n_cross[:, 1] + 1                       # per edge
    last = xp.max(xp.where(e.valid, pieces, 0))

    def body(state):
        r, m, t0, acc = state
        tm = e.crossing(xp, m)                                     # (P, 2)
        t1 = xp.minimum(tm[:, 0], tm[:, 1])
        p = e.a + t0[:, None] * (e.b - e.a)
        q = e.a + t1[:, None] * (e.b - e.a)
        mid = xp.maximum(e.origin + 0.5 * (p + q), 0.0) * e.scale
        pix = xp.astype(xp.floor(mid), xp.int64)
        ix = xp.minimum(pix[:, 0], grid_shape[0] - 1)
        iy = xp.minimum(pix[:, 1], grid_shape[1] - 1)
        acc = visit(Piece(p, q, ix, iy, e.valid & (r < pieces)), acc)
        step_x = tm[:, 0] <= tm[:, 1]
        m = m + xp.astype(xp.stack([step_x, ~step_x], axis=-1), xp.int64)
        return r + 1, m, t1, acc

    P = e.a.shape[0]
    state = (xp.asarray(0, dtype=xp.int64, device=dev), xp.zeros((P, 2), dtype=xp.int64, device=dev),
             xp.zeros((P,), dtype=e.a.dtype, device=dev), acc)
    return _compat.while_loop(lambda s: s[0] < last, body, state)[3]


class PieceGrid:
    """What every piece needs from the grid: its shape and pixel width, the seed's column."""

    def __init__(self, xp, seeds, e, density_shape, lo, hi):
        self.shape = tuple(density_shape)
        self.dx = (hi[0] - lo[0]) / self.shape[0]
        self.sx = xp.take(seeds[:, 0], e.cell)                      # (P,)
        column = xp.astype(xp.floor((self.sx - lo[0]) / self.dx), xp.int64)
        self.col_seed = xp.minimum(xp.maximum(column, 0), self.shape[0] - 1)
        self.lo = lo

    def table_index(self, piece):
        """Flat indices into the tables of the piece's pixel and of the seed's column."""
        width = self.shape[0] + 1
        return piece.iy * width + piece.ix, piece.iy * width + self.col_seed

    def u_left(self, xp, piece):
        """Left side of the piece's pixel, relative to the seed."""
        return self.lo[0] + self.dx * xp.astype(piece.ix, self.sx.dtype) - self.sx

    def antiderivatives(self, xp, piece, tables, flat_density):
        """``(F_0, F_1, F_2)`` on the piece's pixel as functions of ``u`` (the seed-relative
        abscissa): ``F_p(u) = int_{X_b}^{x} rho s^p ds`` (``s`` relative to the seed) is
        ``T_p + c (u^{p+1} - U^{p+1}) / (p + 1)``, see the module docstring."""
        at_pixel, at_seed = self.table_index(piece)
        d1, d2, d3 = (xp.take(tables[i, :], at_pixel) - xp.take(tables[i, :], at_seed) for i in range(3))
        c = xp.where(piece.live, xp.take(flat_density, piece.ix * self.shape[1] + piece.iy), 0.0)
        sx = self.sx
        t0, t1 = d1, 0.5 * (d2 - 2.0 * sx * d1)
        t2 = (d3 - 3.0 * sx * d2 + 3.0 * sx * sx * d1) / 3.0
        ul = self.u_left(xp, piece)
        ul2, ul3 = ul * ul, ul * ul * ul
        return (lambda u: t0 + c * (u - ul), lambda u: t1 + c * (u * u - ul2) * 0.5,
                lambda u: t2 + c * (u * u * u - ul3) / 3.0, c)


def cell_integrals(xp, seeds, cells, density, lo, hi):
    """Per cell ``(mass, M_x, M_y, M_2)`` about the seed ``(n, 4)``, and per edge slot
    the density integrated along the edge ``(n, V)``.

    ``M_x = int (x - y_i) rho``, ``M_2 = int |x - y_i|^2 rho`` over the cell.
    Eagerly in blocks of rows (:func:`..row_blocks.blockwise`): the per-piece
    temporaries of all edges at once would dominate the memory of a solve. The prefix
    tables of the density are computed once, not per block. Eagerly on the host, by the
    compiled kernel (:func:`sdot._host.compiled.integrals2d.cell_integrals`).
    """
    def kernel(*host):
        from ..._host.compiled import integrals2d

        return integrals2d.cell_integrals(*host)
    found = _compat.compiled_call(xp, kernel, seeds, cells.vertices, cells.labels, cells.count, density, lo, hi)
    if found is not None:
        return found
    origin = far_origins(xp, cells.vertices, cells.count)
    vertices = cells.vertices
    if origin is not None:
        seeds, vertices = seeds + origin, vertices - origin[:, None, :]
    if tuple(density.shape) == (1, 1):
        moments, facet = row_blocks.slotwise(xp, lambda c, s, v: uniform_integrals(xp, s, v, c, density, lo, hi),
                                          cells.count, (seeds,), (vertices,), (None, 0.0))
    else:
        moments, facet = _pixel_integrals(xp, seeds, vertices, cells.count, density, lo, hi)
    return (moments if origin is None else about_seeds(xp, moments, origin)), facet


def _pixel_integrals(xp, seeds, vertices, count, density, lo, hi):
    """:func:`cell_integrals` against a grid of pixels: eagerly, the cells that lie in one
    pixel in closed form (:func:`_polygon_integrals`), the others by the walk along their
    edges (:func:`edge_walk`); traced, every cell by the walk.

    Cells smaller than the pixels mostly lie in one (1e5 cells on 64x64 pixels: about
    three in four), and the walk visits every edge as often as the most split one."""
    tables = xp.reshape(prefix_tables(xp, density, lo, hi), (3, -1))

    def walk(s, v, c):
        split, facet = row_blocks.blockwise(xp, lambda s, v, c: edge_walk(xp, s, v, c, density, tables, lo, hi),
                                         s, v, c)
        return xp.concat([split[:, :3], split[:, 3:4] + split[:, 4:]], axis=1), facet

    chosen = host_threads.settings()            # cells_per_pixel, one_pixel_share
    if _compat.static_shapes(seeds, vertices, count) or seeds.shape[0] < chosen.cells_per_pixel * math.prod(density.shape):
        return walk(seeds, vertices, count)
    pixel = _pixel_of_cells(xp, seeds, vertices, count, lo, hi, density.shape)
    one = xp.nonzero(pixel >= 0)[0]
    if one.shape[0] < chosen.one_pixel_share * seeds.shape[0]:
        return walk(seeds, vertices, count)
    rest = xp.nonzero(pixel < 0)[0]
    values = xp.take(xp.reshape(density, (-1,)), xp.take(pixel, one))
    m_one, f_one = row_blocks.blockwise(xp, lambda v, c, d: _polygon_integrals(xp, v[..., 0], v[..., 1], c, d),
                                     xp.take(vertices, one, axis=0), xp.take(count, one), values)
    n, cap = vertices.shape[:2]
    dev = aac.device(vertices)
    moments = _compat.put_rows(xp, xp.zeros((n, 4), dtype=vertices.dtype, device=dev), one, m_one)
    facet = _compat.put_rows(xp, xp.zeros((n, cap), dtype=vertices.dtype, device=dev), one, f_one)
    if rest.shape[0]:
        m_rest, f_rest = walk(xp.take(seeds, rest, axis=0), xp.take(vertices, rest, axis=0), xp.take(count, rest))
        moments, facet = _compat.put_rows(xp, moments, rest, m_rest), _compat.put_rows(xp, facet, rest, f_rest)
    return moments, facet


def _pixel_of_cells(xp, seeds, vertices, count, lo, hi, shape):
    """The flat index ``i n_y + j`` of the pixel ``(i, j)`` that holds each cell (its
    vertices in ``[i, i + 1) x [j, j + 1)`` in pixel units), -1 for a cell that crosses a
    grid line, reaches outside the grid, or has no vertex."""
    cap = vertices.shape[1]
    valid = xp.arange(cap, dtype=xp.int64, device=aac.device(count))[None, :] < count[:, None]
    at, inside = [], count > 0
    for axis in range(2):
        g = (seeds[:, axis:axis + 1] + vertices[..., axis] - lo[axis]) * (shape[axis] / (hi[axis] - lo[axis]))
        low = xp.floor(_compat.row_min(xp, xp.where(valid, g, xp.inf)))
        high = _compat.row_max(xp, xp.where(valid, g, -xp.inf))
        inside = inside & (low >= 0) & (high < low + 1.0) & (low < shape[axis])
        at.append(xp.astype(xp.where(inside, low, 0.0), xp.int64))
    return xp.where(inside, at[0] * shape[1] + at[1], -1)


def far_origins(xp, vertices, count):
    """Per cell, its first vertex (relative to the seed) if farther than :data:`FAR`, else 0;
    ``None`` eagerly when no cell is that far (the common case: nothing changes)."""
    first = vertices[:, 0, :]
    far = (count > 0) & (xp.max(xp.abs(first), axis=1) > FAR)
    if _compat.known_none(xp, far):
        return None
    return xp.where(far[:, None], first, 0.0)


@_compat.jit_on_jax()
def edge_walk(xp, seeds, vertices, count, density, tables, lo, hi):
    """:func:`cell_integrals` of the cells ``(vertices, count)`` of ``seeds`` (``tables``:
    the flattened :func:`prefix_tables` of ``density``), with the second moment by axis:
    ``(mass, M_x, M_y, M_xx, M_yy)`` (n, 5) and the edge integrals (n, V)."""
    edges = Edges(xp, seeds, vertices, count, lo, hi, density.shape)
    moments, facet = None, None
    for e in edges.groups(xp):
        m, f = edge_integrals(xp, seeds, e, density, tables, lo, hi)
        moments, facet = (m, f) if moments is None else (moments + m, facet + f)
    return moments, facet


def edge_integrals(xp, seeds, e, density, tables, lo, hi):
    """:func:`edge_walk` of the edges ``e``."""
    grid = PieceGrid(xp, seeds, e, density.shape, lo, hi)
    flat_density = xp.reshape(density, (-1,))

    def visit(piece, acc):
        moments, facet = acc
        f_0, f_1, f_2, c = grid.antiderivatives(xp, piece, tables, flat_density)
        p, q = piece.p, piece.q
        half_dv = xp.where(piece.live, 0.5 * (q[:, 1] - p[:, 1]), 0.0)
        for tau in GAUSS:
            u = p[:, 0] + tau * (q[:, 0] - p[:, 0])
            v = p[:, 1] + tau * (q[:, 1] - p[:, 1])
            f0, f1, f2 = f_0(u) * half_dv, f_1(u) * half_dv, f_2(u) * half_dv
            moments = (moments[0] + f0, moments[1] + f1, moments[2] + v * f0, moments[3] + f2, moments[4] + v * v * f0)
        dp = q - p
        facet = facet + c * xp.sqrt(dp[:, 0] * dp[:, 0] + dp[:, 1] * dp[:, 1])
        return moments, facet

    zero = xp.zeros(e.slot.shape, dtype=seeds.dtype, device=aac.device(seeds))
    acc, facet = visit_pieces(xp, e, grid.shape, visit, ((zero,) * 5, zero))
    return xp.stack([e.per_cell(xp, a) for a in acc], axis=1), e.per_slot(xp, facet)


@_compat.jit_on_jax()
def uniform_integrals(xp, seeds, vertices, count, density, lo, hi):
    """:func:`cell_integrals` for a constant density (a single pixel): the closed forms of
    :func:`_polygon_integrals` on the cells clamped to the box."""
    low, high = lo - seeds, hi - seeds      # the box, per coordinate: (n, 1) bounds clamp fast
    ax, ay = (clamp(xp, vertices[..., i], low[:, i:i + 1], high[:, i:i + 1]) for i in range(2))
    return _polygon_integrals(xp, ax, ay, count, xp.reshape(density, (1,)))


def _polygon_integrals(xp, ax, ay, count, c):
    """Moments ``(mass, M_x, M_y, M_2)`` (n, 4) and edge integrals (n, V) of the polygons of
    vertices ``(ax, ay)`` (n, V) (relative to the seeds, ``count`` per row) for a density
    constant on each (``c``: (n,) or (1,)), in closed form: with the edges ``(a, b)`` and
    ``w = a_x b_y - a_y b_x``, ``mass = c/2 sum w``, ``M_x = c/6 sum w (a_x + b_x)``,
    ``M_2 = c/12 sum w (|a|^2 + a . b + |b|^2)``; the edge integrals are ``c |b - a|``."""
    k = xp.arange(ax.shape[1], dtype=xp.int64, device=aac.device(count))[None, :]
    valid = k < count[:, None]
    nxt = (k + 1) % xp.maximum(count, 1)[:, None]
    bx, by = gather(ax, nxt), gather(ay, nxt)
    w = xp.where(valid, ax * by - ay * bx, 0.0)
    total = lambda a: _compat.row_sum(xp, a)
    moments = [total(w) / 2.0, total(w * (ax + bx)) / 6.0, total(w * (ay + by)) / 6.0,
               total(w * (ax * (ax + bx) + bx * bx + ay * (ay + by) + by * by)) / 12.0]
    dx, dy = bx - ax, by - ay
    c = c[:, None]
    return c * xp.stack(moments, axis=1), c * xp.where(valid, xp.sqrt(dx * dx + dy * dy), 0.0)
