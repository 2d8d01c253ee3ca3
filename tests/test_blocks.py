"""Eager NumPy and torch run the row-wise kernels (clipping, kinetic update, flip
pairs, local cutters, areas, integrals, Newton matrix, hiding step) in blocks of
``host.threads.settings().block`` rows, to bound their memory: each must give the
same result whatever the block size. (A whole solve would not show a wrong block: the
repair heals the cells.)"""
import numpy as np
import pytest

from sdot._core import newton_matrix, options, planar, row_blocks
from sdot._host import threads as host_threads
from sdot._core.planar import contour, hiding, integrate, kinetic, polygons, repair


def kernels(xp, b):
    """Every blocked kernel on a diagram at weights ``psi1`` updated from one at ``psi0``."""
    rng = np.random.default_rng(3)
    n = 300
    seeds, psi0, psi1 = b.asarray(rng.random((n, 2))), b.asarray(np.zeros(n)), b.asarray(3e-3 * rng.random(n))
    lo, hi = b.asarray([0.0, 0.0]), b.asarray([1.0, 1.0])
    active = xp.ones((n,), dtype=xp.bool)
    before = planar.power_cells(xp, seeds, psi0, active, lo, hi)
    moved, ok, flipped = kinetic._updated(xp, seeds, psi1, active, lo, hi, before)
    rows = xp.arange(n, dtype=xp.int64)
    table = polygons.neighbours(xp, before, 10)
    clipped = polygons.clip_by(xp, seeds, psi1, active, polygons.box_cells(xp, seeds, lo, hi, active, 16), rows, table)
    xs = (np.arange(8) + 0.5) / 8
    image = b.asarray(np.exp(-((xs[:, None] - 0.3) ** 2 + (xs[None, :] - 0.6) ** 2) / 0.05))
    moments, facet = integrate.cell_integrals(xp, seeds, before, image, lo, hi)
    uniform_moments, uniform_facet = integrate.cell_integrals(xp, seeds, moved, b.asarray(np.full((1, 1), 1.3)),
                                                              lo, hi)
    _, cols, weights, diag, _ = newton_matrix._laplacian(xp, seeds, before, facet, active, moments[:, 0],
                                                  options.DEFAULT.regularisation)
    return dict(cols=cols, weights=weights, diag=diag,
                hiding=hiding.hiding_step(xp, seeds, psi0, psi1 - psi0, active, before),
                vertices=moved.vertices, ok=ok, flipped=flipped,
                flips=kinetic.flip_partners(xp, before.labels, before.count, flipped, 4),
                cutters=repair.local_cutters(xp, seeds, psi1, active, moved, rows, table),
                clipped=clipped.vertices, count=clipped.count, moments=moments, facet=facet,
                uniform_moments=uniform_moments, uniform_facet=uniform_facet,
                area=polygons.area_excess(xp, moved, lo, hi)[0], table=table,
                degree=xp.asarray(polygons.max_degree(xp, moved)),
                around=polygons.around(xp, before, xp.asarray(rng.random(n) < 0.2)))


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_blocked_kernels_match_whole(name):
    from conftest import Backend

    b = Backend(name)
    whole = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    assert whole["flipped"].any() and not whole["ok"].all() and (whole["cutters"] >= 0).any()
    assert np.isfinite(whole["hiding"]) and (whole["weights"] > 0).any()
    with host_threads.host_settings(block=41, min_block=1):     # 8 blocks of 38 rows, the last one 34
        blocked = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    for k in whole:
        np.testing.assert_array_equal(blocked[k], whole[k], err_msg=k)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_narrow_pass_matches_all_slots(name, monkeypatch, array_kernels):
    """Eagerly the kernels over vertex slots run on the first ``settings().narrow`` slots
    of every row, then on all slots of the rows with more vertices (``row_blocks.slotwise``):
    the same result as on all slots of every row."""
    from conftest import Backend

    b = Backend(name)
    calls = []
    slotwise = row_blocks.slotwise
    monkeypatch.setattr(row_blocks, "slotwise", lambda xp, fn, count, *a: calls.append(
        int(b.xp.sum(count > host_threads.settings().narrow))) or slotwise(xp, fn, count, *a))
    narrow = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    assert len(calls) >= 6 and 0 < max(calls) < 30            # both passes ran
    with host_threads.host_settings(narrow=64):              # every cell fits: one pass on all slots
        whole = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    for k in whole:
        np.testing.assert_array_equal(narrow[k], whole[k], err_msg=k)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_kernel_on_no_rows_runs_once(threads):
    """No rows (an empty selection of cells to repair): the kernel runs once on them
    (a division by zero blocks before)."""
    calls = []
    with host_threads.host_settings(threads=threads):
        out = row_blocks.blockwise(np, lambda a: calls.append(a.shape) or 2 * a, np.zeros((0, 3)))
    assert out.shape == (0, 3) and calls == [(0, 3)]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 2047, 5000, 10000, 16384, 16385, 100000, 10 ** 6 + 7])
