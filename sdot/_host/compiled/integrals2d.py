"""Exact integrals of a pixel density over 2D cells (numba, rows on the host's threads).

Each cell (the layout of :class:`..planar.polygons.Cells`) is cut by the grid lines that cross
it, column by column along x, then row by row along y (:func:`.polygon.clip`): every piece lies
in one pixel, where the density is a constant, and is integrated in closed form
(:func:`.polygon.integrate`). A piece's edges keep the slot of the cell's edge they lie on (the
grid lines' are -1), so the density's integral along each edge is summed piece by piece; an
edge on a grid line goes with the pixel below or left of it.

The result is that of :func:`..planar.integrate.cell_integrals`: per cell the mass, the first
moments and the second moment about the seed ``(n, 4)``, per vertex slot the density
integrated along the edge that starts there ``(n, V)``. The same walk integrates the cells cut
by balls (partial transport: each piece cut by the ball in closed form, :mod:`.capped2d`),
the result of :func:`..planar.capped.capped_integrals`.
"""
from __future__ import annotations

import numpy as np

from . import polygon as pg
from ._numba import njit
from .capped2d import integrate_capped

#: Vertex slots of a piece while it is cut.
SCRATCH = 512


@njit
def integrals_rows(first, last, seeds, vertices, count, values, lo, hi, psi, moments, facet, arc, px, py, plab, s):
    """The integrals of the cells ``first .. last - 1`` written into the rows of ``moments``,
    ``facet`` and ``arc``: of the cells themselves if ``psi`` is empty, else of the cells cut by
    the balls ``|u|^2 <= psi_i`` (:func:`.capped2d.integrate_capped`; only the pixels that meet
    the ball are visited). ``px``, ``py``, ``plab`` (4, SCRATCH): the rest of the cell along
    x, a column's piece, the rest of the column along y, a pixel's piece; ``s``: scratch."""
    n0, n1 = values.shape
    h0 = (hi[0] - lo[0]) / n0
    h1 = (hi[1] - lo[1]) / n1
    capped = psi.shape[0] > 0
    for i in range(first, last):
        for k in range(4):
            moments[i, k] = 0.0
        for k in range(facet.shape[1]):
            facet[i, k] = 0.0
        arc[i] = 0.0
        m = count[i]
        if m == 0 or (capped and psi[i] <= 0.0):
            continue
        radius = np.sqrt(psi[i]) if capped else np.inf
        low0, high0, low1, high1, r2 = load_cell(vertices[i], m, px[0], py[0], plab[0])
        y0, y1 = seeds[i, 0], seeds[i, 1]
        a0, b0 = _range(y0 + max(low0, -radius), y0 + min(high0, radius), lo[0], h0, n0)
        a1, b1 = _range(y1 + max(low1, -radius), y1 + min(high1, radius), lo[1], h1, n1)
        reach = np.sqrt(r2)
        m0 = m
        for j0 in range(a0, b0 + 1):
            k1, m1, m0 = _cut(px, py, plab, 0, m0, 1.0, 0.0, lo[0] + (j0 + 1) * h0 - y0, j0 == b0, 1, s, reach)
            for j1 in range(a1, b1 + 1):
                if m1 <= 0:
                    break
                k2, m2, m1 = _cut(px, py, plab, k1, m1, 0.0, 1.0, lo[1] + (j1 + 1) * h1 - y1, j1 == b1, 2, s, reach)
                value = values[j0, j1]
                if m2 > 0 and value != 0.0:
                    if capped:
                        arc[i] += integrate_capped(px[k2], py[k2], plab[k2], m2, value, radius, moments[i], facet[i])
                    else:
                        pg.integrate(px[k2], py[k2], plab[k2], m2, value, moments[i], facet[i])
            if m0 <= 0:
                break


