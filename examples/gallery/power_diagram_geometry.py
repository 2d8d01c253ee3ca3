"""Power-diagram geometry: cells, areas, barycentres, ``adjust_weights`` and the Brenier
potential as a surface.

Cell i of the power (Laguerre) diagram of seeds y_i with weights w_i is
``{x : |x - y_i|^2 - w_i <= |x - y_j|^2 - w_j}``. ``adjust_weights`` finds the weights that give
each cell a prescribed mass of a density (here the areas ``i + 1`` proportions, against the
uniform density); the convex function ``u(x) = max_i <x, y_i> - (|y_i|^2 - w_i) / 2`` is the
Brenier potential: its gradient sends cell i to its seed.

    python examples/gallery/power_diagram_geometry.py --out power_diagram_geometry.png
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import sdot


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="number of seeds")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "power_diagram_geometry.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    rng = np.random.default_rng(1)
    seeds = 0.1 + 0.8 * rng.random((args.n, 2))
    voronoi = sdot.PowerDiagram(seeds)
    areas = np.array([c.measure for c in voronoi.cells])
    print(f"Voronoi diagram: {args.n} cells, areas sum to {areas.sum():.15f}, from {areas.min():.4f} to "
          f"{areas.max():.4f}")
    wanted = np.arange(1, args.n + 1, dtype=float)
    wanted /= wanted.sum()                        # cell i gets a share proportional to i + 1
    laguerre = sdot.PowerDiagram(seeds)
    plan = laguerre.adjust_weights(wanted, sdot.Grid(np.ones((1, 1))))
    got = np.array([c.measure for c in laguerre.cells])
    print(f"adjust_weights: largest |area - asked| {np.abs(got - wanted).max():.2e} after "
          f"{int(plan.iterations)} Newton steps")
    draw(voronoi, laguerre, seeds, np.asarray(laguerre.weights), args.out)


def brenier(x, seeds, weights):
    """``u(x) = max_i <x, y_i> - (|y_i|^2 - w_i) / 2`` at points ``x`` (m, 2)."""
    return np.max(x @ seeds.T - 0.5 * (np.sum(seeds ** 2, axis=1) - weights)[None, :], axis=1)


def draw(voronoi, laguerre, seeds, weights, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(12, 4))
    for k, (diagram, title) in enumerate(((voronoi, "Voronoi: seeds, barycentres (x)"),
                                          (laguerre, "adjust_weights: areas ~ i + 1"))):
        ax = fig.add_subplot(1, 3, k + 1)
        diagram.plot(ax)
        bary = np.array([c.barycenter for c in diagram.cells])
        ax.scatter(bary[:, 0], bary[:, 1], s=14, c="tab:blue", marker="x", zorder=3)
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[], title=title)
    t = np.linspace(0, 1, 120)
    gx, gy = np.meshgrid(t, t, indexing="ij")
    u = brenier(np.column_stack([gx.ravel(), gy.ravel()]), seeds, weights).reshape(gx.shape)
    ax = fig.add_subplot(1, 3, 3, projection="3d")
    ax.plot_surface(gx, gy, u, cmap="viridis", linewidth=0, rcount=120, ccount=120)
    ax.set(title="Brenier potential u", xticks=[], yticks=[], zticks=[])
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