def test_blocks_share_the_rows_evenly_between_threads(n, threads):
    """At most ``block`` rows per block and at least ``min_block`` unless one block holds
    all; with rows for every thread, a multiple of ``threads`` blocks of equal size (the
    last one short by less than a row per block)."""
    size = host_threads.block_rows(n, threads)
    blocks = -(-n // size)
    assert size <= host_threads.settings().block or blocks == 1
    assert size >= host_threads.settings().min_block or blocks == 1
    if n >= threads * host_threads.settings().min_block:
        assert blocks % threads == 0
        assert n - (blocks - 1) * size > size - blocks


def test_ten_thousand_rows_use_both_threads():
    """The case this rule is for: a 1e4-seed solve's kernels ran as one block on one core."""
    assert host_threads.block_rows(10000, 2) == 5000


def test_per_seed_and_per_pixel_data_are_computed_once_not_per_block(monkeypatch, array_kernels):
    """A kernel's work is proportional to its block: the planes of every seed (local
    cutters) and the prefix tables of the image (integrals) are computed once per call,
    outside the blocks. Computed per block, they made a solve's repair quadratic
    (measured at 1e6 seeds: a sweep of local cutters 12.6 s, against 3.3 s)."""
    import array_api_compat.numpy as xp

    from conftest import Backend

    calls = {"planes": 0, "tables": 0}

    def counted(fn, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(repair, "_planes", counted(repair._planes, "planes"))
    monkeypatch.setattr(contour, "prefix_tables", counted(contour.prefix_tables, "tables"))
    with host_threads.host_settings(block=41, min_block=1):     # 8 blocks
        kernels(xp, Backend("numpy"))                              # one call of each
    assert calls == {"planes": 1, "tables": 1}


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_background_work_runs_on_a_thread_of_its_own_on_numpy(name):
    """``in_background`` starts an eager NumPy computation on a thread of its own, whose
    blocks run there (the worker threads stay free for the caller), and gives the same
    result; on torch, or with one thread, it computes at once on the caller's thread."""
    import threading

    from conftest import Backend

    b = Backend(name)
    x = b.asarray(np.arange(40000.0).reshape(20000, 2))
    seen = []

    def double(a):
        seen.append(threading.current_thread().name)
        return 2 * a
    for threads in (2, 1):
        seen.clear()
        with host_threads.host_settings(threads=threads):
            handle = row_blocks.in_background(lambda: row_blocks.blockwise(b.xp, double, x), x)
            out = row_blocks.background_result(handle)
        np.testing.assert_array_equal(b.to_numpy(out), 2 * b.to_numpy(x))
        background = name == "numpy" and threads == 2
        assert (handle is not out) == background
        assert len(seen) >= 2                                  # in blocks
        if background:
            assert set(seen) == {seen[0]} and seen[0].startswith("sdot-background")
        else:
            assert not any(s.startswith("sdot-background") for s in seen)


def test_the_solve_computes_the_hiding_fans_during_the_linear_solve(sdot_driver, monkeypatch):
    """Eagerly on NumPy the Newton step computes the hiding step's fans (at the first step
    and after damped ones) on the background thread while the host solves for the
    direction; the solve is the same as with everything on the caller's threads (one
    worker thread: no background)."""
    import threading

    import sdot

    sdot_driver.framework = "numpy"
    fans, names = planar.fans, []
    monkeypatch.setattr(planar, "fans", lambda *a: names.append(threading.current_thread().name) or fans(*a))
    rng = np.random.default_rng(2)
    x = rng.random((3000, 2))
    with host_threads.host_settings(threads=2):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(np.ones((4, 4))), tol=1e-9)
    assert 1 <= len(names) < int(plan.iterations) and int(plan.iterations) >= 3
    assert all(n.startswith("sdot-background") for n in names)
    names.clear()
    with host_threads.host_settings(threads=1):
        alone = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(np.ones((4, 4))), tol=1e-9)
    assert names and not any(n.startswith("sdot-background") for n in names)
    assert int(alone.iterations) == int(plan.iterations)
    np.testing.assert_array_equal(alone.brenier_potential, plan.brenier_potential)
