"""The damping rules of a Newton step (:mod:`sdot._core.damping`), shared by the single-process,
traced, partial-transport and distributed solves: worked values, on every backend (under
``jax.jit`` too) and on the Python floats of the distributed client."""
import dataclasses

import numpy as np
import pytest

from sdot._core import damping, options

OPTIONS = options.DEFAULT


def _rules(xp, first, hidden_at, t, stalls, ok, dim):
    """The rules' values at one state (0-d arrays of ``xp``)."""
    return (damping.first_trial(xp, first, hidden_at, dim, OPTIONS), damping.next_first(xp, t, first, OPTIONS),
            damping.stalls_after(xp, ok, t, stalls, OPTIONS))


@pytest.mark.parametrize("dim", [2, 3])
def test_first_trial_next_first_and_stalls(backend, dim):
    """The first trial is ``hiding_margin`` (0.8) of the hiding bound in 2D and the largest
    ``first * 0.7^k`` below it in 3D; after a step damped below its first trial the next one
    grows by 1.5 (else by 4, at most 1); a step below ``stall_step`` counts as a stall."""
    xp = backend.xp
    a = lambda v: backend.asarray(v)        # noqa: E731
    got = backend.run(lambda f, h, t: _rules(xp, f, h, t, xp.asarray(1, device=backend.device), t > 0.5, dim), a(1.0), a(0.3), a(0.2))
    first, grown, stalls = (float(backend.to_numpy(g)) for g in got)
    assert first == pytest.approx(0.24 if dim == 2 else 0.7 ** 4, rel=1e-12)       # 0.7^4 = 0.2401 < 0.3 < 0.343
    assert grown == pytest.approx(1.5 * 0.2, rel=1e-12)
    assert stalls == 2
    got = backend.run(lambda f, h, t: _rules(xp, f, h, t, xp.asarray(2, device=backend.device), t > 0.0, dim), a(0.1), a(np.inf), a(0.1))
    first, grown, stalls = (float(backend.to_numpy(g)) for g in got)
    assert (first, stalls) == (pytest.approx(0.1, rel=1e-12), 0)
    assert grown == pytest.approx(0.4, rel=1e-12)


def test_on_python_floats_as_the_distributed_client_takes_them():
    """The client of the distributed solve holds Python floats: the same values with ``xp = numpy``."""
    assert float(damping.first_trial(np, np.float64(1.0), 0.3, 2, OPTIONS)) == pytest.approx(0.24)
    assert float(damping.next_first(np, 0.5, 1.0, OPTIONS)) == 0.75
    assert float(damping.next_first(np, 1.0, 1.0, OPTIONS)) == 1.0
    assert int(damping.stalls_after(np, False, 0.0, 1, OPTIONS)) == 2
    assert float(damping.mass_floor(np, 0.4, 0.1, True)) == 0.05
    assert damping.accepted(True, 0.06, 0.05, 0.7, 1.0, 0.5) and not damping.accepted(True, 0.06, 0.05, 0.8, 1.0, 0.5)
    assert not damping.accepted(False, 0.06, 0.05, 0.1, 1.0, 0.5) and not damping.accepted(True, 0.04, 0.05, 0.1, 1.0, 0.5)
    assert damping.more_trials(2.0 ** -29, OPTIONS) and not damping.more_trials(2.0 ** -30, OPTIONS)
    assert damping.stopped(3, OPTIONS) and not damping.stopped(2, OPTIONS)
    assert not damping.stopped(3, dataclasses.replace(OPTIONS, stalls=4))


def test_eager_backtracking_tries_down_to_the_shortest_step():
    """The eager loop of partial transport and of the distributed client: trials at ``t``,
    ``0.7 t``, ... until one is accepted, or down to the last above ``min_step`` (2^-30)."""
    tried = []

    def accept_below(bound):
        return lambda t: (tried.append(t) or len(tried), t < bound)
    t, result, ok = damping.backtracking(1.0, accept_below(0.6), OPTIONS)
    assert ok and t == pytest.approx(0.49) and result == 3 and tried == pytest.approx([1.0, 0.7, 0.49])
    tried.clear()
    t, result, ok = damping.backtracking(1.0, accept_below(0.0), OPTIONS)
    assert not ok and result == len(tried) == 59 and 2.0 ** -30 < t <= 2.0 ** -30 / 0.7
