"""Facet moments of a Bernstein polynomial grid density along the 2D power cells' edges: what
the implicit differentiation of the plan (:mod:`..sensitivity`) asks of
:class:`..density.BernsteinDensity` besides its cell moments and their transpose.

Per edge slot, ``f0, f1, f2 = int_edge rho (1, u, u u^T) ds`` (``u = x - y_i``), by the walk of
:mod:`.bernstein`: the edges split at every grid line, each piece inside one grid cell, where
``rho`` is of degree ``p`` in each of the cell's coordinates ``t0``, ``t1``, both affine along
the piece: ``rho u u^T`` is a polynomial of degree ``2p + 2`` along it, integrated exactly by
the ``p + 2`` Gauss-Legendre nodes of :class:`.bernstein._PieceFrame` (exact to ``2p + 3``).
``f0`` is the ``facet`` of :func:`.bernstein.bernstein_cell_integrals` (the same nodes).
"""
from __future__ import annotations

import math

import array_api_compat as aac

from .. import _compat
from ..quadrature import gauss_legendre
from .bernstein import _horner, _PieceFrame, monomial_coefficients
from .contour import Edges, PieceGrid, visit_pieces
from .sensitivity import _symmetric, facet_moments_by


def bernstein_facet_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per edge slot of the cells, the density times ``1``, ``u`` and ``u u^T`` integrated
    along the edge, ``u = x - y_i``, for a Bernstein grid density.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 2)
        The seeds.
    cells : Cells
        Their cells (:class:`.polygons.Cells`: ``vertices`` relative to the seeds, ``count``).
    coefficients : array (n0, n1, (p+1)^2)
        The Bernstein coefficients of each grid cell of the box ``[lo, hi]`` (C order).
    lo, hi : array (2,)
        The box.

    Returns
    -------
    f0 : array (n, V)
        ``int_edge rho ds`` of the edge from vertex k to vertex k + 1.
    f1 : array (n, V, 2)
        ``int_edge rho u ds``.
    f2 : array (n, V, 2, 2)
        ``int_edge rho u u^T ds`` (symmetric).

    Notes
    -----
    The contract of :func:`.sensitivity.facet_moments` (the same for ``p = 0``): slots
    ``k >= count`` are zero, edges on the box's sides are integrated like the others.
    """
    mono = monomial_coefficients(xp, coefficients)
    n0, n1, n, _ = mono.shape
    by_coefficient = xp.reshape(xp.permute_dims(mono, (2, 3, 0, 1)), (n * n, n0, n1))
    kernel = lambda s, v, c: _facet_moments(xp, s, v, c, by_coefficient, lo, hi)    # noqa: E731
    return facet_moments_by(xp, kernel, seeds, cells)


@_compat.jit_on_jax()
def _facet_moments(xp, seeds, vertices, count, mono, lo, hi):
    """:func:`bernstein_facet_moments` of the cells ``(vertices, count)`` of ``seeds``; ``mono``
    (n^2, n0, n1) the monomial coefficients of the grid cells, coefficient first."""
    nn, n0, n1 = mono.shape
    n = math.isqrt(nn)
    flat = xp.reshape(mono, (nn, n0 * n1))
    nodes, weights = gauss_legendre(n + 1)
    edges = Edges(xp, seeds, vertices, count, lo, hi, (n0, n1))
    total = None
    for e in edges.groups(xp):
        grid = PieceGrid(xp, seeds, e, (n0, n1), lo, hi)
        dx, dy = grid.dx, (hi[1] - lo[1]) / n1
        sy = xp.take(seeds[:, 1], e.cell)

        def visit(piece, acc):
            f = _PieceFrame(xp, grid, piece, dx, dy, lo, sy, nodes, weights)
            a = xp.take(flat, f.cell_index, axis=1)                                   # (n^2, P)
            terms = [0.0] * 6
            for u, v, t0, t1, w in f.nodes:
                rows = [_horner([a[r0 * n + r1, :] for r1 in range(n)], t1) for r0 in range(n)]
                rho = w * _horner(rows, t0)
                terms = [t + rho * m for t, m in zip(terms, (1.0, u, v, u * u, u * v, v * v))]
            return tuple(s + t * f.length for s, t in zip(acc, terms))

        zero = xp.zeros(e.slot.shape, dtype=seeds.dtype, device=aac.device(seeds))
        acc = [e.per_slot(xp, a) for a in visit_pieces(xp, e, (n0, n1), visit, (zero,) * 6)]
        total = acc if total is None else [t + a for t, a in zip(total, acc)]
    f0, fx, fy, fxx, fxy, fyy = total
    return f0, xp.stack([fx, fy], axis=-1), _symmetric(xp, fxx, fxy, fyy)
