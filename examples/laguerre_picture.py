"""The objects of sdot in one picture: Diracs, a density on a grid, Laguerre cells.

Solves the optimal transport from ~40 Diracs to a small grey image and draws the image,
the Laguerre cells of the optimal weights (each holds the mass of its Dirac), the Diracs
(red) and the barycentre of each cell (blue), joined to its Dirac.

    python examples/laguerre_picture.py --out docs/laguerre.png
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import sdot


def image(size=16):
    """A small grey-level image on [0, 1]^2: a bright blob on a dim, sloped background."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")          # values[i, j] is the pixel (x_i, y_j)
    blob = np.exp(-(np.hypot(x - 0.65, y - 0.6) / 0.2) ** 2)
    return 0.15 + 0.25 * x + 1.5 * blob


def draw(values, positions, plan, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bary = np.asarray(plan.barycenters)
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(values.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys", vmin=0)
    plan.power_diagram.plot(ax, points=False, colors="tab:green", linewidths=1.0)
    for y, b in zip(positions, bary):
        ax.plot([y[0], b[0]], [y[1], b[1]], color="tab:orange", lw=1.0)
    ax.plot(positions[:, 0], positions[:, 1], "o", ms=4, color="tab:red", label="Diracs $y_i$")
    ax.plot(bary[:, 0], bary[:, 1], "o", ms=3, color="tab:blue", label="barycentres $b_i$ of the cells")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    ax.set_title(f"{len(positions)} Diracs of mass 1/{len(positions)}, a 16 x 16 image density,\n"
                 f"the Laguerre cells of the optimal weights: W2^2 = {float(plan.distance):.3e}",
                 fontsize=9)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"saved {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="number of Diracs")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "laguerre.png"),
                        help="where to write the picture (default: the temporary folder)")
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    values = image()
    positions = np.random.default_rng(args.seed).uniform(0.05, 0.95, (args.n, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(positions), sdot.Grid(values))
    print(f"{args.n} Diracs: {int(plan.iterations)} Newton steps, residual {float(plan.residual):.1e}")
    draw(values, positions, plan, args.out)


if __name__ == "__main__":
    main()
