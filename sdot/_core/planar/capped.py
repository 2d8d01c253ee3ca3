"""Exact integrals of a pixel density over capped cells: a Laguerre cell cut by the ball
``|x - y_i|^2 <= psi_i`` of its seed (partial transport).

The integrals are contour integrals ``oint F dv`` as in :mod:`.integrate`. The boundary of
``L_i & B_i`` is made of the parts of the cell's edges inside the ball and of arcs of the
circle of radius ``R = sqrt(psi_i)``. In the fan of the cell from its seed (a signed sum of
triangles ``(y_i, a, b)``, exact for any polygon and any apex) the triangle of an edge
``(a, b)`` cut by the ball is bounded by the part ``[s_1, s_2]`` of the edge inside the ball
(its two crossings with the circle, clipped to ``[0, 1]``) and by two arcs: from the
direction of ``a`` to that of ``a + s_1 (b - a)``, and from ``a + s_2 (b - a)`` to ``b``
(signed angles in ``(-pi, pi)``; the arcs of triangles seen from outside the cell cancel).

The edge parts are walked through the pixels by :mod:`.integrate`. Each arc is cut where it
crosses a grid line or an axis direction, so that each piece lies in one pixel, where ``F`` is a
polynomial of degree <= 3 in ``u = R cos t``: along the piece ``F dv = F(R cos t) R cos t dt``
times ``1``, ``v`` or ``v^2`` has closed-form antiderivatives (powers of ``cos t`` and ``sin t``).
The transpose (:func:`capped_polynomial_integrals`, for the gradient with respect to the pixel
values) integrates the arcs by Gauss-Legendre in the angle, :data:`ARC_NODES` nodes on at most a
quarter turn: the integrand is a trigonometric polynomial of degree <= 4, and the error of n
nodes on a half-length h is about ``(2 h)^(2n) / (2n)!`` (1e-19).
"""
from __future__ import annotations

import math
import types

import array_api_compat as aac

from .. import _compat
from ..quadrature import gauss_legendre
from .contour import Edges, edge_integrals, PieceGrid, Piece, prefix_tables
from .sensitivity import _to_pixels, contour_parts, edge_polynomial_parts

#: Gauss-Legendre nodes per arc piece (a quarter turn at most).
ARC_NODES = 12
_TAU, _W = gauss_legendre(ARC_NODES)


def capped_integrals(xp, seeds, cells, psi, density, lo, hi):
    """Per cell ``(mass, M_x, M_y, M_2)`` of ``L_i & B_i`` about the seed (n, 4), per edge slot
    the density integrated along the part of the edge inside the ball (n, V), and per cell the
    density integrated along the arcs of its boundary (n,), for a pixel density ``density``
    (``(1, 1)``: uniform) on the box ``[lo, hi]``; ``B_i`` is ``|x - y_i|^2 <= psi_i`` (empty
    where ``psi_i <= 0``). Eager; on the host by the compiled kernel
    (:func:`sdot._host.compiled.integrals2d.capped_integrals`)."""
    def kernel(*host):
        from ..._host.compiled import integrals2d

        return integrals2d.capped_integrals(*host)
    found = _compat.compiled_call(xp, kernel, seeds, cells.vertices, cells.labels, cells.count, density, lo, hi, psi)
    if found is not None:
        return found
    return array_capped_integrals(xp, seeds, cells, psi, density, lo, hi)


def array_capped_integrals(xp, seeds, cells, psi, density, lo, hi):
    """:func:`capped_integrals` in array code (the route of every namespace; the oracle of the
    compiled kernel)."""
    tables = xp.reshape(prefix_tables(xp, density, lo, hi), (3, -1))
    inner, arcs = _boundary(xp, seeds, cells, psi, lo, hi, density.shape)
    moments, facet = None, None
    for e in inner.groups(xp):
        m, f = edge_integrals(xp, seeds, e, density, tables, lo, hi)
        moments, facet = (m, f) if moments is None else (moments + m, facet + f)
    n = seeds.shape[0]
    arc = xp.zeros((n,), dtype=seeds.dtype, device=aac.device(seeds))
    if arcs is not None:
        grid, piece, alpha, beta, sign, r = arcs
        f_0, f_1, f_2, c = grid.antiderivatives(xp, piece, tables, xp.reshape(density, (-1,)))
        sums = _arc_moments(xp, f_0(0.0), f_1(0.0), f_2(0.0), c, r, alpha, beta)
        moments = moments + xp.stack([_compat.segment_sum(xp, sign * t, grid.cell, n) for t in sums], axis=1)
        arc = _compat.segment_sum(xp, sign * c * r * (beta - alpha), grid.cell, n)
    return xp.concat([moments[:, :3], moments[:, 3:4] + moments[:, 4:]], axis=1), facet, arc


