"""Run every gallery example at full size and write its picture to docs/gallery/ (the pictures
of docs/gallery.md): ``python examples/gallery/build.py [name ...]``. Prints each run time."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = ("image_transport", "blue_noise", "gaussian_mixture", "euler", "power_diagram_geometry",
            "quantization_3d")


def main(names):
    out = HERE.parent.parent / "docs" / "gallery"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, MPLBACKEND="Agg")
    for name in names or EXAMPLES:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(HERE / f"{name}.py"), "--out", str(out / f"{name}.png")], check=True,
                       env=env)
        print(f"== {name}: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
