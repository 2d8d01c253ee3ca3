"""Batches of targets (``BatchOfPolynomialGrid``) and batched plans: a batch on either side, or
both, gives one result per item. Ground truth: the single solves of the items (tested on their
own elsewhere), looped here; closed forms (one Dirac on a uniform box); per-item gradients."""
from __future__ import annotations

import numpy as np
import pytest

import sdot

B, N, SHAPE = 3, 50, (8, 8)


def problem(seed=0, small=False):
    """``B`` sets of ``N`` Diracs, weights, and ``B`` positive 8x8 grids (``small``: 12 Diracs
    and 4x4 grids, for array_api_strict's pure array-API solves)."""
    rng = np.random.default_rng(seed)
    n, shape = (12, (4, 4)) if small else (N, SHAPE)
    return rng.uniform(0.05, 0.95, (B, n, 2)), rng.uniform(0.5, 1.5, (B, n)), rng.uniform(0.5, 2.0, (B,) + shape)


def num(backend, a):
    return backend.to_numpy(a)


def single(x, v, w=None):
    """The plan of one source and one grid, solved by NumPy: the ground truth of an item."""
    saved, sdot.driver.framework = sdot.driver.framework, "numpy"
    try:
        source = sdot.SumOfDiracs(x) if w is None else sdot.SumOfWeightedDiracs(x, w)
        return sdot.optimal_transport_plan(source, sdot.Grid(v))
    finally:
        sdot.driver.framework = saved


# ------------------------------------------------------------------ the measure
def test_batch_of_grids_is_its_items(eager_backend):
    """Items are the grids of ``values[i]``; densities integrate to ``mass`` per item; the
    checks of a grid run on every item."""
    _, _, v = problem()
    batch = sdot.BatchOfPolynomialGrid(eager_backend.asarray(v), mass=2.0)
    assert len(batch) == B and batch.batched and batch.dim == 2 and "b=3" in repr(batch)
    item = batch[1]
    assert type(item) is sdot.PolynomialGrid and item.mass == 2.0
    np.testing.assert_array_equal(num(eager_backend, item.values), v[1])
    density = num(eager_backend, batch.density)
    assert density.shape == (B,) + SHAPE
    np.testing.assert_allclose(density.sum(axis=(1, 2)) / 64, [2.0] * B, rtol=1e-14)   # cells of area 1/64
    np.testing.assert_allclose(density[2], v[2] * 2.0 / (v[2].sum() / 64), rtol=1e-14)
    assert [type(g) for g in batch] == [sdot.PolynomialGrid] * B


@pytest.mark.parametrize("values, kwargs, error, match", [
    (np.ones(4), {}, ValueError, "leading batch axis"),
    (np.stack([np.ones((2, 2)), np.zeros((2, 2))]), {}, ValueError, "all zero.*batch item"),
    (-np.ones((2, 2, 2)), {}, ValueError, ">= 0"),
    (np.ones((2, 2, 2)), {"domain": (np.zeros((3, 2)), np.ones((3, 2)))}, ValueError, r"\(b, d\) with b=2"),
    (np.ones((2, 2, 2)), {"domain": (np.zeros((2, 2)), np.array([[1.0, 1.0], [1.0, 0.0]]))}, ValueError,
     "greater than the lower"),
    (np.ones((2, 2, 2)), {"mass": -1.0}, ValueError, "mass"),
])
def test_invalid_batches_of_grids(values, kwargs, error, match):
    with pytest.raises(error, match=match):
        sdot.BatchOfPolynomialGrid(values, **kwargs)


