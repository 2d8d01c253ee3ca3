"""3D: the power cells against scipy's Qhull, the solver against closed forms and the C++
reference, its gradients against finite differences, on every backend.

Ground truth: ``scipy.spatial.HalfspaceIntersection`` and ``ConvexHull`` cell by cell (the
feasible point from a linear program), closed forms, and the reference W2^2 of two C++
solvers (tests/data/README.md, box3d-1e3).
"""
from pathlib import Path

import numpy as np
import pytest

import sdot

DATA = Path(__file__).parent / "data"
REF_BOX3D_1E3 = 0.005340804871140033        # pysdot; sdot (C++) differs by 2e-11 relative


def scipy_cells(seeds, psi, lo, hi):
    """Per cell: volume, first moment about the seed and ``{label: facet area}``, by
    Qhull (an empty cell where the linear program finds no interior point)."""
    from scipy.optimize import linprog
    from scipy.spatial import ConvexHull, HalfspaceIntersection

    n = len(seeds)
    out = []
    for i in range(n):
        d = seeds - seeds[i]
        b = 0.5 * ((d * d).sum(1) + psi[i] - psi)
        others = np.arange(n) != i
        normals = np.concatenate([d[others], -np.eye(3), np.eye(3)])
        offsets = np.concatenate([b[others], seeds[i] - lo, hi - seeds[i]])
        labels = list(np.flatnonzero(others)) + [-1, -3, -5, -2, -4, -6]
        norm = np.linalg.norm(normals, axis=1)
        # the point deepest inside (Chebyshev centre), by a linear program
        lp = linprog(np.r_[0, 0, 0, -1.0], A_ub=np.c_[normals, norm], b_ub=offsets,
                     bounds=[(None, None)] * 3 + [(0, 1)])
        if lp.status != 0 or lp.x[3] < 1e-9:
            out.append((0.0, np.zeros(3), {}))
            continue
        hs = HalfspaceIntersection(np.c_[normals, -offsets], lp.x[:3])      # seed-relative
        hull = ConvexHull(hs.intersections)
        c = hs.intersections.mean(0)
        vol, first = 0.0, np.zeros(3)
        areas = {}
        for simplex, eq in zip(hull.simplices, hull.equations):
            p = hs.intersections[simplex]
            v = abs(np.linalg.det(p - c)) / 6
            vol += v
            first += v * (p.sum(0) + c) / 4
            area = np.linalg.norm(np.cross(p[1] - p[0], p[2] - p[0])) / 2
            # the half-space this facet lies on: its plane through the facet's points
            gap = np.abs(normals @ p.T - offsets[:, None]).max(1) / norm
            label = labels[int(np.argmin(gap))]
            areas[label] = areas.get(label, 0.0) + area
        out.append((vol, first, areas))
    return out


def core_cells(backend, seeds, psi, lo, hi):
    """``(moments, facet, labels, certified)`` of the core's cells (the uniform density 1)."""
    import array_api_compat as aac

    from sdot._core import geometry

    def run(y, w, lo, hi):
        xp = aac.array_namespace(y)
        geom = geometry.of(3)
        active = xp.ones((y.shape[0],), dtype=xp.bool, device=aac.device(y))
        cells = geom.power_cells(xp, y, w, active, lo, hi)
        moments, facet = geom.integrate.cell_integrals(xp, y, cells, xp.ones((1, 1, 1), dtype=y.dtype,
                                                                              device=aac.device(y)), lo, hi)
        return moments, facet, cells.labels, cells.count, cells.certified

    out = backend.run(run, *(backend.asarray(a) for a in (seeds, psi, lo, hi)))
    return [backend.to_numpy(a) for a in out]


