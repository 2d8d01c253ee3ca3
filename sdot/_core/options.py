"""The tuning values of a solve (:func:`.newton.solve`), as one value.

:class:`NewtonOptions` holds the damped Newton method's, the power diagrams'
(:class:`DiagramOptions`) and the linear solver's (its own options, see
:mod:`.linear_solvers`). All are frozen, hence hashable: the jitted JAX solve takes them
as a static argument. The solver uses :data:`DEFAULT`; a variant is
``dataclasses.replace(DEFAULT, hiding_margin=...)`` or
``dataclasses.replace(DEFAULT, diagram=dataclasses.replace(DIAGRAM, rebuild_share=...))``,
passed explicitly.
"""
from __future__ import annotations

import dataclasses

from .linear_solvers import FactorPCGOptions, JacobiPCGOptions


@dataclasses.dataclass(frozen=True)
class CellOptions:
    """How the compiled host kernels (:mod:`sdot._host.compiled.cells3d`, ``cells2d``) find
    the cells: the thresholds between moving the previous cells, clipping them by their
    neighbours' neighbours (the ring) and by the k-d tree. They change the time, not the cells."""

    #: Without a previous diagram, from this many seeds of equal weights (the Voronoi start) each
    #: 3D cell is first clipped by its ``nearest`` nearest seeds, then by the tree (at 1e5 seeds:
    #: 2.4-3.3 s -> 2.0-2.2 s with scipy's cKDTree to find them, which took 0.25 s of it; 16,
    #: 20 or 26 nearest: the same time).
    nearest_from: int = 5000
    nearest: int = 12
    #: Largest share of invalid moved cells that the ring reclips with their neighbours alone;
    #: beyond, every cell by the ring.
    ring_share: float = 0.1
    #: Cells moved first as a sample in 3D (every ``n // probe``-th): beyond twice
    #: ``ring_share`` of them invalid, the ring clips every cell without moving the others (the
    #: first Newton trials of a 3D box at 1e5 seeds: 47 to 86% invalid, 0.15 s a trial to move
    #: them all).
    probe: int = 1000
    #: Beyond this share of invalid moved 2D cells, the tree clips every cell (not the ring).
    ring_all: float = 0.5


