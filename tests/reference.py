"""Independent ground truth for the solver's tests: nothing here calls sdot.

- :func:`laguerre_cells`: every Laguerre cell of seeds and weights in a box, as a
  polygon, from ``scipy.spatial.HalfspaceIntersection``;
- :func:`pixel_integrals`: the mass and second moment (about a point) of a
  piecewise-constant image on a polygon, by clipping the polygon to every pixel
  (Sutherland-Hodgman) and the closed-form moments of polygons;
- :func:`certify`: from the weights a solver returned, the cell masses and W2^2 computed
  with the two above. A power diagram whose cells hold the target masses is an optimal
  transport (the cells are given by a c-concave potential), so masses equal to the
  targets certify the solver's W2^2 without knowing the optimum.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.spatial import ConvexHull, HalfspaceIntersection


def laguerre_cell(seeds, weights, i, lo, hi):
    """Counter-clockwise vertices (k, 2) of cell i in the box ``[lo, hi]``, or None if empty."""
    y, w = np.asarray(seeds, float), np.asarray(weights, float)
    (x0, y0), (x1, y1) = lo, hi
    rows = [[0.0, -1.0, y0], [1.0, 0.0, -x1], [0.0, 1.0, -y1], [-1.0, 0.0, x0]]
    for j in range(len(y)):
        d = y[j] - y[i]
        if j == i or not d.any():
            continue
        rows.append([2 * d[0], 2 * d[1], -(y[j] @ y[j] - y[i] @ y[i] - w[j] + w[i])])
    h = np.array(rows)
    scale = np.linalg.norm(h[:, :2], axis=1)
    h = h / scale[:, None]
    lp = linprog([0.0, 0.0, -1.0], A_ub=np.column_stack([h[:, :2], np.ones(len(h))]), b_ub=-h[:, 2],
                 bounds=[(None, None), (None, None), (0.0, None)], method="highs")
    if lp.status != 0 or lp.x[2] < 1e-12 * max(x1 - x0, y1 - y0):
        return None
    hull = ConvexHull(HalfspaceIntersection(h, lp.x[:2]).intersections)
    return hull.points[hull.vertices]


def laguerre_cells(seeds, weights, lo, hi):
    return [laguerre_cell(seeds, weights, i, lo, hi) for i in range(len(seeds))]


def _clip(poly, axis, value, keep_below):
    """The part of the polygon on one side of the line ``x[axis] = value``."""
    out = []
    n = len(poly)
    for k in range(n):
        p, q = poly[k], poly[(k + 1) % n]
        inside_p = p[axis] <= value if keep_below else p[axis] >= value
        inside_q = q[axis] <= value if keep_below else q[axis] >= value
        if inside_p:
            out.append(p)
        if inside_p != inside_q:
            t = (value - p[axis]) / (q[axis] - p[axis])
            out.append(p + t * (q - p))
    return np.array(out) if out else np.zeros((0, 2))


def polygon_moments(v, y):
    """Area and second moment ``int |x - y|^2`` of the polygon ``v`` (counter-clockwise)."""
    if len(v) < 3:
        return 0.0, 0.0
    a = v - y
    b = np.roll(a, -1, axis=0)
    cross = a[:, 0] * b[:, 1] - b[:, 0] * a[:, 1]
    area = cross.sum() / 2
    second = (cross * (a[:, 0] ** 2 + a[:, 0] * b[:, 0] + b[:, 0] ** 2
                       + a[:, 1] ** 2 + a[:, 1] * b[:, 1] + b[:, 1] ** 2)).sum() / 12
    return area, second


def pixel_integrals(poly, y, img, lo, hi):
    """Mass and second moment about ``y`` of the density ``img`` (values per unit area,
    ``img[i, j]`` the pixel i along x, j along y of the box) on the polygon ``poly``."""
    if poly is None:
        return 0.0, 0.0
    nx, ny = img.shape
    ex, ey = np.linspace(lo[0], hi[0], nx + 1), np.linspace(lo[1], hi[1], ny + 1)
    vmin, vmax = poly.min(axis=0), poly.max(axis=0)
    mass = second = 0.0
    for a in np.flatnonzero((ex[1:] > vmin[0]) & (ex[:-1] < vmax[0])):
        column = _clip(_clip(poly, 0, ex[a], False), 0, ex[a + 1], True)
        if len(column) < 3:
            continue
        for b in np.flatnonzero((ey[1:] > vmin[1]) & (ey[:-1] < vmax[1])):
            if img[a, b] == 0:
                continue
            piece = _clip(_clip(column, 1, ey[b], False), 1, ey[b + 1], True)
            area, sec = polygon_moments(piece, y)
            mass += img[a, b] * area
            second += img[a, b] * sec
    return mass, second


def certify(seeds, weights, img, lo=(0.0, 0.0), hi=(1.0, 1.0)):
    """Cell masses (n,) and W2^2 of the power diagram ``(seeds, weights)`` against ``img``
    normalised to mass 1 on the box, computed without sdot."""
    img = np.asarray(img, float)
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    rho = img / (img.sum() * np.prod((hi - lo) / np.array(img.shape)))
    masses, cost = np.zeros(len(seeds)), 0.0
    for i, poly in enumerate(laguerre_cells(seeds, weights, lo, hi)):
        masses[i], second = pixel_integrals(poly, np.asarray(seeds[i], float), rho, lo, hi)
        cost += second
    return masses, cost


def exact_laguerre_moments(seeds, weights, lo=(0.0, 0.0), hi=(1.0, 1.0)):
    """Cell masses (n,) and W2^2 of the power diagram ``(seeds, weights)`` against the
    uniform density of mass 1 on the box, in exact rational arithmetic (:func:`exact_laguerre_cell`).
    Slow (for tens of seeds), but free of rounding: the ground truth where seeds lie far
    apart (one at 1e6), which :func:`laguerre_cells` cannot resolve."""
    from fractions import Fraction as F

    (x0, y0), (x1, y1) = [[F(float(t)) for t in p] for p in (lo, hi)]
    box_area = (x1 - x0) * (y1 - y0)
    masses, cost = [], F(0)
    for i in range(len(seeds)):
        poly = exact_laguerre_cell(seeds, weights, i, lo, hi)
        yi = (F(float(seeds[i][0])), F(float(seeds[i][1])))
        area = second = F(0)
        for (px, py), (qx, qy) in zip(poly, poly[1:] + poly[:1]):
            ax, ay, bx, by = px - yi[0], py - yi[1], qx - yi[0], qy - yi[1]
            cross = ax * by - ay * bx
            area += cross / 2
            second += cross * (ax * ax + ax * bx + bx * bx + ay * ay + ay * by + by * by) / 12
        masses.append(float(area / box_area))
        cost += second / box_area
    return np.array(masses), float(cost)


def exact_laguerre_cell(seeds, weights, i, lo=(0.0, 0.0), hi=(1.0, 1.0)):
    """Cell i of the power diagram ``(seeds, weights)`` in the box, exactly: the box clipped
    by every other seed's half-plane, in rationals from the floats as given; its vertices
    (a list of pairs of ``Fraction``, counter-clockwise; empty if the cell is)."""
    from fractions import Fraction as F

    y = [(F(float(a)), F(float(b))) for a, b in seeds]
    w = [F(float(t)) for t in weights]
    (x0, y0), (x1, y1) = [[F(float(t)) for t in p] for p in (lo, hi)]
    poly = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    for j, (yj, wj) in enumerate(zip(y, w)):
        if j == i or yj == y[i]:
            continue
        # power_i(x) <= power_j(x):  2 x . (y_j - y_i) <= |y_j|^2 - |y_i|^2 - w_j + w_i
        a, b = 2 * (yj[0] - y[i][0]), 2 * (yj[1] - y[i][1])
        c = yj[0] ** 2 + yj[1] ** 2 - y[i][0] ** 2 - y[i][1] ** 2 - wj + w[i]
        poly = _clip_exact(poly, a, b, c)
        if not poly:
            break
    return poly


def _clip_exact(poly, a, b, c):
    """The part of the polygon where ``a x + b y <= c`` (exact rationals)."""
    out = []
    for k, p in enumerate(poly):
        q = poly[(k + 1) % len(poly)]
        sp, sq = a * p[0] + b * p[1] - c, a * q[0] + b * q[1] - c
        if sp <= 0:
            out.append(p)
        if (sp < 0 < sq) or (sq < 0 < sp):
            t = sp / (sp - sq)
            out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out if len(out) >= 3 else []


def bernstein_density(points, coefficients, lo=(0.0, 0.0), hi=(1.0, 1.0)):
    """The density of Bernstein ``coefficients`` (n0, n1, (p+1)^2) on the box at ``points``
    (m, 2), straight from the definition (docs/densities.md): on cell (i, j) of local coordinates
    ``t``, ``sum_k c[i, j, k0 (p+1) + k1] B(k0, p, t0) B(k1, p, t1)``."""
    from math import comb

    c = np.asarray(coefficients, float)
    n0, n1, nn = c.shape
    p = int(round(np.sqrt(nn))) - 1
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    g = (np.asarray(points, float) - lo) / (hi - lo) * np.array([n0, n1])
    cell = np.minimum(np.maximum(np.floor(g), 0), np.array([n0 - 1, n1 - 1])).astype(int)
    t = g - cell
    basis = [np.stack([comb(p, k) * t[:, a] ** k * (1 - t[:, a]) ** (p - k) for k in range(p + 1)], axis=1)
             for a in range(2)]
    coef = c[cell[:, 0], cell[:, 1]].reshape(-1, p + 1, p + 1)
    return np.einsum("mk,ml,mkl->m", basis[0], basis[1], coef)


def _triangle_rule(order):
    """Nodes (barycentric pairs) and weights of a collapsed (Duffy) tensor Gauss rule on the
    reference triangle (area 1/2), exact for polynomials of degree ``2 order - 2``."""
    x, w = np.polynomial.legendre.leggauss(order)
    x, w = 0.5 * (x + 1.0), 0.5 * w
    s, t = np.meshgrid(x, x, indexing="ij")
    ws = np.outer(w, w) * (1.0 - s)
    return np.stack([s.ravel(), (t * (1.0 - s)).ravel()], axis=1), ws.ravel()


def bernstein_cell_moments(poly, y, coefficients, lo=(0.0, 0.0), hi=(1.0, 1.0), order=8):
    """Mass, first moments about ``y`` and second moment about ``y`` (4,) of the Bernstein
    density on the polygon ``poly`` (counter-clockwise): the polygon clipped to every grid
    cell (Sutherland-Hodgman), each piece cut into a fan of triangles, each integrated by a
    collapsed Gauss rule (exact: the integrand is a polynomial of degree <= 2p + 2 there)."""
    out = np.zeros(4)
    if poly is None:
        return out
    c = np.asarray(coefficients, float)
    n0, n1, _ = c.shape
    ex, ey = np.linspace(lo[0], hi[0], n0 + 1), np.linspace(lo[1], hi[1], n1 + 1)
    nodes, weights = _triangle_rule(order)
    y = np.asarray(y, float)
    for a in range(n0):
        column = _clip(_clip(poly, 0, ex[a], False), 0, ex[a + 1], True)
        if len(column) < 3:
            continue
        for b in range(n1):
            piece = _clip(_clip(column, 1, ey[b], False), 1, ey[b + 1], True)
            for k in range(1, len(piece) - 1):
                p0, p1, p2 = piece[0], piece[k], piece[k + 1]
                jac = (p1[0] - p0[0]) * (p2[1] - p0[1]) - (p1[1] - p0[1]) * (p2[0] - p0[0])
                pts = p0 + nodes[:, :1] * (p1 - p0) + nodes[:, 1:] * (p2 - p0)
                rho = bernstein_density(np.clip(pts, [ex[a], ey[b]], [ex[a + 1], ey[b + 1]]), c, lo, hi)
                u = pts - y
                wr = weights * rho * jac
                out += [wr.sum(), (wr * u[:, 0]).sum(), (wr * u[:, 1]).sum(), (wr * (u * u).sum(1)).sum()]
    return out


def bernstein_segment_integral(a, b, coefficients, lo=(0.0, 0.0), hi=(1.0, 1.0), order=8):
    """``int rho ds`` along the segment ``[a, b]`` of the Bernstein density: the segment cut
    at every grid line, Gauss-Legendre on each part."""
    c = np.asarray(coefficients, float)
    n0, n1, _ = c.shape
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = b - a
    cuts = [0.0, 1.0]
    for axis, count in ((0, n0), (1, n1)):
        if d[axis] != 0:
            lines = np.linspace(lo[axis], hi[axis], count + 1)
            t = (lines - a[axis]) / d[axis]
            cuts += list(t[(t > 0) & (t < 1)])
    cuts = np.sort(cuts)
    x, w = np.polynomial.legendre.leggauss(order)
    total = 0.0
    for t0, t1 in zip(cuts[:-1], cuts[1:]):
        t = t0 + (t1 - t0) * 0.5 * (x + 1.0)
        pts = a + t[:, None] * d
        mid = a + 0.5 * (t0 + t1) * d
        cell_lo = np.floor((mid - lo) / (np.asarray(hi) - lo) * [n0, n1]) / [n0, n1] * (np.asarray(hi) - lo) + lo
        cell_hi = cell_lo + (np.asarray(hi) - lo) / [n0, n1]
        rho = bernstein_density(np.clip(pts, cell_lo, cell_hi), c, lo, hi)
        total += 0.5 * (t1 - t0) * (w * rho).sum() * np.linalg.norm(d)
    return total


def clip_to_disc(poly, centre, radius, sides):
    """The part of the polygon inside the regular polygon of ``sides`` sides inscribed in the
    circle ``(centre, radius)`` (an approximation of the disc whose area error is
    ``O(sides^-2)``: Richardson extrapolation of two of them is ``O(sides^-4)``)."""
    if poly is None:
        return None
    out = [np.asarray(p, float) for p in poly]
    apothem = radius * np.cos(np.pi / sides)
    for k in range(sides):
        angle = 2 * np.pi * (k + 0.5) / sides
        normal = np.array([np.cos(angle), np.sin(angle)])
        kept = []
        for j, p in enumerate(out):
            q = out[(j + 1) % len(out)]
            sp, sq = (p - centre) @ normal - apothem, (q - centre) @ normal - apothem
            if sp <= 0:
                kept.append(p)
            if (sp < 0 < sq) or (sq < 0 < sp):
                kept.append(p + sp / (sp - sq) * (q - p))
        out = kept
        if len(out) < 3:
            return None
    return np.array(out)