@pytest.mark.parametrize("weighted", [False, True])
def test_cells_match_qhull(backend, weighted):
    """Volumes, barycentres and facet areas of random power cells (weights that empty some
    of them) against scipy's half-space intersection, cell by cell."""
    rng = np.random.default_rng(11)
    n = 24 if not backend.host else 60
    seeds = rng.random((n, 3))
    psi = 0.1 * rng.random(n) if weighted else np.zeros(n)
    lo, hi = np.zeros(3), np.array([1.0, 1.5, 0.75])
    seeds = lo + seeds * (hi - lo)
    moments, facet, labels, count, certified = core_cells(backend, seeds, psi, lo, hi)
    assert bool(certified)
    ref = scipy_cells(seeds, psi, lo, hi)
    assert weighted is False or any(r[0] == 0 for r in ref)          # some cells are empty
    vol = np.array([r[0] for r in ref])
    np.testing.assert_allclose(moments[:, 0], vol, rtol=0, atol=1e-13)
    np.testing.assert_allclose(moments[:, 0].sum(), np.prod(hi - lo), rtol=1e-13)
    np.testing.assert_allclose(moments[:, 1:4], np.array([r[1] for r in ref]), rtol=0, atol=1e-13)
    for i, (_, _, areas) in enumerate(ref):
        got = {}
        for k in range(int(count[i])):
            if facet[i, k] != 0:
                got[int(labels[i, k])] = got.get(int(labels[i, k]), 0.0) + facet[i, k]
        assert set(got) == set(areas), i
        np.testing.assert_allclose([got[k] for k in sorted(areas)], [areas[k] for k in sorted(areas)],
                                   rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("weights", ["equal", "some hidden", "lattice", "clustered", "outside"])
def test_cells_read_in_slabs_match_qhull(weights, monkeypatch):
    """The triangulation read in slabs on the threads (from 50 seeds and 1 spacing deep here):
    the cells of seeds near the slabs' sides, cut by seeds beyond them, are clipped again,
    and every cell equals scipy's half-space intersection; the volume sum certifies them."""
    import dataclasses

    from sdot._core import geometry
    from sdot._core.options import DIAGRAM
    from sdot._core.spatial import diagram, triangulated
    from sdot._host import threads

    rng = np.random.default_rng(8)
    if weights == "lattice":                       # cospherical: ties between the slabs
        g = (np.arange(7) + 0.5) / 7
        seeds = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
    elif weights == "clustered":                   # a hundred seeds in a cube 1e-3 wide
        seeds = np.concatenate([rng.random((200, 3)), 0.6 + 1e-3 * rng.random((100, 3))])
    elif weights == "outside":                     # a third of them outside the box
        seeds = 1.6 * rng.random((300, 3)) - 0.3
    else:
        seeds = rng.random((300, 3))
    n = len(seeds)
    psi = 0.05 * rng.random(n) if weights == "some hidden" else np.zeros(n)
    lo, hi = np.zeros(3), np.ones(3)
    thin = dataclasses.replace(DIAGRAM, slabs_from_3d=50, slab_overlap=1.0)   # thin: seeds beyond the slabs cut cells
    read = []
    original = triangulated.triangulated_cells
    monkeypatch.setattr(diagram, "triangulated_cells", lambda *a, **k: read.append(original(*a, **k)) or read[-1])
    active = np.ones(n, bool)
    with threads.host_settings(threads=3):
        cells = diagram.regular_cells(np, seeds, psi, active, lo, hi, diagram.CAPACITY, thin)
    # read in slabs; the lattice's hull faces are cut into triangles one way in a slab and
    # another in the whole: read at once instead
    assert [r[2] for r in read] == [weights != "lattice"] and bool(cells.certified)
    moments, facet = geometry.of(3).integrate.cell_integrals(np, seeds, cells, np.ones((1, 1, 1)), lo, hi)
    ref = scipy_cells(seeds, psi, lo, hi)
    assert weights != "some hidden" or any(r[0] == 0 for r in ref)
    np.testing.assert_allclose(moments[:, 0], [r[0] for r in ref], rtol=0, atol=1e-13)
    np.testing.assert_allclose(moments[:, 1:4], np.array([r[1] for r in ref]), rtol=0, atol=1e-13)
    for i, (_, _, areas) in enumerate(ref):
        got = {}
        for k in range(int(cells.count[i])):
            if facet[i, k] != 0:
                got[int(cells.labels[i, k])] = got.get(int(cells.labels[i, k]), 0.0) + facet[i, k]
        got = {a: v for a, v in got.items() if abs(v) > 1e-14}      # (a lattice's cells meet along edges)
        assert set(got) == set(a for a, v in areas.items() if v > 1e-14), i
        np.testing.assert_allclose([got[k] for k in sorted(got)], [areas[k] for k in sorted(got)], rtol=1e-11,
                                   atol=1e-14)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_few_invalid_moved_cells_are_reclipped_locally(name, monkeypatch):
    """Cells moved to weights that flip a few of them: the invalid ones and their
    neighbours are clipped again (no Qhull), and every cell equals scipy's; with a hidden
    seed that may reappear, the update falls back to the triangulation."""
    from conftest import Backend

    from sdot._core import geometry
    from sdot._core.spatial import diagram

    b = Backend(name)
    rng = np.random.default_rng(5)
    n = 400
    seeds, lo, hi = rng.random((n, 3)), np.zeros(3), np.ones(3)
    psi0 = 1e-3 * rng.random(n)
    psi1 = psi0 + 2e-4 * rng.standard_normal(n) * (rng.random(n) < 0.05)
    xp = b.xp
    y, w0, w1, box = (b.asarray(a) for a in (seeds, psi0, psi1, (lo, hi)))
    active = xp.ones((n,), dtype=xp.bool)
    previous = geometry.of(3).power_cells(xp, y, w0, active, box[0], box[1])
    rebuilt = []
    monkeypatch.setattr(diagram, "regular_cells", lambda *a, **k: rebuilt.append(1))
    cells = diagram.power_cells(xp, y, w1, active, box[0], box[1], capacity=previous.labels.shape[1],
                                previous=previous)
    moved_valid = diagram.moved(xp, y, w1, box[0], box[1], previous)[1]
    assert 0 < int(xp.sum(xp.astype(~moved_valid, xp.int64))) and not rebuilt and bool(cells.certified)
    moments, _ = geometry.of(3).integrate.cell_integrals(xp, y, cells, xp.ones((1, 1, 1), dtype=y.dtype), *box)
    ref = scipy_cells(seeds, psi1, lo, hi)
    np.testing.assert_allclose(b.to_numpy(moments)[:, 0], [r[0] for r in ref], rtol=0, atol=1e-13)

    hidden = psi0.copy()
    hidden[0] = psi0.min() - 1.0                                   # cell 0 empty, then back
    previous = geometry.of(3).power_cells(xp, y, b.asarray(hidden), active, box[0], box[1])
    assert int(previous.count[0]) == 0
    assert diagram._reclipped_locally(xp, y, w1, active, box[0], box[1], previous,
                                      diagram.moved(xp, y, w1, box[0], box[1], previous)[1],
                                      diagram.DIAGRAM) is None


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_mostly_turned_over_cells_are_rebuilt_without_moving_them(name, monkeypatch, array_kernels):
    """When a sample of the cells moved to the new weights has many invalid ones, the cells
    are read off the triangulation at once (no cell moved): the same volumes as a diagram
    built afresh; with few invalid cells every cell is moved as before."""
    from conftest import Backend

    from sdot._core import geometry
    from sdot._core.spatial import diagram

    b = Backend(name)
    xp, n = b.xp, 5000
    rng = np.random.default_rng(8)
    seeds, psi0 = rng.random((n, 3)), 1e-4 * rng.random(n)
    y, w0, lo, hi = (b.asarray(a) for a in (seeds, psi0, np.zeros(3), np.ones(3)))
    active = xp.ones((n,), dtype=xp.bool)
    previous = diagram.power_cells(xp, y, w0, active, lo, hi)
    moves = []
    moved = diagram.moved
    monkeypatch.setattr(diagram, "moved", lambda *a: moves.append(1) or moved(*a))
    volumes = lambda cells: b.to_numpy(geometry.of(3).integrate.volumes(xp, cells))
    for scale, moving in ((1e-4, False), (1e-9, True)):
        w1 = b.asarray(psi0 + scale * rng.standard_normal(n))
        moves.clear()
        cells = diagram.power_cells(xp, y, w1, active, lo, hi, capacity=previous.labels.shape[1], previous=previous)
        assert bool(moves) == moving and bool(cells.certified)
        np.testing.assert_allclose(volumes(cells), volumes(diagram.power_cells(xp, y, w1, active, lo, hi)),
                                   rtol=0, atol=1e-14)


def _hiding_step(backend, seeds, psi, d):
    """The 3D hiding step of ``seeds`` at weights ``psi`` along ``d`` (the cells at ``psi``)."""
    import array_api_compat as aac

    from sdot._core import geometry

    def run(y, w, d, lo, hi):
        xp = aac.array_namespace(y)
        geom = geometry.of(3)
        active = xp.ones((y.shape[0],), dtype=xp.bool, device=aac.device(y))
        cells = geom.power_cells(xp, y, w, active, lo, hi)
        return geom.hiding_step(xp, y, w, d, active, cells)
    box = (np.zeros(3), np.ones(3))
    return float(backend.to_numpy(backend.run(run, *(backend.asarray(a) for a in (seeds, psi, d) + box))))


@pytest.mark.skip_backends("jax", reason="JAX runs the traced kernel in jax-jit (eagerly, its 3D cells compile for "
                           "17 s)")
def test_hiding_step_is_where_a_seed_is_certainly_hidden(backend):
    """The seed at the centre of a regular tetrahedron of radius r is hidden exactly when
    its weight is r^2 below theirs: from equal weights along ``d`` that is ``t = r^2 / (d_k -
    d_0)`` (``inf`` if the seed only grows), and scipy's cell of the seed is empty just
    beyond it, not just before. Among random seeds from their Voronoi cells along a random
    direction, some cell is empty just after the step found (a certificate) and none at 0.
    (JAX runs it under jit: its eager 3D cells compile kernel by kernel, 17 s.)"""
    r = 0.3
    apexes = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / np.sqrt(3.0)
    seeds = 0.5 + np.concatenate([np.zeros((1, 3)), r * apexes])
    for d, expected in (([-1.0] + [0.0] * 4, r * r), ([-1.0] + [0.5] * 4, r * r / 1.5), ([1.0] + [0.0] * 4, np.inf)):
        t = _hiding_step(backend, seeds, np.zeros(5), np.array(d))
        assert t == pytest.approx(expected, rel=1e-12)
        if np.isfinite(expected):
            for factor, hidden in ((1.001, True), (0.999, False)):
                assert (scipy_cells(seeds, factor * t * np.array(d), np.zeros(3), np.ones(3))[0][0] == 0.0) == hidden
    if backend.native:                  # (the rest against scipy, once)
        return
    rng = np.random.default_rng(5)
    seeds, psi = rng.random((150, 3)), np.zeros(150)
    d = 0.01 * rng.standard_normal(150)
    t = _hiding_step(backend, seeds, psi, d)

    def empty_cells(t):
        return sum(vol == 0.0 for vol, _, _ in scipy_cells(seeds, psi + t * d, np.zeros(3), np.ones(3)))
    assert empty_cells(0.0) == 0 and 0 < t < np.inf
    assert empty_cells(t * (1 + 1e-9)) >= 1


def test_first_trials_in_3d_are_the_backtracking_less_the_sure_rejections(sdot_driver, monkeypatch):
    """In 3D the first trial of a bounded step (the first, those after a damped one and
    those of the continuation) is the largest of ``min(1, 4 t) 0.7^k`` below the step that
    certainly hides a seed: on two balls of density 1 on a zero background (300 uniform
    points) the solve takes the steps of plain backtracking (the hiding step ignored), to
    the same weights, with fewer diagrams."""
    from conftest import solve_with

    from sdot._core import evaluation, newton, options, spatial

    sdot_driver.framework = "numpy"
    limits, trials, calls = [], [], []
    hiding_step, evaluate = spatial.hiding_step, evaluation.evaluate
    monkeypatch.setattr(newton, "evaluate", lambda *a, **k: calls.append(k.get("trial")) or evaluate(*a, **k))
    c = (np.arange(12) + 0.5) / 12
    x, y, z = np.meshgrid(c, c, c, indexing="ij")
    img = ((((x - 0.3) ** 2 + (y - 0.3) ** 2 + (z - 0.3) ** 2) < 0.04)
           | (((x - 0.7) ** 2 + (y - 0.7) ** 2 + (z - 0.7) ** 2) < 0.04)).astype(float)
    pts = np.random.default_rng(9).random((300, 3))
    runs = {}
    for bounded in (False, True):
        limits.clear(), trials.clear(), calls.clear()
        monkeypatch.setattr(spatial, "hiding_step", lambda *a: limits.append(float(hiding_step(*a))) or (
            hiding_step(*a) if bounded else np.asarray(np.inf)))
        plan = solve_with(options.DEFAULT, sdot.SumOfDiracs(pts), sdot.Grid(img), 1e-10,
                          lambda it, err, t, width: trials.append((float(t), float(width))))
        assert bool(plan.converged)
        runs[bounded] = (int(plan.iterations), len(calls), plan.brenier_potential)
    steps = [t for k, (t, width) in enumerate(trials[1:]) if k == 0 or trials[k][0] < 1.0 or width > 0]
    assert len(limits) == len(steps) and all(t < h for t, h in zip(steps, limits))
    assert runs[True][0] == runs[False][0] and runs[True][1] < runs[False][1], runs
    np.testing.assert_allclose(runs[True][2], runs[False][2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("slabs", [False, True])
def test_reference_box3d_1e3(sdot_driver, name, slabs, monkeypatch):
    """The C++ solvers' W2^2 for 1,000 uniform points in the unit cube, to 1e-8 (under
    ``jax.jit``: :func:`test_jit_value_and_gradient_equal_eager`); with ``slabs``, every
    triangulation read in slabs (from 8,000 seeds by default), thin ones."""
    import dataclasses

    from conftest import _activate, solve_with

    from sdot._core import options
    from sdot._host import slabs_3d

    read = []
    chosen = options.DEFAULT
    if slabs:                                   # (the array kernels' route: the compiled one reads no slabs)
        sdot_driver.compiled, sdot_driver.threads = False, 2         # two slabs
        chosen = dataclasses.replace(chosen, diagram=dataclasses.replace(options.DIAGRAM, slabs_from_3d=100,
                                                                         slab_overlap=1.5))
        original = slabs_3d._slab
        monkeypatch.setattr(slabs_3d, "_slab", lambda *a: read.append(1) or original(*a))
    backend = _activate(name, sdot_driver)
    pts = np.load(DATA / "points_3d_1000.npy")
    plan = solve_with(chosen, sdot.SumOfDiracs(backend.asarray(pts)), sdot.Grid(backend.asarray(np.ones((1, 1, 1)))),
                      sdot.default_tolerance())
    assert float(plan.distance) == pytest.approx(REF_BOX3D_1E3, rel=1e-8)
    assert int(plan.iterations) <= 8
    assert bool(read) == slabs


def test_jit_value_and_gradient_equal_eager():
    """``jax.jit(jax.value_and_grad(distance))`` in 3D (the traced cells and solve) gives the
    eager value and gradient."""
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.load(DATA / "points_3d_1000.npy")[:300])
    f = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(jnp.ones((1, 1, 1))))
    value, grad = jax.value_and_grad(f)(x)
    value_jit, grad_jit = jax.jit(jax.value_and_grad(f))(x)
    assert float(value_jit) == pytest.approx(float(value), rel=1e-11)
    np.testing.assert_allclose(np.asarray(grad_jit), np.asarray(grad), atol=1e-12)


def test_closed_forms(eager_backend):
    """One Dirac at the centre of the unit cube: W2^2 = 1/4; a k^3 lattice at the voxel
    centres: W2^2 = 1 / (4 k^2) and barycentres at the seeds (cospherical points)."""
    b = eager_backend
    cube = sdot.Grid(b.asarray(np.ones((1, 1, 1))))
    one = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray([[0.5, 0.5, 0.5]])), cube)
    assert float(one.distance) == pytest.approx(0.25, rel=1e-13)
    k = 3
    c = (np.arange(k) + 0.5) / k
    lattice = np.stack(np.meshgrid(c, c, c, indexing="ij"), -1).reshape(-1, 3)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray(lattice)), sdot.Grid(b.asarray(np.ones((1, 1, 1)))))
    assert float(plan.distance) == pytest.approx(1 / (4 * k * k), rel=1e-12)
    np.testing.assert_allclose(b.to_numpy(plan.barycenters), lattice, atol=1e-13)
    np.testing.assert_allclose(b.to_numpy(plan.cell_masses), np.full(k ** 3, 1 / k ** 3), atol=1e-13)