@dataclasses.dataclass(frozen=True)
class DiagramOptions:
    """Thresholds and sizes of the power diagrams (:func:`.planar.power_cells`): the
    first candidates, the kinetic update, the repair, the agreement check and the tiles of
    the regular triangulation. They decide how the cells are found; the repair's area
    certificate decides what they are (within ``repair_rounds`` rounds)."""

    #: Nearest seeds taken as candidates of a diagram without a previous one (without a host;
    #: with one, eagerly, the Delaunay neighbours): 20 was the fastest of 12 to 32 under jit.
    first_candidates: int = 20
    #: The same in 3D (their cells' radius of security is checked, and failing cells take
    #: twice as many).
    first_candidates_3d: int = 32
    #: Share of invalid cells above which an eager update rebuilds the cells from the regular
    #: triangulation: at 1e5 seeds a rebuild costs about as much as reclipping 15% of them.
    rebuild_share: float = 0.15
    #: Share of invalid moved cells in 3D up to which an eager update reclips only them and
    #: their neighbours, by their neighbours' neighbours (above it, Qhull rebuilds every cell).
    local_share_3d: float = 0.05
    #: Seeds a cell may gain by edge flips in one update (more are left to the repair).
    flip_width: int = 4
    #: Flip pairs per cell kept under tracing, where shapes are static (more are left to the
    #: repair; a Newton step's update has 0.2 to 0.4 per cell at 1e5 seeds).
    flip_pairs_traced: float = 0.5
    #: Neighbours per cell in the table of the repair's local test (enough for most cells).
    table_width: int = 10
    #: Neighbours per cell of the table under tracing, where its width is static.
    table_traced: int = 12
    #: Largest number of repair rounds.
    repair_rounds: int = 32
    #: Repair rounds by local tests, after which a round tests the vertices of its cells
    #: exactly (a local cutter walks one neighbour a round: 400 Diracs on the sides of the
    #: square, whose nearest seeds lie on their own side, took 96 local rounds).
    local_rounds: int = 8
    #: Cells of a mask from which the agreement check runs eagerly (on fewer it costs more
    #: than the local tests it saves, and the mask is kept as it is).
    agreement_from: int = 2048
    #: Active points per tile, at most about, of the regular triangulation on the host
    #: (tiles run on the threads, and Qhull's time per point grows with the points).
    tile_points: int = 10_000
    #: Active seeds from which the 3D regular triangulation is read in slabs on the threads (one
    #: per thread; box3d solves at 1e4 seeds 2.57-3.03 s whole, 2.36-2.75 s in slabs, 3 runs
    #: each; the same at 5e3), and each slab's depth beyond its sides, in mean spacings.
    slabs_from_3d: int = 8_000
    slab_overlap: float = 3.0
    #: On a periodic domain (:mod:`.periodic`), the first images of a diagram, 2D and 3D: those
    #: within this many mean spacings of the Diracs beyond the box (uniform densities: the drift
    #: of the weights over a 2D domain brings cells of images 5 spacings beyond it at 1e5 Diracs,
    #: 3D cells stay within 2.5 at 1e4 and 1e5); huge: every image within half a period.
    periodic_margin: tuple = (6.0, 2.5)
    #: ... and when an image left out may own a point, the images taken are those within this
    #: many times its distance beyond the box (within the bound, when the test only bounds it).
    periodic_growth: float = 1.5
    #: ... and the test of the images left out (:mod:`sdot._host.periodic_reach`): the images near a
    #: cell are searched in at most this many groups of weights (each with its own largest weight;
    #: a 2D box at 1e5: 16 groups 15-75 ms a test, 2 groups 4-13 ms), and where a cell's search
    #: would meet more than this many images on average, each image is tested by the descent instead.
    periodic_groups: int = 2
    periodic_pairs: int = 512
    #: How the compiled host kernels find the cells (2D and 3D): the thresholds between moving
    #: the previous cells, clipping them by their neighbours' neighbours and by the k-d tree.
    compiled: CellOptions = CellOptions()


#: The diagram options the solver uses.
DIAGRAM = DiagramOptions()


