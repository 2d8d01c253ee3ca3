"""Row-selection primitives of ``_compat`` on every backend, against their meaning
written out in NumPy (JAX, whose sorts are slow on the CPU, takes other code paths:
prefix sums and a scatter)."""
import numpy as np
import pytest

from sdot._core import _compat


@pytest.mark.parametrize("size", [1, 37, 300, 1000])
def test_select_puts_the_true_entries_first_in_order(backend, size):
    mask = np.random.default_rng(1).random(1000) < 0.3
    expected = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])[:size]
    xp = backend.xp
    order, valid = backend.run(lambda m: _compat.select(xp, m, size), backend.asarray(mask, bool))
    np.testing.assert_array_equal(backend.to_numpy(order), expected)
    np.testing.assert_array_equal(backend.to_numpy(valid), mask[expected])


@pytest.mark.parametrize("width", [3, 12, 16])
def test_first_columns_keeps_the_kept_entries_of_each_row_in_order(backend, width):
    rng = np.random.default_rng(2)
    values, keep = rng.integers(0, 1000, (50, 12)), rng.random((50, 12)) < 0.5
    keep[0], keep[1] = False, True                      # a row with none, a row with all
    expected = np.full((50, width), -1)
    for r in range(50):
        kept = values[r][keep[r]][:width]
        expected[r, :kept.size] = kept
    xp = backend.xp
    out = backend.run(lambda k, v: _compat.first_columns(xp, k, v, width, -1),
                      backend.asarray(keep, bool), backend.asarray(values, np.int64))
    np.testing.assert_array_equal(backend.to_numpy(out), expected)