def _problem(seed=3, n=40):
    rng = np.random.default_rng(seed)
    return rng.random((n, 3)), 0.5 + rng.random(n)


def test_invariances():
    """Permuting the Diracs permutes the plan; translating the problem by a power of two
    leaves W2^2 as it is; on a box 2 x 1 x 1, domain respected."""
    x, w = _problem()
    dens = sdot.Grid(np.ones((1, 1, 1)))
    base = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), dens)
    perm = np.random.default_rng(0).permutation(len(x))
    moved = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x[perm], w[perm]), dens)
    assert float(moved.distance) == pytest.approx(float(base.distance), rel=1e-12)
    np.testing.assert_allclose(moved.barycenters, base.barycenters[perm], atol=1e-12)
    shift = np.array([4.0, -8.0, 2.0])
    far = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x + shift, w),
                                      sdot.Grid(np.ones((1, 1, 1)), domain=(tuple(shift), tuple(shift + 1))))
    assert float(far.distance) == pytest.approx(float(base.distance), rel=1e-12)
    np.testing.assert_allclose(far.barycenters - shift, base.barycenters, atol=1e-12)


def test_gradients_match_finite_differences():
    """dW/dy and dW/dm of torch and JAX against central differences (FP64), and each other."""
    import jax
    import jax.numpy as jnp
    import torch

    x, w = _problem(5, 30)
    ones = np.ones((1, 1, 1))

    def w2(x, w):
        return float(sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(ones)))

    h = 1e-6
    rng = np.random.default_rng(1)
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    fd_x = (w2(x + h * dx, w) - w2(x - h * dx, w)) / (2 * h)
    fd_w = (w2(x, w + h * dw) - w2(x, w - h * dw)) / (2 * h)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    sdot.distance(sdot.SumOfWeightedDiracs(xt, wt), sdot.Grid(torch.ones((1, 1, 1), dtype=torch.float64))).backward()
    f = lambda x, w: sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(jnp.ones((1, 1, 1))))
    gx, gw = jax.grad(f, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(w))
    assert float((xt.grad.numpy() * dx).sum()) == pytest.approx(fd_x, rel=1e-6, abs=1e-10)
    assert float((wt.grad.numpy() * dw).sum()) == pytest.approx(fd_w, rel=1e-6, abs=1e-10)
    np.testing.assert_allclose(np.asarray(gx), xt.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(np.asarray(gw), wt.grad.numpy(), atol=1e-10)


@pytest.mark.parametrize("far", [3.0, 1e3, 1e6])
def test_hard_inputs_converge(sdot_driver, far):
    """Duplicates, coplanar points, a cluster 1e-7 wide, a Dirac outside the domain (at 3, 1e3
    or 1e6 domain sides, whose cell is integrated about one of its vertices; at 1e3 a stall
    at a residual of 1.7e-3, then 2.7e-10 until the directions' gauge left out the far Dirac;
    at 1e6 a stall at step 3 on the array kernels' route, whose Qhull leaves points of the
    cluster out of the triangulation: the compiled cells need no triangulation) and a zero mass:
    the solve converges and the cell masses match the Diracs', on NumPy, torch and JAX (the
    backends with a host)."""
    from conftest import _activate

    for name in ("numpy", "torch", "jax"):
        _check_hard_inputs(_activate(name, sdot_driver), far)


def test_clusters_of_diracs_converge_in_3d(sdot_driver):
    """5 clusters of 12 Diracs, each 1e-6 wide, against a ball of voxels: stalled at step 3
    (residual 0.14 to 0.24) from the Voronoi and similarity starts, whose cluster cells hold
    1e-10 of their targets; from the ranks' start, converged in 12-13 steps."""
    from conftest import _activate

    m = 8
    c = (np.arange(m) + 0.5) / m
    x, y, z = np.meshgrid(c, c, c, indexing="ij")
    ball = ((x - 0.5) ** 2 + (y - 0.5) ** 2 + (z - 0.5) ** 2 < 0.35 ** 2).astype(float)
    rng = np.random.default_rng(0)
    pts = rng.random((5, 3))[np.repeat(np.arange(5), 12)] + 1e-6 * rng.standard_normal((60, 3))
    for name in ("numpy", "jax"):
        b = _activate(name, sdot_driver)
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray(pts)), sdot.Grid(b.asarray(ball)))
        assert bool(plan.converged)
        np.testing.assert_allclose(b.to_numpy(plan.cell_masses), 1 / 60, atol=1e-10)