@dataclasses.dataclass(frozen=True)
class NewtonOptions:
    """Thresholds and factors of :func:`.newton.solve`: the Newton matrix, the damping,
    the linear solves, the start, the stages of the continuation, the lift and the stall
    test; the diagrams' options and the linear solver's."""

    #: Added to the Newton matrix's diagonal, times the mean diagonal (but at most a thousand
    #: times the row's own, :func:`.newton_matrix.regularised_diagonal`): fixes the constant null
    #: space of the Laplacian.
    regularisation: float = 1e-9
    #: The first damping trial of a step is ``min(1, growth * t)``, ``t`` that of the last step.
    growth: float = 4.0
    #: ... or ``min(1, damped_growth * t)`` if the last step had to be damped (damped steps
    #: stay damped for a while).
    damped_growth: float = 1.5
    #: The first trial is at most this share of the ``t`` that certainly hides a seed (cells
    #: go empty earlier than the fan test sees; 0.8 gave the fewest diagrams of 0.8 to 0.999).
    hiding_margin: float = 0.8
    #: Dimensions where the first trial is instead the largest of the backtracking's
    #: ``first * backtrack^k`` below that ``t``: the trials of plain backtracking, less those
    #: sure to be rejected. In 3D a trial moved to 0.8 of the bound changed the path, for
    #: better or worse (3e4 Diracs on a Gaussian: 6 -> 8 steps, 24 -> 40 s), and each of
    #: its diagrams costs seconds.
    hiding_on_the_backtracking: tuple = (3,)
    #: Factor of ``t`` after a rejected trial.
    backtrack: float = 0.7
    #: The shortest trial: a step whose next trial would be shorter takes none.
    min_step: float = 2.0 ** -30
    #: Relative residual of the linear solves away from the solution (inexact Newton, see
    #: :func:`.damping.linear_rtol`).
    forcing: float = 1e-2
    #: After a step damped below ``tiny_step`` (or none accepted), the forcing term is
    #: ``tiny_step_forcing`` times smaller for the next direction.
    tiny_step: float = 1e-3
    tiny_step_forcing: float = 1e-2
    #: The start is the Voronoi diagram if every cell holds this share of its target (the
    #: damped Newton method copes with it), else see :func:`.starts.initial_weights`.
    start_admissible: float = 1e-2
    #: A width of the continuation is taken when every cell holds this share of its target
    #: against the density blurred to it.
    admissible: float = 0.1
    #: The density itself is taken when every cell holds this share of its target against
    #: it; at the narrowest width, cells that hold less are lifted (:func:`.continuation.lifted`).
    final_admissible: float = 0.1
    #: The density itself is taken after a narrowing only if, besides, no cell holds more than
    #: this many times its target there: on a density that jumps (a disc of 1 on a background
    #: of 0.05), cells holding 3.4 times their targets after that jump kept every Newton step
    #: below t = 0.003 for 150 steps. (Checked at every width, it cost zero backgrounds
    #: stages: 160 drawn shapes, 3997 -> 4043 steps.)
    most_admissible: float = 3.0
    #: The first Newton step at the density itself (from the start, or after the continuation)
    #: that hides a seed before this ``t`` is not taken: the start goes through the continuation,
    #: and the continuation back to its last width, narrowed more slowly from there (such a disc,
    #: 5,000 Diracs: from the start, steps of t = 0.001 to 0.002 for 120 steps). Uniform and
    #: Gaussian densities, 1e4 to 1e6 Diracs, 2D and 3D: 0.18 to 0.9.
    hopeless_step: float = 0.05
    #: Passes of the lift (a raised cell takes its neighbours' mass: they may fall short in turn).
    lift_passes: int = 3
    #: Rounds of doubling of the raises per pass of the lift (2^18 spans the raises measured).
    lift_rounds: int = 18
    #: Bisections of the raises per pass of the lift.
    lift_bisections: int = 6
    #: At a width ``s > 0`` (of the domain's side) targets are raised to at least
    #: ``wide_floor * s^floor_power`` times their mean (and scaled back to the total): cells of
    #: tiny targets are crushed by their neighbours' moves at every narrowing of the blur.
    wide_floor: float = 1.0
    floor_power: float = 0.5
    #: Newton steps at a width > 0 run until every cell is within this relative error.
    stage_tol: float = 0.7
    #: The same after a return from the density itself (:func:`.newton.solve`), raised to
    #: the number of returns: separate pieces of the support whose cells' masses do not
    #: balance their targets are joined by the blur's tail only; stages solved loosely left
    #: 9 pieces with 200 Diracs unbalanced.
    tight_stage_tol: float = 0.1
    #: Returns to the last width of the blur at most.
    returns: int = 3
    #: Partial transport (:mod:`.partial`): the start's equal weight is about the smallest at which
    #: every cell cut by its ball holds this share of its target (or of its Voronoi cell's mass),
    #: found by this many bisections of its logarithm (each integrates the cut cells once).
    partial_start_share: float = 0.5
    partial_start_bisections: int = 5
    #: Partial transport whose Voronoi cells do not all hold this share of their targets (some
    #: hold no mass at all) starts from the balanced transport (50 Diracs in a cluster 1e-6 wide:
    #: the cells inside it held 1e-12 of their targets, the Newton steps that would grow them
    #: hid others, and the solve stalled at its start).
    partial_start_least: float = 1e-3
    #: That start: the balanced transport's cells (the target scaled to the source's mass,
    #: solved to ``partial_balanced_tol`` of the smallest target), with the balls ``w_i + c`` of
    #: the smallest ``c`` at which every cell holds ``partial_balanced_share`` of its target
    #: (bisected ``partial_balanced_bisections`` times). 3,000 Diracs over a square on black:
    #: a share of 0.5 took 56 steps, 0.1 took 44, 0.02 took 42.
    partial_balanced_tol: float = 1e-3
    partial_balanced_share: float = 0.1
    partial_balanced_bisections: int = 30
    #: Partial transport: a Newton step's first trial lowers no weight ``psi_i`` (a ball's squared
    #: radius) by more than this share of it (1e4 Diracs on the Gaussian image: 0.5 took 0.94 s,
    #: 0.75 0.70 s, 0.9 0.63 s, no limit 1.37 s).
    partial_shrink: float = 0.9
    #: Partial transport whose steps stall on a density with zero regions goes on over uniform
    #: backgrounds (:func:`.partial.background_levels`): this share of the density's mean value
    #: first, divided by ``partial_background_factor`` at each of ``partial_background_stages``
    #: stages, each solved to ``partial_stage_tol`` of the smallest target, then the density
    #: itself. Two squares on black, 800 Diracs uniform / 300 in a cluster: a first background of
    #: 1 took 212 / 38 steps in all, 0.1 took 104 / 104, 0.01 (2 stages) 60 / 224.
    partial_background: float = 1.0
    partial_background_factor: float = 10.0
    partial_background_stages: int = 4
    partial_stage_tol: float = 0.1
    #: The widest width of the continuation, in units of the longest side of the domain.
    widest: float = 1.0
    #: Widths narrower than this share of the longest side are not tried (the next one is
    #: the density itself).
    min_width: float = 1e-5
    #: Narrowing factor of the width first tried.
    first_ratio: float = 4.0
    #: Largest narrowing factor (after a stage, ``2 r - 1`` of the last one ``r``, at most this).
    max_ratio: float = 16.0
    #: Smallest narrowing factor.
    min_ratio: float = 1.2
    #: The narrowing tried after a refused one aims at this many times ``admissible`` for
    #: the poorest cell (:func:`.continuation.next_ratio`).
    aim: float = 1.5
    #: After a narrowing, the density itself is tried only at widths below this many mean
    #: spacings of the Diracs, or where the narrowing cost the poorest cell less than half its
    #: share (a density the blur hardly changes); elsewhere a cell beyond the support's edge
    #: holds nothing of it, and each try is a pass of integrals.
    zero_check: float = 2.0
    #: Margin of the similarity start in the support's box (a share of its sides).
    start_margin: float = 0.1
    #: Quantile of the Diracs' coordinates that bounds the box the similarity start moves
    #: (and ``1 -`` it).
    start_quantile: float = 0.02
    #: That box's largest reach from the median, in interquartile ranges (uniform Diracs: 2;
    #: one Dirac at 1e6 among 39, kept by the quantile, squeezed the others and stalled the solve).
    start_spread: float = 4.0
    #: Trials of the line search that balances separate pieces (:mod:`.balancing`) at most:
    #: bisections of the step along a direction as wide as the squared diameter.
    balance_bisections: int = 40
    #: Steps in a row without an accepted trial, or with one shorter than ``stall_step``,
    #: after which the solve stops.
    stalls: int = 3
    #: Accepted steps shorter than this count as stalled (one Dirac at 1e6: 290 steps damped
    #: to about 1e-9).
    stall_step: float = 1e-8
    #: The power diagrams' tuning.
    diagram: DiagramOptions = DIAGRAM
    #: The linear solver of the Newton steps, made once per solve by ``linear.solver()``
    #: (its state, such as kept factors, is that solve's): :class:`.linear_solvers.FactorPCGOptions`
    #: or :class:`.linear_solvers.JacobiPCGOptions`.
    linear: FactorPCGOptions | JacobiPCGOptions = FactorPCGOptions()


#: The options the solver uses.
DEFAULT = NewtonOptions()