# ------------------------------------------------------------------ solves
def test_batches_on_both_sides_equal_the_loop(eager_backend):
    """Item i of a batched plan is the plan of source i and target i: every field, the shapes,
    the status fields of shape (b,), a diagram per item."""
    x, w, v = problem(small=not eager_backend.host)
    n = x.shape[1]
    source = sdot.BatchOfSumOfWeightedDiracs(eager_backend.asarray(x), eager_backend.asarray(w))
    target = sdot.BatchOfPolynomialGrid(eager_backend.asarray(v))
    plan = sdot.optimal_transport_plan(source, target)
    assert tuple(plan.barycenters.shape) == (B, n, 2) and tuple(plan.distance.shape) == (B,)
    for name in ("cell_masses", "brenier_potential"):
        assert tuple(getattr(plan, name).shape) == (B, n)
    for name in ("converged", "iterations", "residual", "status"):
        assert tuple(getattr(plan, name).shape) == (B,)
    assert isinstance(plan.power_diagram, tuple) and len(plan.power_diagram) == B
    assert num(eager_backend, plan.converged).all() and (num(eager_backend, plan.status) == 0).all()
    for i in range(B):
        want = single(x[i], v[i], w[i])
        for name in ("distance", "barycenters", "cell_masses"):
            np.testing.assert_allclose(num(eager_backend, getattr(plan, name))[i], getattr(want, name),
                                       rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(num(eager_backend, plan.power_diagram[i].weights),
                                   num(eager_backend, plan.brenier_potential)[i])


def test_one_side_broadcasts_against_a_batch(eager_backend):
    """One source against a batch of targets, and a batch of sources against one target: (b,)
    by ``distances``, ``distance`` and ``barycenters``."""
    x, _, v = problem(1, small=not eager_backend.host)
    one_source, sources = sdot.SumOfDiracs(eager_backend.asarray(x[0])), sdot.BatchOfSumOfDiracs(eager_backend.asarray(x))
    one_target, targets = sdot.Grid(eager_backend.asarray(v[0])), sdot.BatchOfPolynomialGrid(eager_backend.asarray(v))
    to_targets = num(eager_backend, sdot.distances(one_source, targets))
    from_sources = num(eager_backend, sdot.barycenters(sources, one_target))
    assert to_targets.shape == (B,) and from_sources.shape == x.shape
    for i in range(B):
        assert to_targets[i] == pytest.approx(float(single(x[0], v[i]).distance), rel=1e-8)
        np.testing.assert_allclose(from_sources[i], single(x[i], v[0]).barycenters, rtol=1e-8, atol=1e-10)
    if not eager_backend.native:                # distance is the same function as distances
        np.testing.assert_array_equal(sdot.distance(one_source, targets), to_targets)


def test_one_dirac_per_item_domain_closed_form(eager_backend):
    """One Dirac y on the uniform box [lo, hi] (a domain per item): W2^2 = |y - c|^2 +
    sum_k (hi_k - lo_k)^2 / 12 (c the centre), the barycentre is c."""
    lo = np.array([[0.0, 0.0], [-1.0, 0.5], [2.0, -3.0]])
    hi = np.array([[1.0, 1.0], [1.0, 1.0], [2.5, 1.0]])
    y = np.array([[[0.3, 0.4]], [[0.0, 0.0]], [[2.2, -1.0]]])
    targets = sdot.BatchOfPolynomialGrid(eager_backend.asarray(np.ones((3, 2, 2))),
                                         domain=(eager_backend.asarray(lo), eager_backend.asarray(hi)))
    assert "per item" in repr(targets) and tuple(targets.domain[0].shape) == (3, 2)
    plan = sdot.optimal_transport_plan(sdot.BatchOfSumOfDiracs(eager_backend.asarray(y)), targets)
    centre = (lo + hi) / 2
    want = ((y[:, 0] - centre) ** 2).sum(axis=1) + ((hi - lo) ** 2).sum(axis=1) / 12
    np.testing.assert_allclose(num(eager_backend, plan.distance), want, rtol=1e-13)
    np.testing.assert_allclose(num(eager_backend, plan.barycenters)[:, 0], centre, rtol=1e-13, atol=1e-15)


def test_errors_name_the_function_called():
    x, _, v = problem()
    sources, targets = sdot.BatchOfSumOfDiracs(x[:2]), sdot.BatchOfPolynomialGrid(v)
    for fn in (sdot.distance, sdot.distances, sdot.barycenters, sdot.optimal_transport_plan):
        with pytest.raises(ValueError, match=rf"^{fn.__name__}: the batch of sources has 2 items and the batch "
                                             r"of targets 3"):
            fn(sources, targets)
        with pytest.raises(TypeError, match=rf"^{fn.__name__}: target must be a grid"):
            fn(sources, v)
        with pytest.raises(TypeError, match=rf"^{fn.__name__}: source must be a sum of Diracs"):
            fn(x, targets)
        if fn is not sdot.optimal_transport_plan:
            with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) got unexpected keyword arguments \['tolerance'\]"):
                fn(sources, targets[0], tolerance=1e-3)
    with pytest.raises(TypeError, match="distances takes a batch"):
        sdot.distances(sdot.SumOfDiracs(x[0]), sdot.Grid(v[0]))