def test_scattered_voxels_converge_in_3d(sdot_driver):
    """100 Diracs sampled inside 3% scattered voxels of 12^3 (49 voxels, most of them
    separate pieces): stalled at a residual of 4e-3 when the blur was gone (the pieces' cells
    unbalanced); with the return to the last width, converged in 16 steps."""
    from conftest import _activate

    m = 12
    rng = np.random.default_rng(5002)
    img = (rng.random((m, m, m)) < 0.03).astype(float)
    n = int(rng.choice([100, 300]))
    k = rng.choice(np.flatnonzero(img.ravel() > 0), n)
    pts = (np.stack(np.unravel_index(k, img.shape), 1) + rng.random((n, 3))) / m
    assert pts.shape == (100, 3) and img.sum() == 49
    for name in ("numpy", "jax"):
        b = _activate(name, sdot_driver)
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray(pts)), sdot.Grid(b.asarray(img)))
        assert bool(plan.converged)
        np.testing.assert_allclose(b.to_numpy(plan.cell_masses), 1 / 100, atol=1e-10)


def test_a_far_dirac_alone_converges(sdot_driver):
    """One Dirac at 1e6 domain sides among 200 uniform ones: its cell, 1e6 away from it, is
    integrated about one of its own vertices (before: a stall, cell masses 1.2e-6 off)."""
    from conftest import _activate

    for name in ("numpy", "torch", "jax"):
        b = _activate(name, sdot_driver)
        x = np.random.default_rng(5).random((200, 3))
        x[0] = [1e6, -1e6, 3.0]
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray(x)), sdot.Grid(b.asarray(np.ones((1, 1, 1)))))
        assert bool(plan.converged)
        np.testing.assert_allclose(b.to_numpy(plan.cell_masses), 1 / 200, atol=1e-10)


