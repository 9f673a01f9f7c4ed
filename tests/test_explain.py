"""The report's explaining sections (critical path, what-if, trace diff), from a tables folder holding only the
phase recorder's table (tracer none) of two frameworks at two scales."""

import pandas as pd

from analysis import explain
from phase_tables import constructed

COLUMNS = ["run_id", "rank", "epoch", "step", "phase", "start_ns", "end_ns", "dur_ns", "source"]


def test_sections_render_from_recorder_tables(tmp_path):
    phases, runs = [], []
    for fw, comm in (("torch-ddp", 2), ("horovod-torch", 6)):
        for world in (2, 4):
            run_id = f"{fw}-{world}"
            table = constructed(
                world=world,
                steps=12,
                comm_ms=comm * world / 2,
                run_id=run_id,
                extra=lambda r, s: {"data_load": 4} if r == 1 else {},
            )
            phases.append(table[COLUMNS])
            runs.append(
                {
                    "run_id": run_id,
                    "status": "ok",
                    "framework": fw,
                    "world_size": world,
                    "batch_size": 64,
                    "warmup_steps": 2,
                    "comm_bytes_per_step": 1e6,
                }
            )
    pd.concat(phases).to_parquet(tmp_path / "step_phases.parquet")
    runs = pd.DataFrame(runs)
    found = explain.sections(runs, tmp_path)
    assert [s.title for s in found] == [
        "Critical path and causes of waiting",
        "What if: a calibrated model of the step",
        "Trace diff: framework against framework, phase by phase",
    ]
    path, what, diff = found
    assert len(path.sentences) == 4
    assert all("rank 1's slower data_load causes" in s for s in path.sentences)
    assert path.figures[0].exists()
    assert any("fit without 4 processes, predict 4" in s for s in what.sentences)
    assert len(diff.sentences) == 2
    page = "".join(s.html() for s in found)
    assert "<img" in page and "exposed grad_comm" in page
