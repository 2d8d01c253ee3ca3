"""Rows of a table measured in fresh processes (clean peak memory, no shared caches)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_row(args, timeout):
    """``(row, None)``: the last JSON line printed by ``python -m <args>`` run in a fresh process
    from the repository's root; ``(None, why)`` if it timed out, failed or printed none."""
    try:
        out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"more than {timeout:.0f} s"
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        return None, f"failed: {out.stderr.strip().splitlines()[-1:]}"
    return json.loads(lines[-1]), None
