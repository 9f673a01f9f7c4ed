"""Where and with what a run ran: the harness commit and the tools' versions."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _first_line(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if out.returncode == 0 and text else None


@functools.cache
def harness() -> dict:
    commit = _first_line(["git", "rev-parse", "HEAD"], REPO)
    dirty = _first_line(["git", "status", "--porcelain", "--untracked-files=no"], REPO)
    return {"harness_commit": commit or "unknown", "harness_dirty": bool(dirty)}


@functools.cache
def tools() -> dict:
    return {
        "mpi": _first_line(["mpirun", "--version"]),
        "gpus": _first_line(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]),
    }
