"""Gaussian mixture fit: the means and weights of a mixture fitted to an image by gradient
descent on W2^2, once in PyTorch (an ``nn.Module`` and ``torch.optim.Adam``) and once in JAX
(``jax.jit(jax.value_and_grad(loss))`` and Adam written out).

The mixture of K Gaussians of a common width sigma is represented by fixed standard normal
samples z_j, placed at ``mu_k + sigma z_j`` with masses ``softmax(a)_k / J``; the loss is the
exact W2^2 between these Diracs and the image, differentiable in the positions and the masses
(docs/gradients.md), hence in ``mu`` and ``a``.

    python examples/gallery/gaussian_mixture.py --out gaussian_mixture.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot

TRUE_MEANS = np.array([[0.28, 0.3], [0.7, 0.35], [0.5, 0.72]])
TRUE_WEIGHTS = np.array([0.5, 0.3, 0.2])
SIGMA = 0.08


def image(size):
    """The mixture to fit, on ``size^2`` pixels."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")
    return sum(w * np.exp(-((x - m[0]) ** 2 + (y - m[1]) ** 2) / (2 * SIGMA ** 2))
               for m, w in zip(TRUE_MEANS, TRUE_WEIGHTS))


def start(k, samples, seed=0):
    """Initial means (random, in the middle of the square), weights (equal) and the samples z."""
    rng = np.random.default_rng(seed)
    return 0.3 + 0.4 * rng.random((k, 2)), np.zeros(k), rng.standard_normal((samples, 2))


def fit_torch(values, k, samples, steps, lr):
    import torch

    sdot.driver.framework = "torch"

    class Mixture(torch.nn.Module):
        def __init__(self):
            super().__init__()
            mu, a, z = start(k, samples)
            self.mu, self.a = torch.nn.Parameter(torch.asarray(mu)), torch.nn.Parameter(torch.asarray(a))
            self.register_buffer("z", torch.asarray(z))

        def forward(self):
            positions = (self.mu[:, None, :] + SIGMA * self.z[None, :, :]).reshape(-1, 2)
            masses = torch.softmax(self.a, 0)[:, None].expand(k, samples).reshape(-1) / samples
            return sdot.SumOfWeightedDiracs(positions, masses)

    model, target = Mixture(), sdot.Grid(torch.asarray(values))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = sdot.distance(model(), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return model.mu.detach().numpy(), torch.softmax(model.a, 0).detach().numpy(), losses


def fit_jax(values, k, samples, steps, lr):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    sdot.driver.framework = "jax"
    mu0, a0, z = start(k, samples)
    target, z = sdot.Grid(jnp.asarray(values)), jnp.asarray(z)

    def loss(params):
        mu, a = params
        positions = (mu[:, None, :] + SIGMA * z[None, :, :]).reshape(-1, 2)
        masses = jnp.repeat(jax.nn.softmax(a) / samples, samples)
        return sdot.distance(sdot.SumOfWeightedDiracs(positions, masses), target)

    step = jax.jit(jax.value_and_grad(loss))
    params, losses = [jnp.asarray(mu0), jnp.asarray(a0)], []
    first, second = [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params]
    for t in range(1, steps + 1):             # Adam, written out (optax.adam does the same)
        value, grads = step(params)
        for i, g in enumerate(grads):
            first[i] = 0.9 * first[i] + 0.1 * g
            second[i] = 0.999 * second[i] + 0.001 * g * g
            params[i] = params[i] - lr * (first[i] / (1 - 0.9 ** t)) / (jnp.sqrt(second[i] / (1 - 0.999 ** t)) + 1e-8)
        losses.append(float(value))
    return np.asarray(params[0]), np.asarray(jax.nn.softmax(params[1])), losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="pixels per side of the image")
    parser.add_argument("--samples", type=int, default=200, help="samples per component")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--frameworks", default="torch,jax")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "gaussian_mixture.png"))
    args = parser.parse_args(argv)
    values, fits = image(args.size), {}
    for name in args.frameworks.split(","):
        fit = {"torch": fit_torch, "jax": fit_jax}[name]
        t0 = time.perf_counter()
        mu, weights, losses = fit(values, len(TRUE_WEIGHTS), args.samples, args.steps, lr=0.01)
        order = np.argsort(np.linalg.norm(mu[:, None] - TRUE_MEANS[None], axis=2).argmin(axis=1))
        print(f"{name}: W2^2 {losses[0]:.3e} -> {losses[-1]:.3e} in {args.steps} steps "
              f"({time.perf_counter() - t0:.1f} s); means {np.round(mu[order], 3).tolist()}, "
              f"weights {np.round(weights[order], 3).tolist()}")
        fits[name] = (mu, weights, losses)
    draw(values, fits, args.out)


def draw(values, fits, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 3.6))
    ax.imshow(values.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys")
    for (name, (mu, weights, losses)), marker in zip(fits.items(), ("o", "x")):
        ax.scatter(mu[:, 0], mu[:, 1], s=600 * weights, marker=marker, label=f"{name} fit", alpha=0.8)
        bx.semilogy(losses, label=name)
    ax.scatter(TRUE_MEANS[:, 0], TRUE_MEANS[:, 1], s=600 * TRUE_WEIGHTS, facecolors="none", edgecolors="r",
               label="true")
    ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[], title="means (size: weight)")
    ax.legend(loc="lower right", fontsize=7)
    bx.set(xlabel="step", ylabel="W2^2", title="loss")
    bx.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
