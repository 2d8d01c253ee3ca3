"""Time the exact integrals of a voxel density over 3D cells (``sdot._core.spatial.faces``)
on NumPy: ``python -m bench.spatial_integrals [N ...]`` (default 1e4 1e5).

The cells are the Voronoi cells of N uniform points in the unit box, clipped to the box
(scipy's Voronoi of the points and their mirror images across the faces), as a triangle
soup (facets fan-triangulated, outward); built once per N and kept in the temporary
directory. Each call is timed on the uniform density (a (1, 1, 1) grid: closed forms) and
on a random 32^3 grid, then the potential integrals on the 32^3 grid: best of 3 calls,
wall time and process CPU time (the threads of ``row_blocks.blockwise`` included).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np


def voronoi_cells(N: int, seed: int = 0):
    """``(points, triangles (N, T, 3, 3) relative to the points, slot (N, T), valid (N, T), F)``."""
    from scipy.spatial import Voronoi

    rng = np.random.default_rng(seed)
    pts = rng.random((N, 3))
    near = 4.0 * N ** (-1 / 3)
    mirrors = [pts]
    for a in range(3):
        for side in (0.0, 1.0):
            m = pts[np.abs(pts[:, a] - side) < near].copy()
            m[:, a] = 2 * side - m[:, a]
            mirrors.append(m)
    everything = np.concatenate(mirrors)
    vor = Voronoi(everything)
    tris, slots, facets = [[] for _ in range(N)], [[] for _ in range(N)], np.zeros(N, int)
    for (p, q), ridge in zip(vor.ridge_points, vor.ridge_vertices):
        if (p >= N and q >= N) or min(ridge) < 0:
            continue
        poly = vor.vertices[ridge]
        centre = poly.mean(0)
        normal = everything[q] - everything[p]
        e1 = poly[0] - centre
        e2 = np.cross(normal, e1)
        poly = poly[np.argsort(np.arctan2((poly - centre) @ e2, (poly - centre) @ e1))]   # around p -> q
        for owner, polygon in ((p, poly), (q, poly[::-1])):
            if owner < N:
                for j in range(1, len(polygon) - 1):
                    tris[owner].append(np.stack([polygon[0], polygon[j], polygon[j + 1]]) - pts[owner])
                    slots[owner].append(facets[owner])
                facets[owner] += 1
    T = max(len(t) for t in tris)
    triangles, slot, valid = np.zeros((N, T, 3, 3)), np.zeros((N, T), np.int64), np.zeros((N, T), bool)
    for i in range(N):
        k = len(tris[i])
        triangles[i, :k], slot[i, :k], valid[i, :k] = tris[i], slots[i], True
    return pts, triangles, slot, valid, int(facets.max())


def cells(N: int):
    path = os.path.join(tempfile.gettempdir(), f"sdot_bench_voronoi3d_{N}.npz")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        pts, tri, slot, valid, F = voronoi_cells(N)
        np.savez(path, pts=pts, tri=tri, slot=slot, valid=valid, F=F)
        print(f"built {N} cells in {time.perf_counter() - t0:.0f} s ({path})")
    d = np.load(path)
    return d["pts"], d["tri"], d["slot"], d["valid"], int(d["F"])


def best(fn, repeat=3):
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return out, min(wall), min(cpu)


def main(sizes):
    import array_api_compat.numpy as npx

    from sdot._core.spatial import faces as integrate

    lo, hi = np.zeros(3), np.ones(3)
    grid = 0.5 + np.random.default_rng(1).random((32, 32, 32))
    for N in sizes:
        pts, tri, slot, valid, F = cells(N)
        print(f"N={N}: {int(valid.sum())} triangles ({valid.sum(1).mean():.1f} per cell, slots {tri.shape[1]}), "
              f"{F} facet slots")
        for name, values in (("uniform", np.ones((1, 1, 1))), ("32^3", grid)):
            (moments, _), wall, cpu = best(
                lambda: integrate.cell_integrals_of_triangles(npx, pts, tri, slot, valid, F, values, lo, hi))
            print(f"  cell_integrals {name:8s} {wall:7.3f} s (cpu {cpu:.3f} s)   mass {moments[:, 0].sum():.15f}")
        psi = np.zeros(N)
        gradient, wall, cpu = best(
            lambda: integrate.potential_integrals_of_triangles(npx, pts, tri, valid, psi, grid.shape, lo, hi))
        print(f"  potential_integrals 32^3 {wall:7.3f} s (cpu {cpu:.3f} s)   "
              f"check {np.sum(gradient * grid) - np.sum(moments[:, 4]):.1e}")


if __name__ == "__main__":
    main([int(float(a)) for a in sys.argv[1:]] or [10_000, 100_000])