@njit
def load_cell(vertices, m, px, py, plab):
    """Copy the ``m`` vertices of a cell into the scratch polygon (each edge labelled by its
    slot); returns its bounds ``(low0, high0, low1, high1)`` and its largest squared radius."""
    low0 = low1 = np.inf
    high0 = high1 = -np.inf
    r2 = 0.0
    for k in range(m):
        x, y = vertices[k, 0], vertices[k, 1]
        px[k], py[k], plab[k] = x, y, k
        low0, high0 = min(low0, x), max(high0, x)
        low1, high1 = min(low1, y), max(high1, y)
        r2 = max(r2, x * x + y * y)
    return low0, high0, low1, high1, r2


@njit
def _range(low, high, start, step, n):
    """The first and last grid cell (of ``n`` from ``start``, ``step`` wide) that ``[low, high]`` meets."""
    a = int(np.floor((low - start) / step))
    b = int(np.floor((high - start) / step))
    return min(max(a, 0), n - 1), min(max(b, 0), n - 1)


@njit
def _cut(px, py, plab, src, m, n0, n1, plane, last, dst, s, radius):
    """The part of polygon ``src`` with ``u . n <= plane`` (``n`` an axis): ``(k, size,
    rest_size)``, the piece in polygon ``k`` (``src`` itself for the ``last`` slab) and what is
    left of ``src`` beyond (into slot 3 and back). Sizes 0: empty."""
    if last:
        return src, m, 0
    margin = 64.0 * 2.0 ** -52 * (abs(plane) + radius)
    pm, status = pg.clip(px[src], py[src], plab[src], m, n0, n1, plane, -1, margin, px[dst], py[dst], plab[dst], s)
    if status == pg.UNCHANGED:
        _copy(px, py, plab, src, dst, m)
    elif status != pg.CHANGED:
        pm = 0
    rm, status = pg.clip(px[src], py[src], plab[src], m, -n0, -n1, -plane, -1, -margin, px[3], py[3], plab[3], s)
    if status == pg.CHANGED:
        _copy(px, py, plab, 3, src, rm)
    elif status != pg.UNCHANGED:
        rm = 0
    return dst, pm, rm


@njit
def _copy(px, py, plab, a, b, m):
    for k in range(m):
        px[b, k], py[b, k], plab[b, k] = px[a, k], py[a, k], plab[a, k]


def cell_integrals(seeds, vertices, labels, count, values, lo, hi):
    """``(moments (n, 4), facet (n, V))`` of the pixel density ``values`` on the box ``[lo, hi]``
    over the cells ``vertices``, ``labels``, ``count`` (NumPy): see the module docstring."""
    moments, facet, _ = _integrals(seeds, vertices, labels, count, values, lo, hi, np.zeros(0))
    return moments, facet


def capped_integrals(seeds, vertices, labels, count, values, lo, hi, psi):
    """``(moments (n, 4), facet (n, V), arc (n,))`` over the cells cut by the balls ``|u|^2 <=
    psi`` (partial transport, :mod:`.capped2d`): the result of
    :func:`..planar.capped.capped_integrals`."""
    return _integrals(seeds, vertices, labels, count, values, lo, hi, psi)


def _integrals(seeds, vertices, labels, count, values, lo, hi, psi):
    """:func:`integrals_rows` of every cell on the host's threads."""
    from . import run_rows

    n, v_cap = labels.shape
    moments, facet, arc = np.empty((n, 4)), np.empty((n, v_cap)), np.empty(n)
    c = np.ascontiguousarray
    args = (c(seeds, dtype=np.float64), c(vertices, dtype=np.float64), c(count, dtype=np.int64),
            c(values, dtype=np.float64), c(lo, dtype=np.float64), c(hi, dtype=np.float64), c(psi, dtype=np.float64),
            moments, facet, arc)
    run_rows(lambda first, last: integrals_rows(first, last, *args, np.empty((4, SCRATCH)), np.empty((4, SCRATCH)),
                                                np.empty((4, SCRATCH), np.int64), np.empty(SCRATCH)), n)
    return moments, facet, arc
