"""Whether a new site would own a point of a power diagram: a descent over the cells (numba,
sites on the host's threads), the exact test of :mod:`sdot._host.periodic_reach` where weights
vary too much for its balls.

A site ``z`` of weight ``psi_z`` added to a diagram owns the points where ``g(x) = |x - z|^2 -
psi_z - f(x) < 0``, ``f`` the diagram's power (its owner's). On the cell of site ``c``,
``g = |e|^2 - 2 u.e - psi_z + psi_c`` at ``x = y_c + u`` (``e = z - y_c``): affine. So ``g`` is
convex and piecewise affine on the cells; its least value over the box is at a vertex. From a
cell near ``z``, the descent takes the lowest vertex of the cell, looks at every cell having
that vertex (the cells sharing a vertex of one cell are found through its neighbours, by the
vertex's position within rounding: more cells than that only add checks) and moves to one with a
lower vertex; where none has, the vertex is a local least value over a neighbourhood, hence the
least value (convexity): ``z`` owns a point iff it is negative. Each step lowers ``g``, so the
descent ends; after :data:`STEPS` steps the site is taken as owning (a safe answer).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit

#: Most cells visited by one descent (beyond, the site is taken as owning a point).
STEPS = 256
#: Most cells sharing one vertex that a descent examines (beyond, taken as owning).
FAN = 64


@njit
def _lowest(i, z, psi_z, sites, psi, vertices, size, corners, spatial):
    """``(k, g)``: the vertex slot of cell ``i`` where ``g`` is least, and that value."""
    best, k_best = np.inf, -1
    d = sites.shape[1]
    base = -psi_z + psi[i]
    e2 = 0.0
    for a in range(d):
        e2 += (z[a] - sites[i, a]) ** 2
    for k in range(size[i]):
        if spatial and corners[i, k, 0] < 0:
            continue
        ue = 0.0
        for a in range(d):
            ue += vertices[i, k, a] * (z[a] - sites[i, a])
        g = e2 - 2.0 * ue + base
        if g < best:
            best, k_best = g, k
    return k_best, best


@njit
def _has_vertex(i, x, tol, sites, vertices, size, corners, spatial):
    """Whether cell ``i`` has a vertex within ``tol`` of the point ``x`` (each coordinate)."""
    d = sites.shape[1]
    for k in range(size[i]):
        if spatial and corners[i, k, 0] < 0:
            continue
        near = True
        for a in range(d):
            if abs(sites[i, a] + vertices[i, k, a] - x[a]) > tol:
                near = False
                break
        if near:
            return True
    return False


@njit
def _descend(first, last, images, psi_images, starts, sites, psi, vertices, size, corners, labels, count, tol,
             spatial, out, ends, least, x, fan):
    d = sites.shape[1]
    for p in range(first, last):
        z = images[p]
        c = starts[p]
        owns = True                                 # unless the descent proves otherwise
        low = -np.inf
        for step in range(STEPS):
            k, g = _lowest(c, z, psi_images[p], sites, psi, vertices, size, corners, spatial)
            if k < 0 or g < 0.0:
                break
            for a in range(d):
                x[a] = sites[c, a] + vertices[c, k, a]
            fan[0] = c
            members, seen, best, best_cell, full = 1, 0, g, -1, False
            while seen < members:
                b = fan[seen]
                seen += 1
                for f in range(count[b]):
                    l = labels[b, f]
                    if l < 0 or size[l] == 0:
                        continue
                    known = False
                    for m in range(members):
                        if fan[m] == l:
                            known = True
                            break
                    if known or not _has_vertex(l, x, tol, sites, vertices, size, corners, spatial):
                        continue
                    if members == FAN:
                        full = True
                        break
                    fan[members] = l
                    members += 1
                    k_l, g_l = _lowest(l, z, psi_images[p], sites, psi, vertices, size, corners, spatial)
                    if g_l < best:
                        best, best_cell = g_l, l
                if full:
                    break
            if full:
                break
            if best_cell < 0:                       # the least value of g, not negative
                owns, low = False, g
                break
            c = best_cell
        out[p] = owns
        ends[p] = c
        least[p] = low


def owners(images, psi_images, starts, sites, psi, vertices, count, labels, size=None, corners=None, ends=None,
           least=None):
    """Whether each site of ``images`` (m, d), weights ``psi_images``, would own a point of the
    diagram of ``sites`` (their weights ``psi``; 2D cells ``vertices`` (relative to the sites),
    ``count``, ``labels``, or 3D ones with ``size`` and ``corners`` too), each descent starting
    from the (nonempty) cell ``starts[p]``, (m,) booleans. ``ends`` (m,) int64, if given: set to
    the cell where each descent stopped (where ``g`` is least, if the site owns no point), a start
    for the next test at nearby weights. ``least`` (m,) float64, if given: set to the least value
    of ``g`` over the box where the site owns no point (-inf where it may own one): at weights
    that lower it by less, the site still owns none."""
    from . import run_rows

    spatial = size is not None
    images = np.ascontiguousarray(images, dtype=np.float64)
    psi_images = np.ascontiguousarray(psi_images, dtype=np.float64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    sites = np.ascontiguousarray(sites, dtype=np.float64)
    psi = np.ascontiguousarray(psi, dtype=np.float64)
    vertices = np.ascontiguousarray(vertices, dtype=np.float64)
    count = np.ascontiguousarray(count, dtype=np.int64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    if spatial:
        size, corners = np.ascontiguousarray(size, dtype=np.int64), np.ascontiguousarray(corners, dtype=np.int64)
    else:
        size, corners = count, np.zeros((1, 1, 1), np.int64)
    span = float(np.max(np.abs(sites))) + float(np.max(np.abs(vertices))) if sites.shape[0] else 1.0
    tol = 1e-9 * max(span, 1e-300)
    out = np.empty(images.shape[0], np.bool_)
    ends = np.empty(images.shape[0], np.int64) if ends is None else ends
    least = np.empty(images.shape[0], np.float64) if least is None else least
    run_rows(lambda first, last: _descend(first, last, images, psi_images, starts, sites, psi, vertices, size, corners,
                                          labels, count, tol, spatial, out, ends, least, np.empty(sites.shape[1]),
                                          np.empty(FAN, np.int64)), images.shape[0])
    return out
