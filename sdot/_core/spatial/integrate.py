"""The integrals the core asks of a voxel density (:class:`..density.PixelDensity` in 3D),
over the cells of :mod:`.polyhedra`: their boundary triangles handed to :mod:`.faces`; eagerly
on the uniform density, the listed triangles (:func:`.polyhedra.listed_triangles`, a third of
the slots) in closed form, by the tetrahedra of :func:`.faces.cell_integrals_of_triangles`."""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
from ..moments import FAR, about_seeds
from . import faces
from .polyhedra import facet_triangles, listed_triangles


def cell_integrals(xp, seeds, cells, values, lo, hi):
    """``(moments (n, 5), facet (n, F))``: per cell the mass, the first moments and the
    second moment about the seed; per facet slot the density integrated over the facet."""
    if tuple(values.shape) == (1, 1, 1) and not _compat.static_shapes(cells.vertices):
        return _uniform_listed(xp, listed_triangles(xp, cells), cells.size.shape[0], cells.labels.shape[1],
                               values[0, 0, 0])
    tri, slot, valid = facet_triangles(xp, cells)
    return faces.cell_integrals_of_triangles(xp, seeds, tri, slot, valid, cells.labels.shape[1], values, lo, hi)


def potential_integrals(xp, seeds, cells, psi, lo, hi, shape):
    """Per voxel ``int phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i, of ``shape``."""
    tri, _, valid = facet_triangles(xp, cells)
    return faces.potential_integrals_of_triangles(xp, seeds, tri, valid, psi, tuple(shape), lo, hi)


def volumes(xp, cells):
    """The volume of every cell, ``(n,)``."""
    ones = xp.ones((1, 1, 1), dtype=cells.vertices.dtype, device=aac.device(cells.vertices))
    return cell_integrals(xp, None, cells, ones, None, None)[0][:, 0]


def _uniform_listed(xp, triangles, n, f_cap, value):
    """The uniform density ``value`` over the cells given by the list of their boundary
    triangles ``(a, b, c, cell, slot)``: the tetrahedra from the seed (from a vertex of the
    cell for a cell farther than :data:`..moments.FAR`), summed per cell."""
    a, b, c, cell, slot = triangles
    dev = aac.device(cell)
    if cell.shape[0] == 0:
        zero = xp.zeros((n, 5), dtype=a.dtype, device=dev)
        return zero, xp.zeros((n, f_cap), dtype=a.dtype, device=dev)
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    first = xp.minimum(xp.searchsorted(cell, rows), cell.shape[0] - 1)      # the triangles come by cell
    vertex = xp.take(b, first, axis=0)
    far = (xp.take(cell, first) == rows) & (xp.max(xp.abs(vertex), axis=1) > FAR)
    origin = None if _compat.known_none(xp, far) else xp.where(far[:, None], vertex, 0.0)
    if origin is not None:
        shift = xp.take(origin, cell, axis=0)
        a, b, c = a - shift, b - shift, c - shift
    terms = faces.tetrahedra(xp, [x[:, k] for x in (a, b, c) for k in range(3)])
    moments = xp.stack([_compat.segment_sum(xp, t, cell, n) for t in terms[:5]], axis=1)
    facet = _compat.segment_sum(xp, terms[5], cell * f_cap + slot, n * f_cap)
    moments = moments if origin is None else about_seeds(xp, moments, origin)
    return moments * value, xp.reshape(facet, (n, f_cap)) * value
