"""The integrals the core asks of a voxel density (:class:`..density.PixelDensity` in 3D),
over the cells of :mod:`.polyhedra`: their boundary triangles handed to :mod:`.faces`; eagerly
on the uniform density, the listed triangles (:func:`.polyhedra.listed_triangles`, a third of
the slots) in closed form, by the tetrahedra of :func:`.faces.cell_integrals_of_triangles`.

For the implicit differentiation of the transport plan: :func:`facet_moments` (the density's
moments of order 0, 1, 2 over each facet), :func:`polynomial_integrals` (per voxel, a
quadratic polynomial per cell integrated: the transpose of ``values -> moments``) and
:func:`axis_second_moments` (by :mod:`.sensitivity` and :mod:`.faces`).

The same integrals of a Bernstein grid (``values`` of shape ``(n0, n1, n2, (p + 1)^3)``,
:class:`..density.BernsteinDensity` in 3D) are :func:`bernstein_cell_integrals`,
:func:`bernstein_potential_integrals` and :func:`bernstein_polynomial_integrals`, from
:mod:`.bernstein`."""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from ..moments import FAR, about_seeds
from . import faces, sensitivity
from .bernstein import (bernstein_axis_second_moments, bernstein_cell_integrals,  # noqa: F401 (re-exported)
                        bernstein_facet_moments, bernstein_polynomial_integrals, bernstein_potential_integrals)
from .polyhedra import CELL_CHUNK, facet_triangles, listed_triangles


def cell_integrals(xp, seeds, cells, values, lo, hi):
    """``(moments (n, 5), facet (n, F))``: per cell the mass, the first moments and the
    second moment about the seed; per facet slot the density integrated over the facet."""
    if (found := _compiled_integrals(xp, seeds, cells, values, lo, hi)) is not None:
        return found
    if tuple(values.shape) == (1, 1, 1) and not _compat.static_shapes(cells.vertices):
        moments, facet = row_blocks.blockwise(xp, lambda *rows: _uniform_rows(xp, cells, rows, False), *_rowwise(cells))
        return moments * values[0, 0, 0], facet * values[0, 0, 0]
    if not _compat.static_shapes(cells.vertices):
        return row_blocks.blockwise(xp, lambda y, *rows: _voxel_rows(xp, y, cells, rows, values, lo, hi),
                                 seeds, *_rowwise(cells))
    tri, slot, valid = facet_triangles(xp, cells)
    return faces.cell_integrals_of_triangles(xp, seeds, tri, slot, valid, cells.labels.shape[1], values, lo, hi)


def _compiled_integrals(xp, seeds, cells, values, lo, hi):
    """Eagerly on the host, :func:`cell_integrals` by the compiled kernel
    (:func:`sdot._host.compiled.integrals3d.cell_integrals`: each cell cut into its pieces in the voxels,
    each integrated in closed form); None where it does not run."""
    def kernel(*host):
        from ..._host.compiled import integrals3d

        return integrals3d.cell_integrals(*host, cells.labels.shape[1])
    return _compat.compiled_call(xp, kernel, seeds, cells.vertices, cells.corners, cells.adjacent, cells.size,
                                 cells.count, values, lo, hi)


def _voxel_rows(xp, seeds, cells, rows, values, lo, hi):
    """:func:`cell_integrals` of a voxel density over a block of ``cells`` (``rows``: its
    vertices, corners, adjacent and size; ``seeds`` its seeds), chunk after chunk of
    :data:`CELL_CHUNK` cells: each chunk's boundary triangles (``3 V`` slots per cell, 1.5 GB
    for all cells at once at 1e5 seeds) made and integrated in turn."""
    f_cap, parts = cells.labels.shape[1], []
    for start, stop, chunk in _chunks(cells, rows):
        tri, slot, valid = facet_triangles(xp, chunk)
        parts.append(faces.cell_integrals_of_triangles(xp, seeds[start:stop, ...], tri, slot, valid, f_cap, values,
                                                       lo, hi))
    return xp.concat([p[0] for p in parts], axis=0), xp.concat([p[1] for p in parts], axis=0)