def capped_polynomial_integrals(xp, seeds, cells, psi, coefficients, lo, hi, shape):
    """Per pixel ``p``, ``sum_i int_{L_i & B_i & p} (a_i + b_i . u + c_i |u|^2) dx`` (``u = x -
    y_i``, ``coefficients`` (n, 4)), shape ``shape``: the transpose of the map from the pixel
    values to the moments of :func:`capped_integrals` (as
    :func:`.sensitivity.polynomial_integrals` for whole cells). Eager."""
    nx, ny = shape
    dev = aac.device(seeds)
    acc = ((xp.zeros((ny * (nx + 1),), dtype=seeds.dtype, device=dev),) * 3,
           xp.zeros((nx * ny,), dtype=seeds.dtype, device=dev))
    inner, arcs = _boundary(xp, seeds, cells, psi, lo, hi, shape)
    for e in inner.groups(xp):
        acc = edge_polynomial_parts(xp, seeds, e, coefficients, lo, hi, shape, acc)
    if arcs is not None:
        grid, piece = arcs[:2]
        nodes = _arc_nodes(xp, *arcs[2:])
        taken = tuple(xp.take(coefficients[:, m], grid.cell) for m in range(4))
        acc = contour_parts(xp, grid, piece, nodes, taken, shape, acc)
    g_tables, g_pixels = acc
    return _to_pixels(xp, xp.stack(g_tables, axis=-1), g_pixels, lo, hi, shape)


def _boundary(xp, seeds, cells, psi, lo, hi, shape):
    """The boundary of the capped cells: the parts of the edges inside the balls (an
    :class:`.contour.Edges`) and the pieces of the arcs, ``(grid, piece, alpha, beta, sign, r)``
    (None if there is none): per piece its :class:`.contour.PieceGrid` (``grid.cell``: its cell)
    and pixel, its angles (``alpha < beta``), the sign of its sweep and its radius."""
    edges = Edges(xp, seeds, cells.vertices, cells.count, lo, hi, shape)
    radius = xp.sqrt(xp.maximum(psi, 0.0))
    low, high = -edges.origin, (hi - lo) - edges.origin      # the box about each seed (origin: seed - lo)
    a = xp.minimum(xp.maximum(edges.a, low), high)
    b = xp.minimum(xp.maximum(edges.b, low), high)
    s1, s2 = _inside(xp, a, b, xp.take(radius, edges.cell))
    d = b - a
    p1, p2 = a + s1[:, None] * d, a + s2[:, None] * d
    return _clipped(xp, edges, p1, p2), _arcs(xp, seeds, edges, (a, p1), (p2, b), radius, lo, hi, shape)


def _inside(xp, a, b, radius):
    """``(s_1, s_2)``: the part ``a + s (b - a)``, ``s_1 <= s <= s_2``, of each edge inside the
    circle of ``radius`` about the origin (``s_1 = s_2 = 1`` where there is none)."""
    d = b - a
    A = xp.sum(d * d, axis=1)
    B = xp.sum(a * d, axis=1)
    C = xp.sum(a * a, axis=1) - radius * radius
    disc = B * B - A * C
    crosses = (disc > 0) & (A > 0)
    A = xp.where(crosses, A, 1.0)
    root = xp.sqrt(xp.where(crosses, disc, 0.0))
    s1 = xp.minimum(xp.maximum((-B - root) / A, 0.0), 1.0)
    s2 = xp.minimum(xp.maximum((-B + root) / A, s1), 1.0)
    return xp.where(crosses, s1, 1.0), xp.where(crosses, s2, 1.0)


