"""Finished runs found again by what they ran, not by where they were filed.

A run's folder name follows the design's layout: a fixed setting that
becomes a factor (even of one level, the same value) moves every run to a
new folder name. A run is what its resolved configuration says
(design.identity); before planning, the workflow looks for finished runs of
the design's name whose identity is a planned run's that has no done marker
yet, and moves each to its planned folder, so that it is never trained again.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddlcompare.plan.design import BOOKKEEPING, identity
from ddlcompare.plan.params import RunRow
from runfiles.atomic import write_json
from runfiles.names import CONFIG, DONE, PHASE_TABLE, RUN_RECORD
from runfiles import files

# Folders inside a design's results that hold no run of their own.
NOT_RUNS = {"attempts", "tables"}


def finished_folders(root: Path) -> dict[str, Path]:
    """identity -> folder of every run finished ok under ``root`` (a
    design's results/<name>/), read from its config.json."""
    found: dict[str, Path] = {}
    for folder, dirs, names in os.walk(root):
        if DONE not in names:
            dirs[:] = [d for d in dirs if d not in NOT_RUNS]
            continue
        dirs[:] = []  # a run folder holds no other run
        try:
            status = files.read_json(Path(folder) / DONE).get("status")
            config = files.read_json(Path(folder) / CONFIG)
        except (OSError, ValueError, AttributeError):
            continue  # damaged: ddlc check names it
        if status == "ok" and isinstance(config, dict):
            found.setdefault(identity(config), Path(folder))
    return found


def moves(runs: list[RunRow], results: Path, root: Path) -> list[tuple[RunRow, Path]]:
    """(planned run, the folder where it finished) for each planned run with
    no done marker that finished under another folder name."""
    todo = [r for r in runs if not (results / r.path / DONE).exists()]
    if not todo:
        return []
    # realpath: Path.resolve raises RuntimeError on a run folder that is a link loop
    planned = {os.path.realpath(results / r.path) for r in runs}
    found = {k: v for k, v in finished_folders(root).items() if os.path.realpath(v) not in planned}
    return [(r, found[identity(r.config)]) for r in todo if identity(r.config) in found]


def move(row: RunRow, source: Path, results: Path) -> bool:
    """Move a finished run to its planned folder, its records saying so; its
    phase table (which names the run) is converted again. False when the
    planned folder already holds files (an attempt of its own)."""
    target = results / row.path
    if target.exists():
        if any(target.iterdir()):
            return False
        target.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
    names = {"run_id": row.run_id, **{k: v for k, v in row.config.items() if k in BOOKKEEPING}}
    _update(target / CONFIG, names)
    _update(target / DONE, {"run_id": row.run_id})
    record = _read(target / RUN_RECORD)
    if record is not None:
        moved = {"path": row.path, "moved_from": str(source.relative_to(results))}
        config = {**record.get("config", {}), **names}
        write_json(target / RUN_RECORD, {**record, "run_id": row.run_id, "config": config, **moved})
    (target / PHASE_TABLE).unlink(missing_ok=True)
    return True


def _read(path: Path) -> dict | None:
    try:
        doc = files.read_json(path)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _update(path: Path, values: dict) -> None:
    doc = _read(path)
    if doc is not None:
        write_json(path, {**doc, **values})
