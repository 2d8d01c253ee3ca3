"""Cells of a Newton trial from the previous diagram (the kinetic update) on every backend.

Ground truth: the Laguerre cells of scipy's half-space intersections
(``reference_cell`` of test_power_diagram), computed without sdot.
"""
import dataclasses

import numpy as np
import pytest

from sdot._core import planar, seed_neighbours
from sdot._host import threads as host_threads
from sdot._core.planar import hiding, kinetic
from sdot._core.options import DEFAULT, DIAGRAM
from test_power_diagram import reference_cell

LO, HI = np.zeros(2), np.ones(2)


def cells_at(backend, seeds, psi, previous=None, options=DIAGRAM):
    xp, n = backend.xp, len(seeds)
    args = [backend.asarray(a) for a in (seeds, psi, LO, HI)]
    active = xp.ones((n,), dtype=xp.bool, device=backend.device)

    def run(y, w, lo, hi, previous):
        return planar.power_cells(xp, y, w, active, lo, hi, previous=previous, options=options)
    return backend.run(run, *args, previous)


def areas(backend, cells):
    v = backend.to_numpy(cells.vertices)
    count = backend.to_numpy(cells.count)
    out = []
    for verts, c in zip(v, count):
        p, q = verts[:c], np.roll(verts[:c], -1, axis=0)
        out.append(0.5 * np.sum(p[:, 0] * q[:, 1] - p[:, 1] * q[:, 0]))
    return np.array(out)


def neighbour_sets(backend, cells):
    lab, count = backend.to_numpy(cells.labels), backend.to_numpy(cells.count)
    return [set(int(j) for j in row[:c] if j >= 0) for row, c in zip(lab, count)]


def test_flip_partners_of_a_vanishing_edge(backend):
    """A and B share an edge; raising C and D flips it: the edge CD appears."""
    seeds = np.array([[0.4, 0.5], [0.6, 0.5], [0.5, 0.2], [0.5, 0.8]])   # A B C D
    before = cells_at(backend, seeds, np.zeros(4))
    assert 1 in neighbour_sets(backend, before)[0] and 3 not in neighbour_sets(backend, before)[2]
    psi = np.array([0.0, 0.0, 0.12, 0.12])
    ref = [reference_cell(seeds, psi, i) for i in range(4)]
    assert 1 not in ref[0]["facets"] and 3 in ref[2]["facets"], "the configuration must flip AB -> CD"
    xp = backend.xp
    args = [backend.asarray(a) for a in (seeds, psi, LO, HI)]

    def run(y, w, lo, hi, before):
        active = xp.ones((4,), dtype=xp.bool, device=backend.device)
        moved, ok, flipped = kinetic._updated(xp, y, w, active, lo, hi, before)
        return moved, ok, flipped, kinetic.flip_partners(xp, before.labels, before.count, flipped, 4)
    moved, ok, flipped, gained = backend.run(run, *args, before)
    assert backend.to_numpy(flipped)[:2].any(axis=1).all(), "A and B see their common edge reversed"
    # they drop it, and are then exact: the only other change is the edge CD
    assert backend.to_numpy(ok)[:2].all()
    assert neighbour_sets(backend, moved)[:2] == [{j for j in ref[i]["facets"] if j >= 0} for i in (0, 1)]
    assert neighbour_sets(backend, moved)[:2] == [{2, 3}, {2, 3}]
    np.testing.assert_allclose(areas(backend, moved)[:2], [ref[0]["area"], ref[1]["area"]], rtol=1e-12)
    gained = [set(int(j) for j in row if j >= 0) for row in backend.to_numpy(gained)]
    assert gained == [set(), set(), {3}, {2}]


@pytest.mark.parametrize("share", [2.0, 0.0], ids=["kinetic", "rebuilt"])
@pytest.mark.parametrize("scale", [0.002, 0.02])
def test_update_matches_scipy_after_many_flips(backend, scale, share):
    """Weights far from the previous ones (many flips, invalid cells): the
    updated and repaired cells are certified and equal the reference, whether
    they come from the kinetic update or (eagerly, on the host) from the
    regular triangulation."""
    if backend.static and share == 0.0:
        pytest.skip("under static shapes nothing is rebuilt (host_share is 0): the kinetic case")
    check_update_against_scipy(backend, scale, dataclasses.replace(DIAGRAM, rebuild_share=share))


def test_flip_edges_left_out_by_the_update_are_found_by_the_repair(backend):
    """The update keeps one seed gained by flips per cell (eagerly) or 3 of the 60 flip
    pairs (under ``jax.jit``, a static share): the repair finds the cutters left out,
    and the cells equal the reference."""
    check_update_against_scipy(backend, 0.02, dataclasses.replace(DIAGRAM, rebuild_share=2.0, flip_width=1,
                                                                  flip_pairs_traced=0.05))