def potential_integrals(xp, seeds, cells, psi, lo, hi, shape):
    """Per voxel ``int phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i, of ``shape``:
    :func:`polynomial_integrals` of ``(-psi_i, 0, 0, 0, 1)``."""
    zeros = xp.zeros((psi.shape[0], 3), dtype=psi.dtype, device=aac.device(psi))
    coefficients = xp.concat([-psi[:, None], zeros, xp.ones_like(psi)[:, None]], axis=1)
    return polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape)


def polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape):
    """Per voxel the integral of a quadratic polynomial per cell.

    Parameters
    ----------
    xp : namespace
        The array namespace.
    seeds : array (n, 3)
        The seeds ``y_i``.
    cells : Cells
        Their cells (:class:`.polyhedra.Cells`).
    coefficients : array (n, 5)
        Per cell ``(a_i, b_i (3 entries), c_i)``.
    lo, hi : array (3,)
        The box of the voxel grid.
    shape : tuple of int
        The voxel grid's shape ``(n0, n1, n2)``.

    Returns
    -------
    array of shape ``shape``
        Per voxel ``p``, ``sum_i int_{L_i & p} (a_i + b_i . u + c_i |u|^2) dx``, ``u = x - y_i``:
        the transpose of ``values -> cell_integrals(values)[0]``, ``<result, values> =
        sum(coefficients * moments)``. Generalises :func:`potential_integrals`.
    """
    shape = tuple(int(s) for s in shape)
    if shape == (1, 1, 1):          # one voxel: the unit density's moments, in closed form
        ones = xp.ones(shape, dtype=seeds.dtype, device=aac.device(seeds))
        moments = cell_integrals(xp, seeds, cells, ones, lo, hi)[0]
        return xp.reshape(xp.sum(coefficients * moments), shape)
    tri, _, valid = facet_triangles(xp, cells)
    return faces.polynomial_integrals_of_triangles(xp, seeds, tri, valid, coefficients, shape, lo, hi)


def facet_moments(xp, seeds, cells, values, lo, hi):
    """Per facet slot ``(i, k)`` the moments of order 0, 1, 2 of the density over the facet.

    Parameters
    ----------
    xp : namespace
        The array namespace.
    seeds : array (n, 3)
        The seeds ``y_i``.
    cells : Cells
        Their cells (:class:`.polyhedra.Cells`), ``F`` facet slots each.
    values : array (n0, n1, n2)
        The voxel values on the box ``[lo, hi]``.
    lo, hi : array (3,)
        The box of the grid.

    Returns
    -------
    f0 : array (n, F)
        ``int_facet rho dS``: the ``facet`` of :func:`cell_integrals`.
    f1 : array (n, F, 3)
        ``int_facet rho u dS``, ``u = x - y_i``.
    f2 : array (n, F, 3, 3)
        ``int_facet rho u u^T dS`` (symmetric).

    The slots on the box's sides (``labels < 0``) are filled like the others; unused slots
    (and slots whose facet was clipped away) are zero. :func:`.sensitivity.facet_moments_of_triangles`.
    """
    tri, slot, valid = facet_triangles(xp, cells)
    return sensitivity.facet_moments_of_triangles(xp, seeds, tri, slot, valid, cells.labels.shape[1], values, lo, hi)


def axis_second_moments(xp, seeds, cells, values, lo, hi):
    """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis ``a``, ``(n, 3)``: their sum is
    the second moment of :func:`cell_integrals`. :func:`.sensitivity.axis_second_moments_of_triangles`."""
    tri, _, valid = facet_triangles(xp, cells)
    return sensitivity.axis_second_moments_of_triangles(xp, seeds, tri, valid, values, lo, hi)


