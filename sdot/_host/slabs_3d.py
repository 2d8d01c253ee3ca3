"""The 3D cells' combinatorics (:func:`.cells_3d.cell_combinatorics`) read in slabs, one per
thread: Qhull releases the GIL (two lifted hulls of 5e4 points: 3.1-3.3 s one after the other,
1.6-2.2 s on two threads).

The active seeds are cut into slabs of equal counts along the longest side of their box;
each slab triangulates its seeds and those up to ``overlap`` mean spacings beyond its sides
(``DiagramOptions.slab_overlap``), and each seed takes its cell from its own slab. The cell of a slab's seed is
that of the slab's seeds alone, a superset of the true one: a seed beyond the slab cuts it
only where it lies in the power sphere of a tetrahedron around the seed (it cuts off that
vertex; impossible when the slab's reach ``D`` from the power centre ``c`` has ``D^2 - max
psi >= |c - y_a|^2 - psi_a``, else found in a k-d tree), or where the cell is unbounded in
the slab and not in the whole (a face around the seed that no tetrahedron closes and that
is not on the seeds' convex hull). Those cells are clipped again from the box by their
neighbours in the slab and those seeds (for the unbounded ones, the nearest seeds beyond
the slab). Every cell being a superset of the true one, the volume sum then certifies the
whole diagram (:func:`..spatial.diagram.regular_cells`, which otherwise reads the whole
triangulation at once, as it does if Qhull fails in a slab).

NumPy in, NumPy out (see :mod:`sdot._host`).
"""
from __future__ import annotations

import numpy as np

from .cells_3d import cell_combinatorics, regular_tetrahedra
from .threads import map_on_threads, settings
from .triangulation import with_candidates

#: Seeds beyond its slab that an unbounded cell there is clipped by (it is bounded in the whole).
OPEN_CANDIDATES = 48


def slab_cell_combinatorics(p, psi, active, f_cap: int, v_cap: int, slabs: int | None = None, *, slabs_from: int,
                            overlap: float):
    """:func:`.cells_3d.cell_combinatorics` of the seeds ``p`` (n, 3), read in ``slabs``
    slabs (default: one per thread, from ``slabs_from`` active seeds), each with the seeds up to
    ``overlap`` mean spacings beyond its sides: the same dict,
    with ``slabs`` (0-d bool) whether it was, and then cells to certify (see the module
    docstring); None if Qhull fails."""
    keep = np.flatnonzero(active)
    slabs = (settings().threads if keep.size >= slabs_from else 1) if slabs is None else slabs
    if slabs < 2 or keep.size < 2 * slabs or len(p) >= 2_000_000:     # (face keys in 63 bits)
        return _whole(p, psi, active, f_cap, v_cap)
    hull = _hull_keys(p, keep)
    if hull is None:
        return _whole(p, psi, active, f_cap, v_cap)
    n = len(p)
    # the padding of the wide arrays is written by each slab in its rows, on its thread
    out = dict(labels=np.empty((n, f_cap), np.int64), count=np.zeros(n, np.int64),
               corners=np.empty((n, v_cap, 3), np.int64), adjacent=np.empty((n, v_cap, 3), np.int64),
               size=np.zeros(n, np.int64), open=np.zeros(n, bool))
    _padded(out, np.flatnonzero(~active))
    parts = map_on_threads(lambda slab: _slab(p, psi, keep, hull, f_cap, v_cap, out, *slab),
                           _slabs(p, keep, slabs, overlap))
    if any(part is None for part in parts):
        return _whole(p, psi, active, f_cap, v_cap)
    table = np.full((n, max(q["table"].shape[1] for q in parts)), -1, np.int64)
    for q in parts:
        table[q["rows"], :q["table"].shape[1]] = q["table"]
    return dict(out, table=table, tetrahedra=np.concatenate([q["tetrahedra"] for q in parts]),
                vertex=np.concatenate([q["vertex"] for q in parts]), slabs=np.asarray(True))


def _whole(p, psi, active, f_cap, v_cap):
    found = cell_combinatorics(p, psi, active, f_cap, v_cap)
    return None if found is None else dict(found, slabs=np.asarray(False))


def _slabs(p, keep, slabs, overlap):
    """Per slab ``(members, own, axis, reach)``: the seeds it triangulates (ascending), which
    are its own, and the interval of coordinates along ``axis`` that its seeds fill."""
    q = p[keep]
    span = np.ptp(q, axis=0)
    axis = int(np.argmax(span))
    depth = overlap * (np.prod(np.maximum(span, np.finfo(p.dtype).tiny)) / keep.size) ** (1 / 3)
    x = q[:, axis]
    cuts = np.quantile(x, np.arange(1, slabs) / slabs)
    which = np.searchsorted(cuts, x, side="right")
    bounds = np.concatenate([[-np.inf], cuts, [np.inf]])
    out = []
    for s in range(slabs):
        reach = (bounds[s] - depth, bounds[s + 1] + depth)
        inside = ((x >= reach[0]) & (x <= reach[1])) | (which == s)
        out.append((keep[inside], which[inside] == s, axis, reach))
    return out


