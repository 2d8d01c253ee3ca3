"""Polynomial tools shared by the integrals of every dimension: the Gauss-Legendre rules on
[0, 1] and the change from the Bernstein basis to monomials (Python numbers, cached; the
arrays made from them in the namespace and dtype of the caller)."""
from __future__ import annotations

import functools
import math

import array_api_compat as aac


@functools.lru_cache(maxsize=None)
def gauss_legendre(n: int):
    """Nodes and weights of the ``n``-point Gauss-Legendre rule on [0, 1] (exact up to degree
    ``2n - 1``), as Python floats: Newton's method on the Legendre polynomial ``P_n``."""
    nodes, weights = [], []
    for k in range(n):
        x = math.cos(math.pi * (k + 0.75) / (n + 0.5))
        for _ in range(100):
            p0, p1 = 1.0, x                   # P_0, P_1, then up to P_n by Bonnet's recursion
            for m in range(2, n + 1):
                p0, p1 = p1, ((2 * m - 1) * x * p1 - (m - 1) * p0) / m
            dp = n * (x * p1 - p0) / (x * x - 1.0) if n > 1 else 1.0
            step = p1 / dp
            x -= step
            if abs(step) < 1e-16:
                break
        nodes.append(0.5 * (1.0 - x))
        weights.append(1.0 / ((1.0 - x * x) * dp * dp))
    return tuple(nodes), tuple(weights)


@functools.lru_cache(maxsize=None)
def bernstein_to_monomial(p: int):
    """``M[k][r]``: ``B(k, p, t) = sum_r M[k][r] t^r`` (integers)."""
    return tuple(tuple(math.comb(p, k) * math.comb(p - k, r - k) * (-1) ** (r - k) if r >= k else 0
                       for r in range(p + 1)) for k in range(p + 1))


def change_of_basis(xp, p, like):
    """:func:`bernstein_to_monomial` as an array of ``like``'s dtype and device."""
    return xp.asarray(bernstein_to_monomial(p), dtype=like.dtype, device=aac.device(like))
