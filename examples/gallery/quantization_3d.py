"""Quantization of a 3D density: Lloyd's algorithm on a voxel torus.

Each iteration moves every Dirac to the barycentre of its Laguerre cell in the optimal
transport to the voxel density (a torus in the unit cube, a dim background around it); the
quantization error W2^2 falls. The Diracs and a slice of the last diagram are drawn.

    python examples/gallery/quantization_3d.py --out quantization_3d.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot


def torus(size, major=0.28, minor=0.1):
    """Voxel values: 1 in a torus about the vertical axis through the centre, 0.02 elsewhere."""
    t = (np.arange(size) + 0.5) / size
    x, y, z = np.meshgrid(t - 0.5, t - 0.5, t - 0.5, indexing="ij")
    return np.where((np.hypot(x, y) - major) ** 2 + z ** 2 < minor ** 2, 1.0, 0.02)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="number of Diracs")
    parser.add_argument("--size", type=int, default=32, help="voxels per side")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "quantization_3d.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    target = sdot.Grid(torus(args.size))
    x = np.random.default_rng(0).random((args.n, 3))
    t0 = time.perf_counter()
    for it in range(args.iterations):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)
        print(f"iteration {it:2d}  W2^2 = {float(plan.distance):.6e}  Newton steps {int(plan.iterations)}")
        x = np.asarray(plan.barycenters)
    print(f"{args.n} Diracs, {args.size}^3 voxels, {args.iterations} iterations in {time.perf_counter() - t0:.1f} s")
    draw(x, sdot.PowerDiagram(x, np.asarray(plan.brenier_potential)), args.out)


def draw(x, diagram, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(9, 4.2))
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=3, c=x[:, 2], cmap="viridis")
    ax.set(xlim=(0, 1), ylim=(0, 1), zlim=(0, 1), xticks=[], yticks=[], zticks=[], title="the Diracs")
    bx = fig.add_subplot(1, 2, 2)
    diagram.plot(bx, section=(2, 0.5), points=False)
    bx.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[], title="the cells cut by z = 1/2")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
