"""Quantization of an image density by n Diracs, with Lloyd's algorithm.

Each iteration solves the optimal transport from the Diracs to the image and
moves every Dirac to the barycentre of its Laguerre cell: the gradient step of
size ``1 / (2 m_i)`` on W2^2 (see docs/gradients.md). The last diagram is drawn
over the image.

    python examples/quantization.py --n 2000 --iterations 20 --out docs/quantization.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot


def image(size=128):
    """A synthetic grey-level image: two rings and a bright spot on a dim background."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")          # values[i, j] is the pixel (x_i, y_j)
    ring = np.exp(-((np.hypot(x - 0.38, y - 0.55) - 0.22) / 0.035) ** 2)
    ring2 = np.exp(-((np.hypot(x - 0.7, y - 0.3) - 0.12) / 0.025) ** 2)
    spot = np.exp(-(np.hypot(x - 0.75, y - 0.75) / 0.08) ** 2)
    return 0.05 + ring + 0.8 * ring2 + 1.5 * spot


def lloyd(values, n, iterations, seed=0):
    """``iterations`` Lloyd steps from uniform random Diracs; returns the last plan."""
    positions = np.random.default_rng(seed).random((n, 2))
    target = sdot.Grid(values)
    for it in range(iterations):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(positions), target)
        print(f"iteration {it:2d}  W2^2 = {float(plan.distance):.6e}  "
              f"Newton steps {int(plan.iterations)}")
        positions = np.asarray(plan.barycenters)
    return sdot.optimal_transport_plan(sdot.SumOfDiracs(positions), target)


def draw(values, plan, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 7))
    ax.imshow(values.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys")
    plan.power_diagram.plot(ax, colors="tab:blue", linewidths=0.3)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"{plan.barycenters.shape[0]} Diracs and their Laguerre cells, "
                 f"W2^2 = {float(plan.distance):.3e}")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"saved {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--framework", default="numpy", choices=["numpy", "torch", "jax"])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "quantization.png"),
                        help="where to write the picture (default: the temporary folder)")
    args = parser.parse_args(argv)
    sdot.driver.framework = args.framework
    values = image()
    start = time.perf_counter()
    plan = lloyd(values, args.n, args.iterations)
    print(f"{args.iterations} Lloyd iterations of {args.n} Diracs: {time.perf_counter() - start:.1f} s")
    draw(values, plan, args.out)


if __name__ == "__main__":
    main()
