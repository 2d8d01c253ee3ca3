"""The integrals the core asks of a voxel density (:class:`..density.PixelDensity` in 3D),
over the cells of :mod:`.polyhedra`: their boundary triangles (:func:`.polyhedra.facet_triangles`)
handed to :mod:`.faces`."""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
from . import faces
from .polyhedra import facet_triangles, listed_triangles


def cell_integrals(xp, seeds, cells, values, lo, hi):
    """``(moments (n, 5), facet (n, F))``: per cell the mass, the first moments and the
    second moment about the seed; per facet slot the density integrated over the facet."""
    if tuple(values.shape) == (1, 1, 1) and not _compat.static_shapes(cells.vertices):
        return _uniform_listed(xp, listed_triangles(xp, cells), cells.size.shape[0], cells.labels.shape[1],
                               values[0, 0, 0])
    tri, slot, valid = facet_triangles(xp, cells)
    if tuple(values.shape) == (1, 1, 1):
        return _uniform(xp, tri, slot, valid, cells.labels.shape[1], values[0, 0, 0])
    return faces.cell_integrals_of_triangles(xp, seeds, tri, slot, valid, cells.labels.shape[1], values, lo, hi)


def potential_integrals(xp, seeds, cells, psi, lo, hi, shape):
    """Per voxel ``int phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i, of ``shape``."""
    tri, _, valid = facet_triangles(xp, cells)
    if tuple(shape) == (1, 1, 1):                  # int |x - y_i|^2 - psi_i over each cell, summed
        no_slot = xp.zeros(valid.shape, dtype=xp.int64, device=aac.device(valid))
        moments, _ = _uniform(xp, tri, no_slot, valid, 1, xp.asarray(1.0, dtype=psi.dtype, device=aac.device(psi)))
        return xp.reshape(xp.sum(moments[:, -1] - psi * moments[:, 0]), (1, 1, 1))
    return faces.potential_integrals_of_triangles(xp, seeds, tri, valid, psi, tuple(shape), lo, hi)


@_compat.jit_on_jax("f_cap")
def _uniform(xp, tri, slot, valid, f_cap, value):
    """The integrals of the constant ``value`` over the cones from the seed (the origin)
    over the boundary triangles: per cone ``0, a, b, c`` of volume ``det(a, b, c) / 6``, the
    first moment ``vol (a + b + c) / 4`` and the second ``vol (|a|^2 + |b|^2 + |c|^2 + |a + b + c|^2) / 20``."""
    a, b, c = tri[..., 0, :], tri[..., 1, :], tri[..., 2, :]
    cross = _cross(xp, b - a, c - a)
    vol = xp.where(valid, _compat.dot(a, _cross(xp, b, c)), 0.0) / 6.0
    s = a + b + c
    second = (_compat.dot(a, a) + _compat.dot(b, b) + _compat.dot(c, c) + _compat.dot(s, s)) / 20.0
    moments = xp.stack([xp.sum(vol, axis=1)] + [xp.sum(vol * s[..., i], axis=1) / 4.0 for i in range(3)]
                       + [xp.sum(vol * second, axis=1)], axis=1)
    area = xp.where(valid, 0.5 * xp.sqrt(_compat.dot(cross, cross)), 0.0)
    n = tri.shape[0]
    base = xp.arange(n, dtype=xp.int64, device=aac.device(slot))[:, None] * f_cap
    facet = _compat.segment_sum(xp, xp.reshape(area, (-1,)), xp.reshape(base + slot, (-1,)), n * f_cap)
    return moments * value, xp.reshape(facet, (n, f_cap)) * value


def _uniform_listed(xp, triangles, n, f_cap, value):
    """:func:`_uniform` on the list of valid triangles (:func:`.polyhedra.listed_triangles`)."""
    a, b, c, cell, slot = triangles
    vol = _compat.dot(a, _cross(xp, b, c)) / 6.0
    s = a + b + c
    second = (_compat.dot(a, a) + _compat.dot(b, b) + _compat.dot(c, c) + _compat.dot(s, s)) / 20.0
    cross = _cross(xp, b - a, c - a)
    per_cell = lambda x: _compat.segment_sum(xp, x, cell, n)
    moments = xp.stack([per_cell(vol)] + [per_cell(vol * s[:, i]) / 4.0 for i in range(3)] + [per_cell(vol * second)],
                       axis=1)
    area = 0.5 * xp.sqrt(_compat.dot(cross, cross))
    facet = _compat.segment_sum(xp, area, cell * f_cap + slot, n * f_cap)
    return moments * value, xp.reshape(facet, (n, f_cap)) * value


def _cross(xp, u, v):
    return xp.stack([u[..., 1] * v[..., 2] - u[..., 2] * v[..., 1], u[..., 2] * v[..., 0] - u[..., 0] * v[..., 2],
                     u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]], axis=-1)