def test_failed_items_are_named_and_the_partial_plan_kept():
    x, _, v = problem(2)
    sources, targets = sdot.BatchOfSumOfDiracs(x), sdot.BatchOfPolynomialGrid(v)
    with pytest.raises(sdot.OtNotConverged, match=r"^barycenters: 3 of the 3 items of the batch did not converge "
                                                  r"\(items \[0, 1, 2\]\); item 0: no convergence") as failure:
        sdot.barycenters(sources, targets, max_iter=1)
    assert failure.value.plan.converged.shape == (B,) and not failure.value.plan.converged.any()
    plan = sdot.optimal_transport_plan(sources, targets, max_iter=1, raise_on_failure=False)
    assert plan.barycenters.shape == (B, N, 2) and not plan.converged.any()
    with pytest.raises(TypeError, match="one source and one target"):
        plan.vjp(distance=np.ones(B))


# ------------------------------------------------------------------ gradients
def weighted_sum(xp, d):
    """sum_i (i + 1) d_i: distinguishes the items in the gradient."""
    return xp.sum(d * xp.asarray([1.0, 2.0, 3.0], dtype=d.dtype))


def test_torch_gradients_are_the_items_gradients():
    """d/d(positions, weights, values, domain per item) of sum_i c_i W_i over a batch == c_i
    times the gradient of item i's W2^2 alone; one source broadcast against a batch of
    targets sums the items' gradients."""
    torch = pytest.importorskip("torch")
    x, w, v = problem(3)
    lo, hi = np.array([[0.0, 0.0], [-0.1, 0.0], [0.0, 0.05]]), np.array([[1.0, 1.0], [1.0, 1.1], [0.95, 1.0]])
    xb, wb, vb, lob, hib = (torch.tensor(a, requires_grad=True) for a in (x, w, v, lo, hi))
    d = sdot.distance(sdot.BatchOfSumOfWeightedDiracs(xb, wb), sdot.BatchOfPolynomialGrid(vb, domain=(lob, hib)))
    weighted_sum(torch, d).backward()
    for i in range(B):
        xi, wi, vi, loi, hii = (torch.tensor(a[i], requires_grad=True) for a in (x, w, v, lo, hi))
        sdot.distance(sdot.SumOfWeightedDiracs(xi, wi), sdot.Grid(vi, domain=(loi, hii))).backward()
        for got, want in ((xb, xi), (wb, wi), (vb, vi), (lob, loi), (hib, hii)):
            np.testing.assert_allclose(got.grad[i].numpy(), (i + 1) * want.grad.numpy(), rtol=1e-9, atol=1e-12)
    shared = torch.tensor(x[0], requires_grad=True)
    weighted_sum(torch, sdot.distance(sdot.SumOfDiracs(shared), sdot.BatchOfPolynomialGrid(torch.tensor(v)))).backward()
    want = sum((i + 1) * single(x[0], v[i]).vjp(distance=1.0)["positions"] for i in range(B))
    np.testing.assert_allclose(shared.grad.numpy(), want, rtol=1e-9, atol=1e-12)