def _clipped(xp, edges, p, q):
    """``edges`` with the endpoints ``p``, ``q`` (the parts inside the balls)."""
    sub = object.__new__(Edges)
    sub.n, sub.cap, sub.scale = edges.n, edges.cap, edges.scale
    sub.slot, sub.cell, sub.origin, sub.valid = edges.slot, edges.cell, edges.origin, edges.valid
    sub.a, sub.b = p, q
    sub._grid_coordinates(xp, edges.shape_)
    return sub


def _arcs(xp, seeds, edges, first, second, radius, lo, hi, shape):
    """The pieces of the arcs from the direction of ``first[0]`` to that of ``first[1]`` and of
    ``second`` (per edge): see :func:`_boundary`."""
    dev = aac.device(seeds)
    start = xp.concat([first[0], second[0]], axis=0)
    end = xp.concat([first[1], second[1]], axis=0)
    cell = xp.concat([edges.cell, edges.cell])
    valid = xp.concat([edges.valid, edges.valid])
    theta = xp.atan2(start[:, 1], start[:, 0])
    sweep = xp.atan2(start[:, 0] * end[:, 1] - start[:, 1] * end[:, 0], xp.sum(start * end, axis=1))
    r = xp.take(radius, cell)
    keep = xp.nonzero(valid & (sweep != 0.0) & (r > 0.0))[0]
    if keep.shape[0] == 0:
        return None
    cell, r = xp.take(cell, keep), xp.take(r, keep)
    theta, sweep = xp.take(theta, keep), xp.take(sweep, keep)
    owner, alpha, beta = _arc_pieces(xp, seeds, cell, r, xp.minimum(theta, theta + sweep),
                                     xp.maximum(theta, theta + sweep), shape, lo, hi)
    cell, r, sign = xp.take(cell, owner), xp.take(r, owner), xp.sign(xp.take(sweep, owner))
    mid = 0.5 * (alpha + beta)
    at = (xp.take(seeds, cell, axis=0) - lo + r[:, None] * xp.stack([xp.cos(mid), xp.sin(mid)], axis=1)) * edges.scale
    pix = xp.astype(xp.floor(xp.maximum(at, 0.0)), xp.int64)
    ix = xp.minimum(pix[:, 0], shape[0] - 1)
    iy = xp.minimum(pix[:, 1], shape[1] - 1)
    piece = Piece(None, None, ix, iy, xp.ones(ix.shape, dtype=xp.bool, device=dev))
    grid = PieceGrid(xp, seeds, types.SimpleNamespace(cell=cell), shape, lo, hi)
    grid.cell = cell
    return grid, piece, alpha, beta, sign, r


def _arc_nodes(xp, alpha, beta, sign, r):
    """The quadrature nodes ``(u, v, dv)`` of the arc pieces (see :func:`_boundary`)."""
    nodes = []
    for tau, w in zip(_TAU, _W):
        t = alpha + tau * (beta - alpha)
        u, v = r * xp.cos(t), r * xp.sin(t)
        nodes.append((u, v, w * (beta - alpha) * sign * u))            # dv = R cos t dt
    return nodes