def _check_hard_inputs(b, far):
    rng = np.random.default_rng(8)
    x = rng.random((60, 3))
    x[10:15] = x[3]                                  # exact duplicates
    x[20:40, 2] = 0.5                                # coplanar
    x[40:45] = 0.7 + 1e-7 * rng.random((5, 3))       # a cluster
    x[50] = [far, -far, 0.5]                         # outside the domain
    w = np.ones(60)
    w[55] = 0.0
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(b.asarray(x), b.asarray(w)),
                                       sdot.Grid(b.asarray(np.ones((1, 1, 1)))))
    assert bool(plan.converged)
    np.testing.assert_allclose(b.to_numpy(plan.cell_masses), w / w.sum(), atol=1e-10)


@pytest.mark.parametrize("positions, values, error", [
    (np.zeros((3, 4)), np.ones((1, 1, 1, 1)), NotImplementedError),
    (np.random.default_rng(0).random((3, 3)), np.ones((2, 2)), ValueError),
])
def test_clear_errors(positions, values, error):
    with pytest.raises(error):
        sdot.distance(sdot.SumOfDiracs(positions), sdot.Grid(values))


def test_zero_volume_domain_is_refused():
    with pytest.raises(ValueError, match="domain"):
        flat = sdot.Grid(np.ones((1, 1, 1)), domain=((0, 0, 0), (1, 0, 1)))
        sdot.distance(sdot.SumOfDiracs(np.full((3, 3), 0.5)), flat)