def test_jax_gradients_are_the_items_gradients():
    """As for torch, with ``jax.grad`` (eager: the items loop on the host)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x, w, v = map(jnp.asarray, problem(4))

    def batched(x, w, v):
        return weighted_sum(jnp, sdot.distance(sdot.BatchOfSumOfWeightedDiracs(x, w), sdot.BatchOfPolynomialGrid(v)))

    def item(x, w, v):
        return sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(v))
    grads = jax.grad(batched, argnums=(0, 1, 2))(x, w, v)
    for i in range(B):
        for got, want in zip(grads, jax.grad(item, argnums=(0, 1, 2))(x[i], w[i], v[i])):
            np.testing.assert_allclose(got[i], (i + 1) * want, rtol=1e-9, atol=1e-12)


def test_jax_jit_batches_are_a_vmap_of_the_items():
    """Under ``jax.jit`` (one ``jax.vmap`` of the solve; the targets' shared domain is not
    mapped): the plan of a batch and the gradients of its distances equal the eager items'."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x, w, v = map(jnp.asarray, problem(5))
    domain = (jnp.asarray([0.0, 0.0]), jnp.asarray([1.0, 1.0]))

    def loss(x, w, v):
        plan = sdot.optimal_transport_plan(sdot.BatchOfSumOfWeightedDiracs(x, w),
                                           sdot.BatchOfPolynomialGrid(v, domain=domain))
        return weighted_sum(jnp, plan.distance), plan

    (_, plan), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(x, w, v)
    assert tuple(plan.converged.shape) == (B,) and bool(plan.converged.all())
    assert len(plan.power_diagram) == B and isinstance(plan.power_diagram[0], sdot.PowerDiagram)
    for i in range(B):
        want = single(np.asarray(x[i]), np.asarray(v[i]), np.asarray(w[i]))
        np.testing.assert_allclose(plan.distance[i], want.distance, rtol=1e-8)
        np.testing.assert_allclose(plan.barycenters[i], want.barycenters, rtol=1e-8, atol=1e-10)
        eager = jax.grad(lambda x, w, v: sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(v)),
                         argnums=(0, 1, 2))(x[i], w[i], v[i])
        for got, ref in zip(grads, eager):
            np.testing.assert_allclose(got[i], (i + 1) * ref, rtol=1e-7, atol=1e-9)


def test_jax_vmap_over_a_batch_of_grids_maps_its_items():
    """A batch of grids mapped by the user's ``jax.vmap`` is one grid per call (no solve)."""
    jax = pytest.importorskip("jax")
    _, _, v = problem()
    batch = sdot.BatchOfPolynomialGrid(jax.numpy.asarray(v))
    leaves, tree = jax.tree_util.tree_flatten(batch)
    assert repr(jax.tree_util.tree_unflatten(tree, leaves)) == repr(batch)
    seen = []
    density = jax.vmap(lambda g: seen.append(g.batched) or g.density)(batch)
    assert seen == [False]
    np.testing.assert_allclose(density, batch.density, rtol=1e-14)


def test_batch_of_spline_grids_is_its_items_and_differentiates(eager_backend):
    """``BatchOfSplineGrid`` against a batch of sources: item i is the solve of source i and
    ``SplineGrid(values[i])`` (each its exact Bernstein grid), on every eager backend; with
    torch, the gradient with respect to the control values is the items'."""
    x, _, v = problem(5, small=True)
    v = v[:, :3, :4]                                         # 3 x 4 control values per item
    source = sdot.BatchOfSumOfDiracs(eager_backend.asarray(x))
    batch = sdot.BatchOfSplineGrid(eager_backend.asarray(v), continuity=1)
    assert isinstance(batch[1], sdot.SplineGrid) and batch[1].degree == 2
    got = num(eager_backend, sdot.distance(source, batch))
    saved, sdot.driver.framework = sdot.driver.framework, "numpy"
    try:
        want = [float(sdot.distance(sdot.SumOfDiracs(x[i]), sdot.SplineGrid(v[i], continuity=1)))
                for i in range(B)]
    finally:
        sdot.driver.framework = saved
    np.testing.assert_allclose(got, want, rtol=1e-9)
    if eager_backend.autograd:
        import torch

        vt = torch.tensor(v, requires_grad=True)
        (g,) = torch.autograd.grad(sdot.distance(sdot.BatchOfSumOfDiracs(torch.tensor(x)),
                                                 sdot.BatchOfSplineGrid(vt)).sum(), vt)
        for i in range(B):
            vi = torch.tensor(v[i], requires_grad=True)
            (gi,) = torch.autograd.grad(sdot.distance(sdot.SumOfDiracs(torch.tensor(x[i])), sdot.SplineGrid(vi)), vi)
            torch.testing.assert_close(g[i], gi, rtol=1e-9, atol=1e-12)
