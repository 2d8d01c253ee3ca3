"""The gallery's table, and its full-size run: ``python examples/gallery/build.py [slug ...]``
reruns the examples (all, or those named) and rewrites their pictures in docs/ (the pictures of
docs/gallery.md); it prints each run time. The docs build (``docs_hooks.py``) reads the table to
make a page per example (its text, picture and code) and the gallery's thumbnails, and runs an
example whose picture is missing."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: ``(slug, script under examples/, picture under docs/)``, in the gallery's order.
GALLERY = (
    ("quantization", "quantization.py", "quantization.png"),
    ("blue-noise", "gallery/blue_noise.py", "gallery/blue_noise.png"),
    ("image-transport", "gallery/image_transport.py", "gallery/image_transport.png"),
    ("gaussian-mixture", "gallery/gaussian_mixture.py", "gallery/gaussian_mixture.png"),
    ("euler", "gallery/euler.py", "gallery/euler.png"),
    ("fokker-planck", "gallery/fokker_planck.py", "gallery/fokker_planck.png"),
    ("crowd-motion", "crowd_motion.py", "crowd.png"),
    ("power-diagram-geometry", "gallery/power_diagram_geometry.py", "gallery/power_diagram_geometry.png"),
    ("smooth-densities", "smooth_densities.py", "densities.png"),
    ("quantization-3d", "gallery/quantization_3d.py", "gallery/quantization_3d.png"),
)


def run(slug):
    """Run the example ``slug`` at full size, its picture written in docs/; the time it took."""
    _, script, picture = next(row for row in GALLERY if row[0] == slug)
    env = dict(os.environ, MPLBACKEND="Agg")
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "examples" / script), "--out", str(ROOT / "docs" / picture)],
                   check=True, env=env)
    return time.perf_counter() - start


def main(slugs):
    for slug in slugs or [row[0] for row in GALLERY]:
        print(f"== {slug}: {run(slug):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
