"""A balanced k-d tree of the seeds, with a bound of the seeds' powers under each node (numba).

The tree is implicit: node ``k`` has children ``2k + 1`` and ``2k + 2``; the leaves are the
nodes of the last level, each at most ``leaf + 1`` seeds. ``perm[start[k]:end[k]]`` are the
seeds under node ``k``, ``lo[k]``, ``hi[k]`` their box. The positions fix the tree; each set of
weights gives per node (:func:`planes`) the plane ``g_k . y + c_k`` fitted to the weights of its
seeds (least squares) and ``e_k``, the largest excess of a weight over it. Since
``|x - y|^2 - g . y = |y - (x + g / 2)|^2 - g . x - |g|^2 / 4``, no seed ``j`` under ``k`` has a
power ``|x - y_j|^2 - psi_j`` at ``x`` below

    dist(x + g_k / 2, box_k)^2 - g_k . x - K_k,    K_k = |g_k|^2 / 4 + c_k + e_k,

the bound by which :mod:`.cells3d` skips whole subtrees. With ``g = 0`` it is ``dist(x, box_k)^2``
less the largest weight; the fitted plane keeps it tight where the weights vary on the
domain's scale (a Gaussian density: a cell then had three times as many nodes to visit).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def levels(m, leaf):
    """The depth of the tree of ``m`` seeds with leaves of at most ``leaf + 1`` seeds."""
    depth = 0
    while (m >> depth) > leaf:
        depth += 1
    return depth


@njit(allocates=True)
def build(points, index, leaf):
    """The tree of ``points[index]`` (the seeds it holds): ``(perm, start, end, lo, hi)``,
    ``perm`` the entries of ``index`` in the order of the leaves."""
    m = index.shape[0]
    dim = points.shape[1]
    depth = levels(m, leaf)
    n_nodes = (1 << (depth + 1)) - 1
    first_leaf = (1 << depth) - 1
    perm = index.copy()
    start = np.zeros(n_nodes, np.int64)
    end = np.zeros(n_nodes, np.int64)
    lo = np.full((n_nodes, dim), np.inf)
    hi = np.full((n_nodes, dim), -np.inf)
    end[0] = m
    key = np.empty(m)
    for k in range(first_leaf):
        s, e = start[k], end[k]
        axis = 0
        widest = -1.0
        for a in range(dim):
            low, high = np.inf, -np.inf
            for t in range(s, e):
                x = points[perm[t], a]
                low = min(low, x)
                high = max(high, x)
            if e > s and high - low > widest:
                widest = high - low
                axis = a
        mid = (s + e) // 2
        if e - s > 1:
            for t in range(s, e):
                key[t] = points[perm[t], axis]
            _select(key, perm, s, e - 1, mid)
        start[2 * k + 1], end[2 * k + 1] = s, mid
        start[2 * k + 2], end[2 * k + 2] = mid, e
    for k in range(first_leaf, n_nodes):
        for t in range(start[k], end[k]):
            for a in range(dim):
                x = points[perm[t], a]
                lo[k, a] = min(lo[k, a], x)
                hi[k, a] = max(hi[k, a], x)
    for k in range(first_leaf - 1, -1, -1):
        for a in range(dim):
            lo[k, a] = min(lo[2 * k + 1, a], lo[2 * k + 2, a])
            hi[k, a] = max(hi[2 * k + 1, a], hi[2 * k + 2, a])
    return perm, start, end, lo, hi


@njit
def _select(key, perm, left, right, nth):
    """Reorder ``key[left:right + 1]`` (and ``perm`` with it) so that entry ``nth`` is the one
    a sort would put there, smaller ones before it and larger ones after (Hoare's selection)."""
    while right > left:
        pivot = key[(left + right) // 2]
        i, j = left, right
        while i <= j:
            while key[i] < pivot:
                i += 1
            while key[j] > pivot:
                j -= 1
            if i <= j:
                key[i], key[j] = key[j], key[i]
                perm[i], perm[j] = perm[j], perm[i]
                i += 1
                j -= 1
        if nth <= j:
            right = j
        elif nth >= i:
            left = i
        else:
            return


@njit(allocates=True)
def planes(start, end, points, weights):
    """``(g (nodes, d), K (nodes,))`` of the module docstring for the seeds ``points`` with
    ``weights``, both in the tree's order (``K = inf`` under no seed: nothing to visit).

    The least-squares sums (of ``y``, ``psi``, ``y y^T``, ``y psi`` about the seeds' mean) of a
    node are those of its children added: one pass over the seeds for the leaves, then one
    per node for ``e_k`` (the fit is a heuristic, the excess over it exact: at 1e5 seeds this
    took 6 to 10 ms instead of 46 to 61 ms)."""
    n_nodes, d = start.shape[0], points.shape[1]
    g = np.zeros((n_nodes, d))
    big = np.full(n_nodes, -np.inf)
    count = np.zeros(n_nodes)
    sums = np.zeros((n_nodes, d + 1))                  # y - o, psi - w0
    products = np.zeros((n_nodes, d + 1, d + 1))       # their products
    cov = np.empty((d, d))
    rhs = np.empty(d)
    mean = np.empty(d + 1)
    m = end[0] - start[0] if n_nodes > 0 else 0
    if m == 0:
        return g, big
    origin = np.zeros(d + 1)
    for t in range(start[0], end[0]):
        for a in range(d):
            origin[a] += points[t, a] / m
        origin[d] += weights[t] / m
    row = np.empty(d + 1)
    first_leaf = (n_nodes - 1) // 2
    for k in range(n_nodes - 1, -1, -1):
        if k >= first_leaf:
            for t in range(start[k], end[k]):
                for a in range(d):
                    row[a] = points[t, a] - origin[a]
                row[d] = weights[t] - origin[d]
                for a in range(d + 1):
                    sums[k, a] += row[a]
                    for b in range(d + 1):
                        products[k, a, b] += row[a] * row[b]
            count[k] = end[k] - start[k]
        else:
            for c in (2 * k + 1, 2 * k + 2):
                count[k] += count[c]
                for a in range(d + 1):
                    sums[k, a] += sums[c, a]
                    for b in range(d + 1):
                        products[k, a, b] += products[c, a, b]
    for k in range(n_nodes):
        s, e = start[k], end[k]
        if e <= s:
            continue
        size = count[k]
        for a in range(d + 1):
            mean[a] = sums[k, a] / size
        for a in range(d):
            rhs[a] = products[k, a, d] - size * mean[a] * mean[d]
            for b in range(d):
                cov[a, b] = products[k, a, b] - size * mean[a] * mean[b]
        if not (size > d and _solve_small(cov, rhs, g[k])):
            for a in range(d):
                g[k, a] = 0.0
        c = mean[d] + origin[d]
        for a in range(d):
            c -= g[k, a] * (mean[a] + origin[a])
        excess = -np.inf
        for t in range(s, e):
            r = weights[t] - c
            for a in range(d):
                r -= g[k, a] * points[t, a]
            excess = max(excess, r)
        gg = 0.0
        for a in range(d):
            gg += g[k, a] * g[k, a]
        big[k] = 0.25 * gg + c + excess
    return g, big


@njit
def _solve_small(a, b, x):
    """``x = a^-1 b`` for a symmetric 2x2 or 3x3 ``a`` by Cramer's rule; False if nearly singular."""
    d = b.shape[0]
    if d == 2:
        det = a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0]
        if not abs(det) > 1e-12 * (a[0, 0] * a[1, 1]) or det == 0.0:
            return False
        x[0] = (b[0] * a[1, 1] - a[0, 1] * b[1]) / det
        x[1] = (a[0, 0] * b[1] - b[0] * a[1, 0]) / det
        return True
    c00 = a[1, 1] * a[2, 2] - a[1, 2] * a[2, 1]
    c01 = a[1, 2] * a[2, 0] - a[1, 0] * a[2, 2]
    c02 = a[1, 0] * a[2, 1] - a[1, 1] * a[2, 0]
    det = a[0, 0] * c00 + a[0, 1] * c01 + a[0, 2] * c02
    if not abs(det) > 1e-12 * (a[0, 0] * a[1, 1] * a[2, 2]) or det == 0.0:
        return False
    c10 = a[0, 2] * a[2, 1] - a[0, 1] * a[2, 2]
    c11 = a[0, 0] * a[2, 2] - a[0, 2] * a[2, 0]
    c12 = a[0, 1] * a[2, 0] - a[0, 0] * a[2, 1]
    c20 = a[0, 1] * a[1, 2] - a[0, 2] * a[1, 1]
    c21 = a[0, 2] * a[1, 0] - a[0, 0] * a[1, 2]
    c22 = a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0]
    x[0] = (c00 * b[0] + c10 * b[1] + c20 * b[2]) / det
    x[1] = (c01 * b[0] + c11 * b[1] + c21 * b[2]) / det
    x[2] = (c02 * b[0] + c12 * b[1] + c22 * b[2]) / det
    return True


