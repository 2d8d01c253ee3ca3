"""Partial transport in one picture: Diracs lighter than the density take their mass from balls.

Solves the transport from ~60 Diracs of total mass 1 to a grey image of mass 2. Each Dirac takes
its mass from its Laguerre cell cut by the ball ``|x - y_i|^2 <= psi_i`` (drawn by ``PowerDiagram.plot``); the
density outside every ball stays where it is.

    python examples/partial_transport.py --out docs/partial.png
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import sdot


def image(size=32):
    """A grey image on [0, 1]^2: two bright blobs on a dim background."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")          # values[i, j] is the pixel (x_i, y_j)
    return 0.2 + np.exp(-(np.hypot(x - 0.3, y - 0.65) / 0.15) ** 2) + np.exp(-(np.hypot(x - 0.7, y - 0.3) / 0.2) ** 2)


def draw(values, positions, plan, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(values.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys", vmin=0)
    plan.power_diagram.plot(ax, points=False, colors="tab:green", linewidths=1.2)    # the cells cut by balls
    ax.plot(positions[:, 0], positions[:, 1], "o", ms=3, color="tab:red", label="Diracs $y_i$")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_title(f"{len(positions)} Diracs of total mass 1, an image of mass 2: each takes its mass from\n"
                 f"its Laguerre cell cut by a ball (green); W2^2 = {float(plan.distance):.3e}", fontsize=9)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"saved {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60, help="number of Diracs")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "partial.png"),
                        help="where to write the picture (default: the temporary folder)")
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    values = image()
    positions = 0.1 + 0.8 * np.random.default_rng(args.seed).random((args.n, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(positions), sdot.Grid(values, mass=2.0))
    print(f"W2^2 = {float(plan.distance):.6e}, transported mass {float(plan.transported_mass):.12f}, "
          f"{int(plan.iterations)} Newton steps")
    draw(values, positions, plan, args.out)


if __name__ == "__main__":
    main()