def test_power_diagram_cells_facets_and_plots(tmp_path):
    """``PowerDiagram`` in 3D: cell volumes and facet areas as Qhull's, each facet seen from
    both sides with the same area, ``adjust_weights`` reaches the target masses, and the
    plots (3D edges, a section, one cell) draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(4)
    x = rng.random((25, 3))
    psi = 0.05 * rng.random(25)
    diagram = sdot.PowerDiagram(x, psi)
    cells = diagram.cells
    ref = scipy_cells(x, psi, np.zeros(3), np.ones(3))
    np.testing.assert_allclose([c.measure for c in cells], [r[0] for r in ref], atol=1e-13)
    for c, (_, _, areas) in zip(cells, ref):
        assert {f.neighbour: f.area for f in c.facets} == pytest.approx(areas, rel=1e-11, abs=1e-14)
        for f in c.facets:                                   # planar, on the cell's boundary
            assert f.vertices.shape[1] == 3 and len(f.vertices) >= 3
    masses = 0.5 + rng.random(25)
    plan = diagram.adjust_weights(masses, sdot.Grid(np.ones((1, 1, 1))))
    np.testing.assert_allclose([c.measure for c in diagram.cells], masses / masses.sum(), atol=1e-10)
    assert bool(plan.converged)
    diagram.plot()
    diagram.plot(section=(2, 0.5))
    cells[0].plot()
    plt.savefig(tmp_path / "cells.png")
    plt.close("all")


def _voxel_image(k=8):
    c = (np.arange(k) + 0.5) / k
    x, y, z = np.meshgrid(c, c, c, indexing="ij")
    return 0.2 + np.exp(-((x - 0.5) ** 2 + (y - 0.5) ** 2 + (z - 0.3) ** 2) / (2 * 0.2 ** 2))


def test_voxel_gradients_match_finite_differences_and_agree():
    """A Gaussian voxel image: dW/d(values) (the potential integrated over each voxel) and
    dW/dy against central differences; torch == JAX (value and all gradients)."""
    import jax
    import jax.numpy as jnp
    import torch

    x, w = _problem(6, 40)
    img = _voxel_image(6)

    def w2(x, img):
        plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=1e-13)
        return float(plan.distance)

    xt, vt = torch.tensor(x, requires_grad=True), torch.tensor(img, requires_grad=True)
    value = sdot.distance(sdot.SumOfWeightedDiracs(xt, torch.tensor(w)), sdot.Grid(vt))
    value.backward()
    h = 1e-5
    rng = np.random.default_rng(2)
    dv, dx = rng.standard_normal(img.shape), rng.standard_normal(x.shape)
    fd_v = (w2(x, img + h * dv) - w2(x, img - h * dv)) / (2 * h)
    fd_x = (w2(x + h * dx, img) - w2(x - h * dx, img)) / (2 * h)
    assert float((vt.grad.numpy() * dv).sum()) == pytest.approx(fd_v, rel=1e-6, abs=1e-10)
    assert float((xt.grad.numpy() * dx).sum()) == pytest.approx(fd_x, rel=1e-6, abs=1e-10)
    f = lambda x, v: sdot.distance(sdot.SumOfWeightedDiracs(x, jnp.asarray(w)), sdot.Grid(v))
    vj, (gx, gv) = jax.value_and_grad(f, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(img))
    assert float(vj) == pytest.approx(float(value), rel=1e-12)
    np.testing.assert_allclose(np.asarray(gx), xt.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(np.asarray(gv), vt.grad.numpy(), atol=1e-10)


@pytest.mark.parametrize("support", ["cube", "two blobs", "shell"])
def test_zero_density_voxels_converge(support):
    """Uniform Diracs against voxel images that vanish outside a shape (most Diracs where the
    density is 0): the continuation converges, each cell holds its Dirac's mass, and the
    barycentres lie in the support's box."""
    k = 12
    c = (np.arange(k) + 0.5) / k
    x, y, z = np.meshgrid(c, c, c, indexing="ij")
    if support == "cube":
        img = ((abs(x - 0.5) < 0.2) & (abs(y - 0.5) < 0.2) & (abs(z - 0.5) < 0.2)).astype(float)
    elif support == "two blobs":
        img = ((((x - 0.3) ** 2 + (y - 0.3) ** 2 + (z - 0.3) ** 2) < 0.04)
               | (((x - 0.7) ** 2 + (y - 0.7) ** 2 + (z - 0.7) ** 2) < 0.04)).astype(float)
    else:
        r2 = (x - 0.5) ** 2 + (y - 0.5) ** 2 + (z - 0.5) ** 2
        img = ((r2 > 0.2 ** 2) & (r2 < 0.4 ** 2)).astype(float)
    pts = np.random.default_rng(9).random((300, 3))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(pts), sdot.Grid(img))
    assert bool(plan.converged) and float(plan.residual) <= 1e-10
    np.testing.assert_allclose(plan.cell_masses, 1 / 300, atol=1e-10)
    inside = np.argwhere(img > 0)
    lo, hi = inside.min(0) / k, (inside.max(0) + 1) / k
    assert np.all(plan.barycenters >= lo - 1e-12) and np.all(plan.barycenters <= hi + 1e-12)


