"""The Newton system solved across the tiles: a conjugate gradient driven from the client.

Each iteration is two rounds of calls on the tile actors, all tiles at once:
``cg_update`` (``x``, ``r``, the block-Jacobi solve ``z = A_TT^-1 r`` and the restriction
``P^T r``; the rows of ``z`` in the other tiles' halos come back) and ``cg_direction``
(the search direction ``p = z + P e + beta p``, on the halo rows too from the neighbours'
``z``, and ``q = A p``; ``p . q``). The client sums the scalars and solves the coarse
system ``(P^T A P) e = P^T r`` (one unknown per aggregate of a few hundred Diracs: sparse
Cholesky by CHOLMOD where cvxopt is installed, else sparse LU). Only halo rows of ``z``, the
restricted residual and the coarse correction move.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._core.linear_solvers import FactorPCGOptions
from .._host import sparse_lu


def gathered(calls):
    """The results of actor calls made together (they run concurrently)."""
    return [c.result() for c in calls]


def routed(sent):
    """``{tile: {source: values}}`` from each tile's ``{destination: values}``."""
    out = {}
    for source, pieces in enumerate(sent):
        for dest, values in pieces.items():
            out.setdefault(dest, {})[source] = values
    return out


class CoarseSolver:
    """``(P^T A P)^-1`` from the tiles' ``(rows, cols, values)`` contributions, ``size``
    aggregates (empty ones get a unit diagonal)."""

    def __init__(self, parts, size):
        rows, cols, vals = (np.concatenate(a) for a in zip(*parts))
        matrix = sp.coo_matrix((vals, (rows, cols)), shape=(size, size)).tocsr()
        empty = np.flatnonzero(matrix.diagonal() == 0)
        matrix = matrix + sp.coo_matrix((np.ones(empty.size), (empty, empty)), shape=(size, size)).tocsr()
        # CHOLMOD's factors, else SuperLU's
        self.factor, _ = sparse_lu.factorise(matrix, False, cholmod=FactorPCGOptions.cholmod)

    def solve(self, rhs):
        return self.factor.solve(rhs)


def solve(tiles, regularisation, scale, mean, rtol, refactor=True, max_iter=1000):
    """Solve the Newton system of the ``tiles`` (their :meth:`.tile.Tile.newton_system`
    made) to a relative residual ``rtol``: the diagonal regularised as the core's (the
    relative ``regularisation``, the mean diagonal ``scale``), the right-hand side centred by ``mean``.
    ``refactor``: new block factors (else those of the last solve).
    Returns the iterations; the solution stays on the tiles (``system.x``)."""
    progress = gathered([t.start_solve(regularisation, scale, mean, refactor) for t in tiles])
    coarse = CoarseSolver([s[3] for s in progress], sum(s[1].size for s in progress))
    target = rtol * np.sqrt(sum(p[2] for p in progress))
    beta, rz, it = 0.0, None, 0
    while it < max_iter and np.sqrt(sum(p[2] for p in progress)) > target:
        restricted = np.concatenate([p[1] for p in progress])
        e = coarse.solve(restricted)
        rz_new = sum(p[0] for p in progress) + restricted @ e       # r . (A_TT^-1 r + P e)
        beta, rz = (0.0 if rz is None else rz_new / rz), rz_new
        halos = routed([p[-1] for p in progress])
        pq = sum(gathered([t.cg_direction(beta, e, halos.get(k, {})) for k, t in enumerate(tiles)]))
        progress = gathered([t.cg_update(rz / pq) for t in tiles])
        it += 1
    return it