def volumes(xp, cells):
    """The volume of every cell, ``(n,)``: eagerly the signed tetrahedra's determinants
    alone (the certificate of :mod:`.diagram` asks for nothing else)."""
    if not _compat.static_shapes(cells.vertices):
        return row_blocks.blockwise(xp, lambda *rows: _uniform_rows(xp, cells, rows, True), *_rowwise(cells))
    ones = xp.ones((1, 1, 1), dtype=cells.vertices.dtype, device=aac.device(cells.vertices))
    return cell_integrals(xp, None, cells, ones, None, None)[0][:, 0]


def _chunks(cells, rows):
    """``(start, stop, chunk)`` over the block ``rows`` (vertices, corners, adjacent, size) of
    ``cells``, :data:`CELL_CHUNK` cells at a time (one empty chunk for an empty block)."""
    m = rows[0].shape[0]
    for start in range(0, max(m, 1), CELL_CHUNK):
        stop = min(start + CELL_CHUNK, m)
        yield start, stop, cells._replace(**{f: r[start:stop, ...] for f, r in
                                             zip(("vertices", "corners", "adjacent", "size"), rows)})


def _rowwise(cells):
    return cells.vertices, cells.corners, cells.adjacent, cells.size


def _uniform_rows(xp, cells, rows, volume_only):
    """The unit density over a block of ``cells`` (``rows``: its vertices, corners, adjacent
    and size), chunk after chunk of :data:`CELL_CHUNK` cells: ``(moments (m, 5), facet (m, F))``
    of :func:`_uniform_listed`, or the volumes ``(m,)`` alone if ``volume_only``."""
    f_cap, parts = cells.labels.shape[1], []
    for _, _, chunk in _chunks(cells, rows):
        parts.append(_uniform_listed(xp, listed_triangles(xp, chunk), chunk.size.shape[0], f_cap, volume_only))
    if volume_only:
        return xp.concat(parts, axis=0)
    return xp.concat([p[0] for p in parts], axis=0), xp.concat([p[1] for p in parts], axis=0)


def _uniform_listed(xp, triangles, n, f_cap, volume_only=False):
    """The unit density over the cells given by the list of their boundary
    triangles ``(a, b, c, cell, slot)``: the tetrahedra from the seed (from a vertex of the
    cell for a cell farther than :data:`..moments.FAR`), summed per cell: ``(moments (n, 5),
    facet (n, F))``; ``volume_only``: the volumes ``(n,)``, ``sum a . (b x c) / 6``."""
    a, b, c, cell, slot = triangles
    dev = aac.device(cell)
    if cell.shape[0] == 0:
        zero = xp.zeros((n, 5), dtype=a.dtype, device=dev)
        return zero[:, 0] if volume_only else (zero, xp.zeros((n, f_cap), dtype=a.dtype, device=dev))
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    first = xp.minimum(xp.searchsorted(cell, rows), cell.shape[0] - 1)      # the triangles come by cell
    vertex = xp.take(b, first, axis=0)
    far = (xp.take(cell, first) == rows) & (xp.max(xp.abs(vertex), axis=1) > FAR)
    origin = None if _compat.known_none(xp, far) else xp.where(far[:, None], vertex, 0.0)
    if origin is not None:
        shift = xp.take(origin, cell, axis=0)
        a, b, c = a - shift, b - shift, c - shift
    if volume_only:
        return _compat.segment_sum(xp, faces.determinants(xp, a, b, c), cell, n) / 6.0
    terms = faces.tetrahedra(xp, [x[:, k] for x in (a, b, c) for k in range(3)])
    moments = xp.stack([_compat.segment_sum(xp, t, cell, n) for t in terms[:5]], axis=1)
    facet = _compat.segment_sum(xp, terms[5], cell * f_cap + slot, n * f_cap)
    moments = moments if origin is None else about_seeds(xp, moments, origin)
    return moments, xp.reshape(facet, (n, f_cap))
