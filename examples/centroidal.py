"""A loss on the barycentres: move the Diracs until each one is the barycentre of its Laguerre
cell (a centroidal diagram, the fixed point of Lloyd's algorithm), by L-BFGS on
``sum_i |y_i - b_i(y)|^2`` with torch, through the derivative of the barycentres.

    python examples/centroidal.py [--n 300] [--iterations 30] [--out centroidal.png]

Each L-BFGS evaluation differentiates ``b`` (one sparse solve of the implicit derivative).
Lloyd's algorithm (``y <- b(y)``), printed for comparison, reaches the same fixed point as
fast here (300 Diracs: 3e-7 after 33 L-BFGS evaluations, 7e-8 after 30 Lloyd steps): the
example shows the mechanism, which pays where no fixed-point iteration exists (a loss that
mixes barycentres with other terms).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import sdot


def image(size=64):
    """A density on the unit square: a Gaussian bump on a floor."""
    c = (np.arange(size) + 0.5) / size
    xx, yy = np.meshgrid(c, c, indexing="ij")
    return 0.2 + np.exp(-((xx - 0.6) ** 2 + (yy - 0.4) ** 2) / (2 * 0.15 ** 2))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--out", default=None, help="draw the final diagram to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target = sdot.Grid(torch.from_numpy(image()))
    y = torch.tensor(np.random.default_rng(0).random((args.n, 2)), requires_grad=True)

    def residual():
        b = sdot.barycenters(sdot.SumOfDiracs(y), target)
        return ((y - b) ** 2).sum(dim=1).mean()

    optimizer = torch.optim.LBFGS([y], lr=1.0, max_iter=args.iterations, history_size=20,
                                  line_search_fn="strong_wolfe")
    steps = []

    def closure():
        optimizer.zero_grad()
        loss = residual()
        loss.backward()
        steps.append(float(loss.detach()))
        return loss
    with torch.no_grad():
        start = float(residual())
        lloyd = y.detach().clone()
        for _ in range(args.iterations):                   # Lloyd's algorithm, for comparison
            lloyd = sdot.barycenters(sdot.SumOfDiracs(lloyd), target)
        b = sdot.barycenters(sdot.SumOfDiracs(lloyd), target)
        lloyd_residual = float(((lloyd - b) ** 2).sum(dim=1).mean())
    optimizer.step(closure)
    with torch.no_grad():
        final = float(residual())
    print(f"mean |y - b(y)|^2: {start:.3e} at the start; L-BFGS through the barycentres' derivative: {final:.3e} "
          f"after {len(steps)} evaluations; Lloyd: {lloyd_residual:.3e} after {args.iterations} steps")
    if args.out:
        import matplotlib.pyplot as plt

        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(y.detach()), target)
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.imshow(image().T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys")
        plan.power_diagram.plot(ax=ax)
        ax.plot(*y.detach().numpy().T, ".", ms=2, color="C3")
        fig.savefig(args.out, dpi=100, bbox_inches="tight")
    return start, final


if __name__ == "__main__":
    main()
