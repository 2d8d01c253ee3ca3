"""A tile's rows of the Newton matrix and its share of the distributed conjugate gradient.

The Newton matrix is ``A = D - W`` (:func:`sdot._core.newton_matrix._laplacian`: ``W_ij`` the
density integrated over facet ``ij`` divided by ``2 |y_i - y_j|``, ``D`` the row sums plus
the gauge regulariser, 1 on inactive Diracs). A tile holds the rows of its owned Diracs,
``A_T = [A_TT  A_TH]`` (owned and halo columns), from its exact owned cells.

The preconditioner of the conjugate gradient is two-level and additive,

    M^-1 r = A_TT^-1 r_T (each tile, sparse LU)  +  P (P^T A P)^-1 P^T r,

``P`` the indicator of aggregates of about a few hundred Diracs (k-d cuts of each tile):
block Jacobi smooths within tiles, the coarse solve (on the client, ``P^T A P`` assembled
from every tile's rows) carries the low frequencies across tiles.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._core import newton_matrix
from .._host import sparse_lu
from .._core.linear_solvers import FactorPCGOptions


def kept(ev):
    """The evaluation ``ev`` as a tile keeps it: the cells' labels (neighbour ids below the
    tile's Dirac count, negative for the box's sides) in int32, exactly (half their bytes)."""
    labels = ev.cells.labels
    if labels.dtype == np.int32 or labels.shape[0] >= 2 ** 31:
        return ev
    return ev._replace(cells=ev.cells._replace(labels=labels.astype(np.int32)))


def cells_of(ev):
    """The cells of a kept evaluation as the core makes them (int64 labels)."""
    return ev.cells._replace(labels=ev.cells.labels.astype(np.int64))


class TileSystem:
    """The owned rows of the Newton matrix of a tile of ``n`` owned Diracs (the first ``n``
    of ``seeds``, owned then halo) from the evaluation ``ev``, the owned right-hand side
    ``rhs`` (targets minus masses) and the global aggregate of every local Dirac; the
    vectors of the conjugate gradient."""

    def __init__(self, n, seeds, ev, active, rhs, aggregates, first_aggregate, n_aggregates):
        self.n, self.active, self.aggregates = n, active, aggregates
        self.own = aggregates[:n] - first_aggregate          # the owned aggregates, numbered from 0
        self.n_aggregates = n_aggregates
        m = seeds.shape[0]
        if n:
            rows, cols, w = newton_matrix._facet_entries(np, seeds, cells_of(ev), ev.facet)
            keep = rows < n
            self.rows, self.cols, self.w = rows[keep], cols[keep], w[keep]
        else:
            self.rows = self.cols = np.zeros(0, np.int64)
            self.w = np.zeros(0)
        self.diag = np.bincount(self.rows, weights=self.w, minlength=n)
        self.m, self.seeds = m, seeds
        self.rhs = rhs

    def scalars(self):
        """``(sum of the active diagonal, active count, sum of the active right-hand side)``."""
        a = self.active
        return float(np.sum(self.diag[a])), int(np.sum(a)), float(np.sum(self.rhs[a]))

    def start(self, regularisation, scale, mean, factor=None):
        """The regularised matrix (the core's :func:`.newton_matrix.regularised_diagonal` of
        ``regularisation`` and the global mean diagonal ``scale``) and the factors of its owned block (new ones, or ``factor``: those
        of an earlier Newton matrix, still SPD, a weaker preconditioner), the right-hand side
        centred by the global ``mean``; the conjugate gradient from 0. Returns :meth:`_progress`
        and the owned rows' part of the coarse matrix ``P^T A P`` as ``(rows, cols, values)``."""
        n, a = self.n, self.active
        diag = newton_matrix.regularised_diagonal(np, self.diag, a, regularisation, scale)
        ids = np.arange(n)
        self.matrix = sp.csr_matrix((np.concatenate([diag, -self.w]),
                                     (np.concatenate([ids, self.rows]), np.concatenate([ids, self.cols]))),
                                    shape=(n, self.m))
        self.rows = self.cols = self.w = None       # in the matrix now
        # block Jacobi: the owned block's sparse LU, nested dissection from the positions (the core's)
        if factor is None and n:
            # CHOLMOD's factors where cvxopt is installed, else SuperLU's in FP32 (a preconditioner:
            # half the memory traffic of the solves), ordered as the core orders them (nested
            # dissection from the positions on large blocks)
            start = (FactorPCGOptions.nested_dissection_from_3d if self.seeds.shape[1] == 3
                     else FactorPCGOptions.nested_dissection_from)
            points = self.seeds[:n] if n >= start else None
            factor = sparse_lu.factorise(self.matrix[:, :n].tocsr(), True, points, FactorPCGOptions.cholmod)
        self.factor = factor
        self.solve_block = sparse_lu.preconditioner(*factor) if n else None
        self.r = np.where(a, self.rhs - mean, 0.0)
        self.x, self.p, self.q, self.halo_p = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(self.m - n)
        coo = self.matrix.tocoo()
        size = int(self.aggregates.max(initial=0)) + 1
        coarse = sp.coo_matrix((coo.data, (self.aggregates[coo.row], self.aggregates[coo.col])), shape=(size, size))
        coarse.sum_duplicates()
        return self._progress() + ((coarse.row, coarse.col, coarse.data),)

    def _progress(self):
        """``(r . z, P^T r on the owned aggregates, r . r)`` with ``z = A_TT^-1 r`` kept."""
        self.z = self.solve_block(self.r) if self.n else np.zeros(0)
        restricted = np.bincount(self.own, weights=self.r, minlength=self.n_aggregates)
        return float(self.r @ self.z), restricted, float(self.r @ self.r)

    def direction_times_matrix(self, beta, coarse, halo_z):
        """The search direction ``p = z + P e + beta p`` on the owned and halo rows (``coarse``
        is ``e`` on every aggregate, ``halo_z`` the halo rows of the neighbours' ``z``), then
        ``q = A_T p``; returns ``p . q``."""
        if not self.n:
            return 0.0
        self.p = self.z + coarse[self.aggregates[:self.n]] + beta * self.p
        self.halo_p = halo_z + coarse[self.aggregates[self.n:]] + beta * self.halo_p
        self.q = self.matrix @ np.concatenate([self.p, self.halo_p])
        return float(self.p @ self.q)

    def update(self, alpha):
        """``x += alpha p``, ``r -= alpha q``; returns :meth:`_progress`."""
        self.x = self.x + alpha * self.p
        self.r = self.r - alpha * self.q
        return self._progress()
