"""A 3D Laguerre diagram fitted to a voxel density, drawn two ways: the cells' edges in 3D,
and the section by the plane z = 0.5.

    python examples/power_diagram_3d.py --n 60 --out docs/laguerre3d.png
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import sdot  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--out", default="laguerre3d.png")
    args = parser.parse_args(argv)
    c = (np.arange(16) + 0.5) / 16
    x, y, z = np.meshgrid(c, c, c, indexing="ij")
    density = 0.1 + np.exp(-((x - 0.6) ** 2 + (y - 0.4) ** 2 + (z - 0.5) ** 2) / (2 * 0.15 ** 2))
    points = np.random.default_rng(0).random((args.n, 3))
    diagram = sdot.PowerDiagram(points)
    plan = diagram.adjust_weights(np.full(args.n, 1.0 / args.n), sdot.Grid(density))
    print(f"W2^2 = {float(plan.distance):.6f} after {int(plan.iterations)} Newton steps")
    fig = plt.figure(figsize=(9, 4.2))
    diagram.plot(fig.add_subplot(1, 2, 1, projection="3d"))
    section = fig.add_subplot(1, 2, 2)
    section.imshow(density[:, :, 8].T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys", alpha=0.5)
    diagram.plot(section, section=(2, 0.5))
    section.set_title("section z = 0.5: equal masses")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)


if __name__ == "__main__":
    main()
