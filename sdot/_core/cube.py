"""The unit cube in the layout of the 3D cells (:mod:`.spatial.polyhedra`), the start of
every cell: shared by the array kernels and the compiled ones (:mod:`sdot._host.compiled.cells3d`)."""
from __future__ import annotations


def corners_planes_adjacent():
    """The unit cube's corners (8, 3) in {0, 1}^3, their facet slots counter-clockwise
    from outside and their adjacent corners, by the conventions of :mod:`.spatial.polyhedra`
    (lists)."""
    corners, planes, adjacent = [], [], []
    for c in range(8):
        bits = [(c >> a) & 1 for a in range(3)]
        p = [2 * a + bits[a] for a in range(3)]                 # the side of each axis
        # the outward normals are +-e_0, +-e_1, +-e_2: det = product of the signs
        if (2 * bits[0] - 1) * (2 * bits[1] - 1) * (2 * bits[2] - 1) < 0:
            p = [p[0], p[2], p[1]]
        corners.append([float(b) for b in bits])
        planes.append(p)
        # edge k is opposite p_k: along the axis of p_k, to the corner with that bit flipped
        adjacent.append([c ^ (1 << (p[k] // 2)) for k in range(3)])
    return corners, planes, adjacent