def _slab(p, psi, keep, hull, f_cap, v_cap, out, members, own, axis, reach):
    """One slab's cells of its own seeds, in the seeds' numbering (see the module
    docstring), written in their rows of the arrays ``out`` (the layout of
    :func:`.cells_3d.cell_combinatorics`); returns the rest, or None if Qhull fails or a
    power centre is not finite."""
    pm = p[members]
    wm = None if psi is None else psi[members]
    ones = np.ones(len(members), bool)
    found = regular_tetrahedra(pm, wm, ones)
    if found is None:
        return None
    tets, across = found
    near = own[tets].any(axis=1)                    # the tetrahedra around the slab's own seeds
    around, around_seeds = tets[near], members[tets[near]]
    outside = np.setdiff1d(keep, members, assume_unique=True)
    cutting = _violations(p, psi, outside, around_seeds, axis, reach)
    if cutting is None:
        return None
    rows = members[own]
    _padded(out, rows)
    part = cell_combinatorics(pm, wm, ones, f_cap, v_cap, found=found, into=(out, members, own))
    # own seeds of a tetrahedron with a seed outside in its power sphere: cut by that seed
    t_bad, j_bad = cutting
    corner = own[around[t_bad]]
    cut, by = around_seeds[t_bad][corner], np.repeat(j_bad, corner.sum(axis=1))
    # own seeds on a face with no tetrahedron across that is not on the hull: the nearest outside
    t, k = np.nonzero(across[near] < 0)
    faces = np.sort(np.stack([around_seeds[t, (k + j) % 4] for j in (1, 2, 3)], axis=1), axis=1)
    loose = np.unique(faces[~np.isin(_keys(faces, len(p)), hull)])
    loose = loose[np.isin(loose, rows)]
    if loose.size and outside.size:
        from scipy.spatial import cKDTree

        k = min(OPEN_CANDIDATES, outside.size)
        nearest = outside[np.asarray(cKDTree(p[outside]).query(p[loose], k=k)[1]).reshape(loose.size, k)]
        cut, by = np.concatenate([cut, np.repeat(loose, k)]), np.concatenate([by, nearest.reshape(-1)])
    table, redo = with_candidates(part["table"], rows, cut, by)
    out["open"][rows] |= redo
    return dict(rows=rows, table=table, tetrahedra=around_seeds, vertex=part["vertex"][near])


def _padded(out, rows):
    """The rows ``rows`` of the wide arrays of ``out`` set to their padding (no facet, no vertex)."""
    for name, value in (("labels", -7), ("corners", -1), ("adjacent", 0)):
        out[name][rows] = value


def _violations(p, psi, outside, tets, axis, reach):
    """The seeds ``outside`` (indices into ``p``, beyond ``reach`` along ``axis``) in the
    power sphere of a tetrahedron of ``tets``: ``(tetrahedron, seed)`` pairs; None where a
    power centre is not finite (a flat tetrahedron). By the reach alone where it is deep
    enough (see the module docstring), else against the seeds outside whose distance to
    the power centre could put them inside (a k-d tree)."""
    from scipy.spatial import cKDTree

    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    y = p[tets]
    w = np.zeros(tets.shape, p.dtype) if psi is None else psi[tets]
    w_out = np.zeros(outside.size, p.dtype) if psi is None else psi[outside]
    w_max = float(w_out.max()) if psi is not None and outside.size else 0.0
    d = y[:, 1:, :] - y[:, :1, :]
    b = 0.5 * (np.einsum("mkj,mkj->mk", d, d) + w[:, :1] - w[:, 1:])
    c12, c20, c01 = np.cross(d[:, 1], d[:, 2]), np.cross(d[:, 2], d[:, 0]), np.cross(d[:, 0], d[:, 1])
    det = np.einsum("mj,mj->m", d[:, 0], c12)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = (b[:, :1] * c12 + b[:, 1:2] * c20 + b[:, 2:] * c01) / det[:, None]       # from corner 0
        radius2 = np.einsum("mj,mj->m", c, c) - w[:, 0]
        x = y[:, 0, axis] + c[:, axis]
        room = np.minimum(x - reach[0], reach[1] - x)
        ok = (room > 0) & (room * room - w_max - radius2 >= 1e-9 * (room * room + np.abs(radius2)))
    if ok.all() or outside.size == 0:
        return none
    which = np.flatnonzero(~ok)
    centre, radius2 = y[which, 0, :] + c[which], radius2[which]
    if not (np.all(np.isfinite(centre)) and np.all(np.isfinite(radius2))):
        return None
    # |c - y_j|^2 - psi_j < r^2 if and only if the lifted (y_j, sqrt(max psi - psi_j)) is nearer to
    # (c, 0) than sqrt(r^2 + max psi): a ball in 4D holds exactly the seeds that cut
    lifted = np.column_stack([p[outside], np.sqrt(np.maximum(w_max - w_out, 0.0))])
    centre4 = np.column_stack([centre, np.zeros(len(centre))])
    near = cKDTree(lifted).query_ball_point(centre4, np.sqrt(np.maximum(radius2 + w_max, 0.0)))
    size = np.fromiter((len(a) for a in near), np.int64, len(near))
    if size.sum() == 0:
        return none
    j = np.concatenate([np.asarray(a, np.int64) for a in near if len(a)])
    t = np.repeat(np.arange(len(near)), size)
    inside = np.sum((centre[t] - p[outside[j]]) ** 2, axis=1) - w_out[j] - radius2[t] < 1e-9 * np.abs(radius2[t])
    return which[t[inside]], outside[j[inside]]


def _keys(faces, n):
    """One int64 per face ``(m, 3)`` of sorted seed indices below ``n``."""
    n = np.int64(n)
    return (faces[:, 0].astype(np.int64) * n + faces[:, 1]) * n + faces[:, 2]


def _hull_keys(p, keep):
    """The :func:`_keys` of the faces of the convex hull of the seeds ``p[keep]``, sorted;
    None if Qhull fails."""
    from scipy.spatial import ConvexHull, QhullError

    try:
        faces = np.sort(keep[ConvexHull(p[keep], qhull_options="Qt").simplices], axis=1)
    except (QhullError, ValueError):
        return None
    return np.sort(_keys(faces, len(p)))
