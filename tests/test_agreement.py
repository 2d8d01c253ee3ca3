"""Cells that disagree with their neighbours about a shared vertex
(``sdot._core.planar.agreement``), on every backend.

Ground truth: scipy's cells (``reference_cell`` of test_power_diagram), whose dual
triangles every cell shares, and the same diagram with one edge taken out by hand.
"""
import dataclasses

import numpy as np
import pytest

from sdot._core import planar
from sdot._core.planar import agreement
from sdot._core.options import DIAGRAM
from test_power_diagram import N, reference_cell
from test_repair import without_one_edge
from test_update import check_update_against_scipy

LO, HI = np.zeros(2), np.ones(2)
I, J = 33, 36                                   # cell 33 and its neighbour 36
#: The check on masks of any size (eagerly it leaves masks of fewer than
#: ``agreement_from`` cells as they are; see :func:`test_eagerly_a_small_mask_is_left_as_it_is`).
EVERY_MASK = dataclasses.replace(DIAGRAM, agreement_from=0)


def seeds_and_neighbours():
    seeds = np.random.default_rng(0).random((N, 2))
    ref = reference_cell(seeds, np.zeros(N), I)
    assert J in ref["facets"]
    return seeds, sorted(int(k) for k in ref["facets"] if k >= 0)


def unmatched_cells(backend, seeds, mask, edge_out=True, size=None, options=EVERY_MASK):
    """The cells :func:`agreement.unmatched` flags in the exact diagram of ``seeds`` at
    zero weights, or (``edge_out``) with cell I clipped by its neighbours but J, with the
    diagram ``options``."""
    xp = backend.xp
    _, near = seeds_and_neighbours()
    others = [k for k in near if k != J]

    def run(y, lo, hi, mask):
        if edge_out:
            _, _, cells = without_one_edge(xp, y, lo, hi, I, others, options)
        else:
            dev = backend.device
            cells = planar.power_cells(xp, y, xp.zeros((N,), dtype=y.dtype, device=dev),
                                       xp.ones((N,), dtype=xp.bool, device=dev), lo, hi, options=options)
        return agreement.unmatched(xp, cells, mask, size, options.agreement_from)

    mask = backend.xp.asarray(np.asarray(mask), device=backend.device)
    out = backend.run(run, *(backend.asarray(a) for a in (seeds, LO, HI)), mask)
    return set(np.flatnonzero(backend.to_numpy(out)).tolist())


def test_an_exact_diagram_agrees_everywhere(backend):
    seeds, _ = seeds_and_neighbours()
    assert unmatched_cells(backend, seeds, np.ones(N, bool), edge_out=False) == set()


def test_a_missing_edge_flags_both_of_its_cells_and_no_far_one(backend):
    """Cell I lacks its edge with J, which still has I: both are flagged, and nothing
    beyond I's neighbours (whose triangles with I and J changed). Checked from J alone,
    whose vertices I lacks, both are flagged too; from I alone nothing is (its own
    vertices are all in their neighbours: the check needs the cells around)."""
    seeds, near = seeds_and_neighbours()
    everywhere = unmatched_cells(backend, seeds, np.ones(N, bool))
    assert {I, J} <= everywhere <= {I} | set(near)
    assert unmatched_cells(backend, seeds, np.arange(N) == J) == {I, J}
    assert unmatched_cells(backend, seeds, np.arange(N) == I) == set()


def test_only_the_cells_of_the_mask_are_checked(backend):
    """Cells far from the missing edge find nothing; the flags are theirs and their
    neighbours' only."""
    seeds, near = seeds_and_neighbours()
    far = np.ones(N, bool)
    far[[I, J] + near] = False
    assert unmatched_cells(backend, seeds, far) == set()


def test_a_traced_check_of_a_share_keeps_the_cells_left_unchecked(backend):
    """With ``size`` 1 and two cells in the mask, the traced check tests the first (cell
    J: flags I and J) and leaves the far cell in the mask; eagerly both are checked."""
    seeds, near = seeds_and_neighbours()
    far = next(k for k in range(J + 1, N) if k not in near)
    mask = np.isin(np.arange(N), [J, far])
    got = unmatched_cells(backend, seeds, mask, size=1)
    assert got == ({I, J, far} if backend.static else {I, J})


def test_eagerly_a_small_mask_is_left_as_it_is(backend):
    """Below ``agreement_from`` cells the eager check costs more than the local tests it
    saves: the mask comes back unchanged (an exact diagram, every cell flagged).
    With static shapes (``jax.jit``) the check runs whatever the mask."""
    seeds, _ = seeds_and_neighbours()
    got = unmatched_cells(backend, seeds, np.ones(N, bool), edge_out=False,
                          options=dataclasses.replace(DIAGRAM, agreement_from=N + 1))
    assert got == (set() if backend.static else set(range(N)))


@pytest.mark.parametrize("flip_width", [4, 1])
def test_updates_repaired_with_the_check_match_scipy(backend, flip_width):
    """Kinetic updates with many flips (and with flip edges left out, which the repair
    must find), repaired with the check on every mask: certified, and scipy's cells."""
    check_update_against_scipy(backend, 0.02, dataclasses.replace(EVERY_MASK, rebuild_share=2.0,
                                                                  flip_width=flip_width))