def spatial_order(points):
    """An order of ``points`` (n, d) in which neighbours come close to each other: the leaves of
    their tree (NumPy). The compiled solve renumbers its Diracs so (:func:`..plan.solve_plan`):
    the seeds a cell, a matrix row or a ring reads then lie close in memory too (a 2D Newton
    trial of 1e5 random Diracs took 0.2 to 0.3 s, 0.09 s so renumbered)."""
    n = points.shape[0]
    return build(np.ascontiguousarray(points, dtype=np.float64), np.arange(n, dtype=np.int64), 8)[0]


@njit
def nearest_rows(first, last, rows, seeds, perm, start, end, lo, hi, points, out, best, stack):
    """``out[i]`` for ``i`` in ``rows[first:last]``: the indices of the ``out.shape[1]`` seeds of the
    tree nearest to seed ``i`` (itself first), nearest first; -1 where fewer. ``points``: the
    seeds in the order ``perm``; ``best`` (k,), ``stack``: scratch."""
    k = out.shape[1]
    dim = seeds.shape[1]
    first_leaf = (start.shape[0] - 1) // 2
    for r in range(first, last):
        i = rows[r]
        m = 0                                   # the m nearest so far: out[i, :m], best[:m], sorted
        stack[0] = 0
        depth = 1 if start.shape[0] > 0 else 0
        while depth > 0:
            depth -= 1
            node = stack[depth]
            if end[node] <= start[node] or (m == k and _box_distance2(seeds, i, lo, hi, node) >= best[k - 1]):
                continue
            if node >= first_leaf:
                for t in range(start[node], end[node]):
                    d = 0.0
                    for a in range(dim):
                        delta = points[t, a] - seeds[i, a]
                        d += delta * delta
                    if m == k and d >= best[k - 1]:
                        continue
                    u = m if m < k else k - 1     # insertion into the sorted list
                    while u > 0 and best[u - 1] > d:
                        best[u] = best[u - 1]
                        out[i, u] = out[i, u - 1]
                        u -= 1
                    best[u] = d
                    out[i, u] = perm[t]
                    m = min(m + 1, k)
            else:
                near, far = 2 * node + 1, 2 * node + 2
                if _box_distance2(seeds, i, lo, hi, near) > _box_distance2(seeds, i, lo, hi, far):
                    near, far = far, near
                stack[depth] = far
                stack[depth + 1] = near
                depth += 2
        for u in range(m, k):
            out[i, u] = -1


@njit
def _box_distance2(seeds, i, lo, hi, node):
    d = 0.0
    for a in range(seeds.shape[1]):
        g = max(lo[node, a] - seeds[i, a], seeds[i, a] - hi[node, a], 0.0)
        d += g * g
    return d
