"""Eager NumPy and torch run the row-wise kernels (clipping, kinetic update, flip
pairs, local cutters, areas, integrals) in blocks of ``_compat.control.BLOCK`` rows, to bound their
memory: each must give the same result whatever the block size. (A whole solve
would not show a wrong block: the repair heals the cells.)"""
import numpy as np
import pytest

from sdot._core import _compat, geometry, integrate, kinetic, polygons, repair


def kernels(xp, b):
    """Every blocked kernel on a diagram at weights ``psi1`` updated from one at ``psi0``."""
    rng = np.random.default_rng(3)
    n = 300
    seeds, psi0, psi1 = b.asarray(rng.random((n, 2))), b.asarray(np.zeros(n)), b.asarray(3e-3 * rng.random(n))
    lo, hi = b.asarray([0.0, 0.0]), b.asarray([1.0, 1.0])
    active = xp.ones((n,), dtype=xp.bool)
    before = geometry.power_cells(xp, seeds, psi0, active, lo, hi)
    moved, ok, flipped = kinetic._updated(xp, seeds, psi1, active, lo, hi, before)
    rows = xp.arange(n, dtype=xp.int64)
    table = polygons.neighbours(xp, before, 10)
    clipped = polygons.clip_by(xp, seeds, psi1, active, polygons.box_cells(xp, seeds, lo, hi, active, 16), rows, table)
    xs = (np.arange(8) + 0.5) / 8
    image = b.asarray(np.exp(-((xs[:, None] - 0.3) ** 2 + (xs[None, :] - 0.6) ** 2) / 0.05))
    moments, facet = integrate.cell_integrals(xp, seeds, before, image, lo, hi)
    return dict(vertices=moved.vertices, ok=ok, flipped=flipped,
                flips=kinetic.flip_partners(xp, before.labels, before.count, flipped, 4),
                cutters=repair.local_cutters(xp, seeds, psi1, active, moved, rows, table),
                clipped=clipped.vertices, count=clipped.count, moments=moments, facet=facet,
                area=polygons.area_excess(xp, moved, lo, hi)[0])


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_blocked_kernels_match_whole(name, monkeypatch):
    from conftest import Backend

    b = Backend(name)
    whole = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    assert whole["flipped"].any() and not whole["ok"].all() and (whole["cutters"] >= 0).any()
    monkeypatch.setattr(_compat.control, "BLOCK", 41)     # 8 blocks of 38 rows, the last one 34
    monkeypatch.setattr(_compat.control, "MIN_BLOCK", 1)
    blocked = {k: b.to_numpy(v) for k, v in kernels(b.xp, b).items()}
    for k in whole:
        np.testing.assert_array_equal(blocked[k], whole[k], err_msg=k)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 2047, 5000, 10000, 16384, 16385, 100000, 10 ** 6 + 7])
def test_blocks_share_the_rows_evenly_between_threads(n, threads):
    """At most BLOCK rows per block, at least MIN_BLOCK unless one block holds all, and
    (work permitting) a multiple of ``threads`` blocks whose sizes differ by at most one
    block's remainder: 1e4 rows on 2 threads run as 2 blocks of 5000, not 1 of 1e4."""
    size = _compat.control._block_rows(n, threads)
    blocks = -(-n // size)
    assert size <= max(_compat.control.BLOCK, _compat.control.MIN_BLOCK)
    assert size >= _compat.control.MIN_BLOCK or blocks == 1
    if n >= threads * _compat.control.MIN_BLOCK:
        assert blocks % threads == 0 and n - (blocks - 1) * size > size - blocks
    if n > _compat.control.BLOCK:
        assert blocks > 1
    assert (n, threads, blocks) != (10000, 2, 1)