def check_update_against_scipy(backend, scale, options=DIAGRAM):
    """Cells updated (with the diagram ``options``) from those at zero weights to random
    weights of size ``scale``: certified, and scipy's."""
    rng = np.random.default_rng(11)
    seeds = rng.random((40, 2))
    start = cells_at(backend, seeds, np.zeros(40), options=options)
    psi = scale * rng.random(40)
    cells = cells_at(backend, seeds, psi, previous=start, options=options)
    assert bool(backend.to_numpy(cells.certified))
    refs = [reference_cell(seeds, psi, i) for i in range(40)]
    expected = np.array([0.0 if r is None else r["area"] for r in refs])
    np.testing.assert_allclose(areas(backend, cells), expected, atol=1e-12)
    got = neighbour_sets(backend, cells)
    for i, r in enumerate(refs):
        if r is not None:
            assert got[i] == {j for j, length in r["facets"].items() if j >= 0 and length > 1e-9}, f"cell {i}"
    assert neighbour_sets(backend, start) != got, "the weights must change the combinatorics"


def test_exact_cutters_find_every_cut_vertex(backend):
    """Cells clipped by their Voronoi neighbours only, weights that hide some seeds
    and one inactive seed: a vertex outside its true cell (brute-force powers)
    gets a cutter of lower power there, a vertex inside it gets none. Eagerly on
    the host the candidates are the regular-triangulation neighbours (lifted
    nearest seed for hidden ones); under jit or without a host, the lifted nearest seed."""
    from sdot._core.planar import polygons, repair

    rng = np.random.default_rng(5)
    n = 60
    seeds, psi = rng.random((n, 2)), 0.06 * rng.random(n)
    active = np.ones(n, bool)
    active[7] = False
    refs = [reference_cell(np.delete(seeds, 7, 0), np.delete(psi, 7), i) for i in range(n - 1)]
    assert sum(r is None for r in refs) >= 3, "some seeds must be hidden"
    near = np.full((n, n), -1)
    for i in range(n):
        voronoi = [j for j in reference_cell(seeds, np.zeros(n), i)["facets"] if j >= 0]
        near[i, :len(voronoi)] = voronoi
    xp = backend.xp

    def run(y, w, lo, hi, act, cand):
        rows = xp.arange(n, dtype=xp.int64, device=backend.device)
        cells = polygons.clip_by(xp, y, w, act, polygons.box_cells(xp, y, lo, hi, act, 16), rows, cand)
        return cells, repair.exact_cutters(xp, y, w, act, cells, rows)
    args = [backend.asarray(a) for a in (seeds, psi, LO, HI)]
    cells, cut = backend.run(run, *args, backend.asarray(active, bool), backend.asarray(near, np.int64))
    verts, count, cut = (backend.to_numpy(a) for a in (cells.vertices, cells.count, cut))
    checked = 0
    for i in np.flatnonzero(active):
        for k in range(count[i]):
            v = seeds[i] + verts[i, k]
            power = np.where(active, ((v - seeds) ** 2).sum(1) - psi, np.inf)
            gap = power[i] - power.min()
            if gap > 1e-9:
                assert cut[i, k] >= 0 and power[cut[i, k]] < power[i], (i, k)
                checked += 1
            elif gap < 1e-12:
                assert cut[i, k] == -1, (i, k)
    assert checked >= 20


def test_regular_rings(eager_backend):
    """A seed inside a hexagon has the six in counter-clockwise order, closed; a
    hull seed lists all its neighbours, open; a seed lifted above the others'
    hull (a weight far below theirs) is hidden; inactive seeds are left out."""
    angles = np.pi / 3 * np.arange(6) + 0.1
    hexagon = 0.5 + 0.3 * np.stack([np.cos(angles), np.sin(angles)], 1)
    seeds = np.concatenate([[[0.5, 0.5]], hexagon[::-1], [[0.52, 0.5], [0.9, 0.9]]])   # 0, 1..6, 7, 8
    psi = np.zeros(9)
    psi[7] = -0.05                        # hidden: its power exceeds seed 0's everywhere near it
    active = np.ones(9, bool)
    active[8] = False
    xp = eager_backend.xp
    found = seed_neighbours.regular_rings(xp, *(eager_backend.asarray(a) for a in (seeds, psi)),
                                  eager_backend.asarray(active, bool), tile_points=DIAGRAM.tile_points)
    if found is None:
        assert not eager_backend.host, "no host: the caller clips instead"
        return
    labels, count, closed = (eager_backend.to_numpy(a) for a in found)
    assert count[7] == 0 and count[8] == 0
    ring = list(labels[0, :count[0]])
    assert closed[0] and sorted(ring) == [1, 2, 3, 4, 5, 6]
    turn = np.unwrap([np.arctan2(*(seeds[j] - seeds[0])[::-1]) for j in ring + ring[:1]])
    assert np.all(np.diff(turn) > 0), "counter-clockwise"
    for i in range(1, 7):                 # hull seeds: the centre and their two hexagon neighbours
        assert not closed[i] and set(labels[i, :count[i]]) == {0, 1 + i % 6, 1 + (i - 2) % 6}