def _arc_moments(xp, a0, a1, a2, c, r, alpha, beta):
    """``oint (F_0, F_1, v F_0, F_2, v^2 F_0) dv`` from ``alpha`` to ``beta`` on the circle of
    radius ``r`` in one pixel, where ``F_0 = a0 + c u``, ``F_1 = a1 + c u^2 / 2``, ``F_2 = a2 + c u^3
    / 3`` (:meth:`.contour.PieceGrid.antiderivatives` at ``u = 0`` give the ``a``), in closed form:
    with ``u = r cos t``, ``v = r sin t``, ``dv = r cos t dt``, antiderivatives of products of
    powers of ``cos t`` and ``sin t``."""
    sa, ca, sb, cb = xp.sin(alpha), xp.cos(alpha), xp.sin(beta), xp.cos(beta)

    def between(f):
        return f(beta, sb, cb) - f(alpha, sa, ca)

    def sin2(t, s, c):
        return 2.0 * s * c

    def sin4(t, s, c):
        return 4.0 * s * c * (c * c - s * s)

    s1 = sb - sa
    c2 = between(lambda t, s, c: 0.5 * t + 0.25 * sin2(t, s, c))
    c3 = between(lambda t, s, c: s - s * s * s / 3.0)
    c4 = between(lambda t, s, c: 0.375 * t + 0.25 * sin2(t, s, c) + sin4(t, s, c) / 32.0)
    sc = between(lambda t, s, c: 0.5 * s * s)
    c2s = between(lambda t, s, c: -c * c * c / 3.0)
    s2c = between(lambda t, s, c: s * s * s / 3.0)
    s2c2 = between(lambda t, s, c: t / 8.0 - sin4(t, s, c) / 32.0)
    r2 = r * r
    return (r * (a0 * s1 + c * r * c2), r * (a1 * s1 + c * r2 * c3 / 2.0), r2 * (a0 * sc + c * r * c2s),
            r * (a2 * s1 + c * r2 * r * c4 / 3.0), r2 * r * (a0 * s2c + c * r * s2c2))


def _arc_pieces(xp, seeds, cell, r, low, high, shape, lo, hi):
    """The pieces ``[alpha, beta]`` of the arcs ``[low, high]`` (angles about the seeds of
    ``cell``, radius ``r``) between their crossings with the grid lines and the axis
    directions, as ``(owner, alpha, beta)`` (owner: the arc of each piece)."""
    dev = aac.device(seeds)
    A = cell.shape[0]
    arc = xp.arange(A, dtype=xp.int64, device=dev)
    quarter = math.pi / 2
    owners, angles = [arc, arc], [low, high]
    first = xp.floor(low / quarter) + 1.0
    for j in range(2):
        owners.append(arc)
        angles.append((first + j) * quarter)
    for axis in range(2):
        step = (hi[axis] - lo[axis]) / shape[axis]
        centre = xp.take(seeds[:, axis], cell)
        k_lo = xp.maximum(xp.ceil((centre - r - lo[axis]) / step), 0.0)
        k_hi = xp.minimum(xp.floor((centre + r - lo[axis]) / step), float(shape[axis]))
        counts = xp.astype(xp.maximum(k_hi - k_lo + 1.0, 0.0), xp.int64)
        total = _compat.to_int(xp.sum(counts))
        if total == 0:
            continue
        owner = xp.repeat(arc, counts)
        rank = xp.arange(total, dtype=xp.int64, device=dev) - xp.take(xp.cumulative_sum(counts) - counts, owner)
        line = lo[axis] + step * (xp.take(k_lo, owner) + xp.astype(rank, low.dtype))
        ratio = xp.clip((line - xp.take(centre, owner)) / xp.take(r, owner), -1.0, 1.0)
        if axis == 0:
            both = (xp.acos(ratio), -xp.acos(ratio))
        else:
            both = (xp.asin(ratio), math.pi - xp.asin(ratio))
        for angle in both:
            owners.append(owner)
            angles.append(angle)
    owner, angle = xp.concat(owners), xp.concat(angles)
    base, top = xp.take(low, owner), xp.take(high, owner)
    turn = 2.0 * math.pi
    shifted = base + (angle - base) % turn
    ends = xp.concat([xp.ones((2 * A,), dtype=xp.bool, device=dev),
                      xp.zeros((owner.shape[0] - 2 * A,), dtype=xp.bool, device=dev)])
    inside = ends | ((shifted > base) & (shifted < top))
    angle = xp.where(ends, angle, shifted)
    kept = xp.nonzero(inside)[0]
    owner, angle = xp.take(owner, kept), xp.take(angle, kept)
    # by arc, then by angle: the key is the arc plus the angle's share of a turn (< 1/2)
    key = xp.astype(owner, angle.dtype) + (angle - xp.take(low, owner)) / turn
    order = xp.argsort(key)
    owner, angle = xp.take(owner, order), xp.take(angle, order)
    same = owner[1:] == owner[:-1]
    at = xp.nonzero(same)[0]
    return xp.take(owner, at), xp.take(angle, at), xp.take(angle, at + 1)