def test_jax_vmap_of_grad_under_jit_equals_a_loop():
    """``jax.jit(jax.vmap(jax.grad(distance)))`` over a batch of 3D point sets gives each
    item's eager gradient."""
    import jax
    import jax.numpy as jnp

    xs = jnp.asarray(np.random.default_rng(12).random((2, 20, 3)))
    f = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(jnp.ones((1, 1, 1))))
    batched = jax.jit(jax.vmap(jax.grad(f)))(xs)
    for b in range(2):
        np.testing.assert_allclose(np.asarray(batched[b]), np.asarray(jax.grad(f)(xs[b])), atol=1e-12)


@pytest.mark.parametrize("name", ["numpy"])
def test_local_reclips_on_a_shell_of_zero_density_voxels_change_nothing(name, monkeypatch, array_kernels):
    """A shell density (0 inside and outside) and Diracs half in a tight cluster: the solve
    with the local reclip of few invalid cells (which it uses) and the one that rebuilds
    every cell from Qhull give the same plan to rounding."""
    import dataclasses

    from conftest import Backend, solve_with

    from sdot._core import options
    from sdot._core.spatial import diagram

    b = Backend(name)
    rng = np.random.default_rng(4)
    c = (np.arange(12) + 0.5) / 12
    r = np.sqrt(sum(a ** 2 for a in np.meshgrid(c - 0.5, c - 0.5, c - 0.5, indexing="ij")))
    shell = (np.abs(r - 0.3) < 0.1).astype(float)
    x = np.concatenate([0.5 + 0.02 * rng.standard_normal((150, 3)), rng.random((250, 3))])
    source, target = sdot.SumOfDiracs(b.asarray(x)), sdot.Grid(b.asarray(shell))
    local, calls = diagram._reclipped_locally, []
    monkeypatch.setattr(diagram, "_reclipped_locally", lambda *a: calls.append(local(*a)) or calls[-1])
    with_local = solve_with(options.DEFAULT, source, target, 1e-11)
    assert any(cells is not None and bool(cells.certified) for cells in calls)
    qhull_only = dataclasses.replace(options.DEFAULT, diagram=dataclasses.replace(options.DIAGRAM, local_share_3d=0.0))
    rebuilt = solve_with(qhull_only, source, target, 1e-11)
    assert bool(with_local.converged) and bool(rebuilt.converged)
    assert float(with_local.distance) == pytest.approx(float(rebuilt.distance), rel=1e-12)
    np.testing.assert_allclose(b.to_numpy(with_local.barycenters), b.to_numpy(rebuilt.barycenters), rtol=0, atol=1e-10)