@pytest.mark.parametrize("n, spread", [(3000, 0.0), (20000, 1e-5)])
def test_rings_in_tiles_are_the_whole_rings_away_from_the_hull(monkeypatch, n, spread):
    """Triangulated in tiles with an overlap, each point's ring is its ring in the whole
    triangulation, except a few points on the hull (long flat dual triangles cross a
    tile's side: measured 14 and 19 rows, within a quarter of the mean spacing of the
    box's sides, half of them on the hull); the same
    seeds are hidden (weights of random sign: 1433 of 20000 at 1e-5), also when the
    tiles stop at a hidden seed; each active point is its own in one tile."""
    from sdot._host import triangulation

    rng = np.random.default_rng(0)
    seeds, psi, active = rng.random((n, 2)), spread * rng.standard_normal(n), rng.random(n) > 0.05
    rings_of = triangulation.rings
    whole = rings_of(seeds, psi, active)
    tiles = []
    monkeypatch.setattr(triangulation, "rings", lambda p, w, act, stop: tiles.append(act.sum()) or rings_of(
        p, w, act, stop))
    tiled = triangulation.tiled_rings(seeds, psi, active, tile_points=n // 6)
    assert len(tiles) >= 6 and max(tiles) < 0.5 * active.sum()       # proper tiles
    owners = sum(np.bincount(members[own], minlength=n)
                 for members, own in triangulation.overlapping_tiles(seeds, active, 6))
    assert np.array_equal(owners, active.astype(int))
    assert spread == 0 or np.any(active & (whole[1] == 0))
    width = max(whole[0].shape[1], tiled[0].shape[1])
    differ = np.any(_padded(whole[0], width) != _padded(tiled[0], width), axis=1) | (
        whole[1] != tiled[1]) | (whole[2] != tiled[2])
    assert np.array_equal(active & (whole[1] == 0), active & (tiled[1] == 0))
    stopped = triangulation.tiled_rings(seeds, psi, active, True, tile_points=n // 6)   # a trial: the hidden ones only
    assert np.array_equal(active & (whole[1] == 0), active & (stopped[1] == 0))
    assert differ.sum() <= 0.005 * n
    spacing = 1.0 / np.sqrt(n)
    assert np.all(np.minimum(seeds, 1 - seeds)[differ].min(axis=1) < 0.3 * spacing), "only on the hull"


@pytest.mark.parametrize("n, in_tiles", [(3999, False), (4000, True)])
def test_rings_take_a_tile_per_thread_from_enough_points(monkeypatch, n, in_tiles):
    """Qhull releases the GIL: from TILED_FROM active points the rings are triangulated in
    at least one tile per thread (here 3), below in one piece; each point's ring is the
    whole triangulation's away from the hull."""
    from sdot._host import triangulation

    seeds = np.random.default_rng(1).random((n, 2))
    active = np.ones(n, bool)
    whole = triangulation.rings(seeds, np.zeros(n), active)
    sizes = []
    rings_of = triangulation.rings
    monkeypatch.setattr(triangulation, "rings", lambda p, w, act, stop: sizes.append(act.sum()) or rings_of(
        p, w, act, stop))
    with host_threads.host_settings(threads=3):
        tiled = triangulation.tiled_rings(seeds, np.zeros(n), active, tile_points=DIAGRAM.tile_points)
    assert (len(sizes) >= 3 and max(sizes) < 0.5 * n) if in_tiles else sizes == [n]
    width = max(whole[0].shape[1], tiled[0].shape[1])
    differ = np.any(_padded(whole[0], width) != _padded(tiled[0], width), axis=1)
    assert np.all(np.minimum(seeds, 1 - seeds)[differ].min(axis=1) < 0.3 / np.sqrt(n)), "only on the hull"


def _padded(labels, width):
    return np.pad(labels, ((0, 0), (0, width - labels.shape[1])), constant_values=-1)


@pytest.mark.parametrize("case", ["box", "gauss"])
def test_solver_with_rings_in_tiles(eager_backend, monkeypatch, case, array_kernels):
    """The first diagram triangulated in tiles: the reference cases' W2^2 (C++ solvers)
    as before (numpy and torch: JAX solves under ``jax.jit`` and array_api_strict
    without a host, by clipping, with no triangulation)."""
    import sdot
    from conftest import solve_with
    from sdot._host import triangulation
    from test_solver import REF_BOX_1E3, REF_GAUSS_1E3, load

    tiles = []
    rings_of = triangulation.rings
    monkeypatch.setattr(triangulation, "rings", lambda *args: tiles.append(1) or rings_of(*args))
    values, ref = {"box": (np.ones((1, 1)), REF_BOX_1E3), "gauss": (load("image_gauss64.npy"), REF_GAUSS_1E3)}[case]
    in_tiles = dataclasses.replace(DEFAULT, diagram=dataclasses.replace(DIAGRAM, tile_points=200))
    b = eager_backend
    plan = solve_with(in_tiles, sdot.SumOfDiracs(b.asarray(load("points_2d_1000.npy"))), sdot.Grid(b.asarray(values)),
                      sdot.default_tolerance())
    assert bool(plan.converged) and float(plan.distance) == pytest.approx(ref, rel=1e-8)
    assert (len(tiles) >= 4) == eager_backend.host       # JAX: eagerly on the host too


def test_rebuilt_cells_keep_the_capacity_when_the_box_clips_a_wide_ring(eager_backend):
    """Seed 0 near the bottom side has 18 neighbours in the triangulation (a ring wider
    than 16 slots), but the box leaves its cell 11 vertices: the rebuilt cells keep
    16 slots and equal the reference."""
    angles = 2 * np.pi * (np.arange(18) + 0.5) / 18
    ring = np.array([0.5, 0.004]) + 0.05 * np.stack([np.cos(angles), np.sin(angles)], 1)
    rng = np.random.default_rng(3)
    seeds = np.concatenate([[[0.5, 0.004]], ring, 0.1 + 0.8 * rng.random((30, 2)) * [1, 0.5] + [0, 0.4]])
    n = len(seeds)
    psi = np.zeros(n)
    xp = eager_backend.xp

    def run(y, w, lo, hi):
        return kinetic.rebuild(xp, y, w, xp.ones((n,), dtype=xp.bool, device=eager_backend.device), lo, hi, 16)
    out = eager_backend.run(run, *(eager_backend.asarray(a) for a in (seeds, psi, LO, HI)))
    if out is None:
        assert not eager_backend.host, "no host: the caller clips instead"
        return
    cells = out[0]
    assert cells.labels.shape[1] == 16
    refs = [reference_cell(seeds, psi, i) for i in range(n)]
    assert len([j for j in refs[0]["facets"] if j >= 0]) < 16 - 2
    expected = np.array([0.0 if r is None else r["area"] for r in refs])
    np.testing.assert_allclose(areas(eager_backend, cells), expected, atol=1e-12)


def hiding_step_at(backend, seeds, psi, d, previous):
    xp, n = backend.xp, len(seeds)

    def run(y, w, d, previous):
        return hiding.hiding_step(xp, y, w, d, xp.ones((n,), dtype=xp.bool, device=backend.device), previous)
    args = (backend.asarray(a) for a in (seeds, psi, d))
    return float(backend.to_numpy(backend.run(run, *args, previous)))


@pytest.mark.skip_backends("jax", reason="JAX runs the traced kernel in jax-jit (eagerly, its cells compile for 13 s)")
def test_hiding_step_is_where_a_seed_is_certainly_hidden(backend):
    """The seed inside a hexagon of radius r is hidden exactly when its weight is
    r^2 below theirs (its lifted point above the hexagon's plane): from equal weights
    along ``d`` that is ``t = r^2 / (d_k - d_0)`` (``inf`` if the seed only grows).
    Among random seeds from their Voronoi cells along a random direction, some cell is
    empty just after the step found: it is a certificate."""
    angles = np.pi / 3 * np.arange(6) + 0.1
    seeds = np.concatenate([[[0.5, 0.5]], 0.5 + 0.3 * np.stack([np.cos(angles), np.sin(angles)], 1)])
    start = cells_at(backend, seeds, np.zeros(7))
    for d, expected in (([-1.0] + [0.0] * 6, 0.09), ([-1.0] + [0.5] * 6, 0.06), ([1.0] + [0.0] * 6, np.inf)):
        t = hiding_step_at(backend, seeds, np.zeros(7), np.array(d), start)
        assert t == pytest.approx(expected, rel=1e-12)
        if np.isfinite(expected):
            for factor, hidden in ((1.001, True), (0.999, False)):
                assert (reference_cell(seeds, factor * t * np.array(d), 0) is None) == hidden
    rng = np.random.default_rng(5)
    seeds = rng.random((200, 2))
    psi = np.zeros(200)
    d = 0.01 * rng.standard_normal(200)
    start = cells_at(backend, seeds, psi)
    t = hiding_step_at(backend, seeds, psi, d, start)

    def empty_cells(t):
        return sum(reference_cell(seeds, psi + t * d, i) is None for i in range(200))
    assert empty_cells(0.0) == 0 and 0 < t < np.inf
    assert empty_cells(t * (1 + 1e-9)) >= 1
