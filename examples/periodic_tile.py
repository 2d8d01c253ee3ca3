"""A blue-noise tile that tiles seamlessly: Lloyd's iteration on the torus.

The Diracs start at random in the unit square; each step moves every Dirac to the barycentre of
its Laguerre cell in the optimal transport to a density on the **torus**
(``metric=PeriodicMetric(Norm2(), [1, 1])``): a cell may wrap around a side, and its barycentre
comes back next to its Dirac. The points spread evenly across the sides too, so that copies of
the tile put side by side show no seam. The density here is a periodic pattern (denser on a
diagonal band that wraps around).

    python examples/periodic_tile.py --out docs/periodic.png
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

import sdot
from sdot.metrics import Norm2, PeriodicMetric


def band(size=64):
    """A periodic density on [0, 1]^2: 1 plus a band along the diagonal that wraps around."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")          # values[i, j] is the pixel (x_i, y_j)
    return 1.0 + 2.0 * np.cos(np.pi * (x + y)) ** 8


def torus_spacing(x):
    """The smallest distance on the torus between two of the points."""
    tiles = np.concatenate([x + [i, j] for i in (-1, 0, 1) for j in (-1, 0, 1)])
    d, _ = cKDTree(tiles).query(x, k=2)
    return d[:, 1].min()


def draw(values, plan, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(np.tile(values, (2, 2)).T, origin="lower", extent=(0, 2, 0, 2), cmap="Greys", vmin=0, vmax=6)
    from matplotlib.collections import LineCollection

    x = np.mod(np.asarray(plan.power_diagram.positions), 1.0)
    plan.power_diagram.plot(ax, points=False, colors="tab:blue", linewidths=0.8)    # the tile's cells, wrapped
    segments = ax.collections[-1].get_segments()
    for i, j in ((0, 0), (1, 0), (0, 1), (1, 1)):     # four copies of the tile: the cells run on across the seams
        if (i, j) != (0, 0):
            ax.add_collection(LineCollection([s + [i, j] for s in segments], colors="tab:blue", linewidths=0.8))
        ax.plot(x[:, 0] + i, x[:, 1] + j, ".", ms=3, color="tab:red")
    ax.axvline(1.0, color="tab:orange", ls="--", lw=1)
    ax.axhline(1.0, color="tab:orange", ls="--", lw=1)
    ax.set_xlim(0, 2)
    ax.set_ylim(0, 2)
    ax.set_title(f"{len(x)} Diracs, Lloyd's iteration on the torus: four copies of one tile\n"
                 "(dashed: the tile's sides; the cells run on across them)", fontsize=9)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"saved {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150, help="number of Diracs")
    parser.add_argument("--steps", type=int, default=20, help="Lloyd steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "periodic.png"),
                        help="where to write the picture (default: the temporary folder)")
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    torus = PeriodicMetric(Norm2(), [1.0, 1.0])
    values = band()
    x = np.random.default_rng(args.seed).random((args.n, 2))
    print(f"start: smallest distance {torus_spacing(x):.4f}")
    for step in range(args.steps):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(values), metric=torus)
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step}: W2^2 = {float(plan.distance):.6e}, smallest distance {torus_spacing(x):.4f}")
        x = np.mod(np.asarray(plan.barycenters), 1.0)        # the barycentres, folded onto the tile
    draw(values, plan, args.out)


if __name__ == "__main__":
    main()