def test_seeds_qhull_leaves_out_at_equal_weights_get_their_cells(sdot_driver):
    """15 Diracs in a cluster 1e-7 wide among 60: Qhull's Delaunay triangulation leaves 5 of
    them out (within its roundoff), whose Voronoi cells were empty. Now every cell has its
    volume: the cluster's inner cells (bounded by the cluster alone, about 1e-21) equal those
    of the cluster scaled by 1e7 (scipy), and the volumes tile the cube."""
    rng = np.random.default_rng(8)
    x = rng.random((60, 3))
    x[40:55] = 0.7 + 1e-7 * rng.random((15, 3))
    sdot_driver.framework = "numpy"
    volumes = np.array([c.measure for c in sdot.PowerDiagram(x).cells])
    assert np.all(volumes > 0) and volumes.sum() == pytest.approx(1.0, rel=1e-12)
    centre, scale = x[40:55].mean(0), 1e7
    scaled = scipy_cells((x[40:55] - centre) * scale, np.zeros(15), np.full(3, -1e3), np.full(3, 1e3))
    inner = [i for i in range(15) if scaled[i][0] < 1e3]          # (the outer ones reach the box)
    assert len(inner) >= 3
    np.testing.assert_allclose(volumes[40:55][inner], [scaled[i][0] / scale ** 3 for i in inner], rtol=1e-6)
