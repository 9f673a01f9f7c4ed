"""Trace diff on built runs: a framework whose exchange is slower by a known
amount, replicated with a known spread."""

import pandas as pd
import pytest

from analysis import trace_diff
from phase_tables import constructed


def pair_of_frameworks(reps=3):
    """torch-ddp: 3 ms exchange; horovod-torch: 9 ms plus 1 ms more forward,
    rep r adding r x 0.5 ms of forward on both (the replications' spread)."""
    phases, runs = [], []
    for fw, comm, fwd in (("torch-ddp", 3, 0), ("horovod-torch", 9, 1)):
        for rep in range(reps):
            run_id = f"{fw}-{rep}"
            phases.append(
                constructed(
                    world=2,
                    steps=10,
                    comm_ms=comm,
                    run_id=run_id,
                    extra=lambda r, s, f=fwd, k=rep: {"forward": f + 0.5 * k},
                )
            )
            runs.append(
                {
                    "run_id": run_id,
                    "status": "ok",
                    "framework": fw,
                    "world_size": 2,
                    "batch_size": 64,
                    "warmup_steps": 0,
                    "rep": rep,
                }
            )
    return pd.concat(phases, ignore_index=True), pd.DataFrame(runs)


def test_difference_per_phase_and_on_the_path():
    phases, runs = pair_of_frameworks()
    table = trace_diff.compare(runs, phases).set_index("part")
    assert table.loc["step", "a"] == "horovod-torch" and table.loc["step", "b"] == "torch-ddp"
    assert table.loc["step", "diff_ms"] == pytest.approx(7.0)
    assert table.loc["grad_comm", "diff_ms"] == pytest.approx(6.0)
    assert table.loc["grad_comm", "on_path_ms"] == pytest.approx(6.0)
    assert table.loc["forward", "on_path_ms"] == pytest.approx(1.0)
    assert table.loc["backward", "diff_ms"] == pytest.approx(0.0)
    # Same spread on both sides: Welch's interval is centred and finite.
    low, high = table.loc["step", "low_ms"], table.loc["step", "high_ms"]
    assert low < 7.0 < high and high - 7.0 == pytest.approx(7.0 - low)
    text = trace_diff.section(runs, phases).sentences[0]
    assert text.startswith(
        "2 processes, batch_size 64: horovod-torch spends 7.0 ms "
        "more per step than torch-ddp (95 % interval"
    )
    assert text.endswith("6.0 ms of it in exposed grad_comm on the critical path.")


def test_one_replication_has_no_interval():
    phases, runs = pair_of_frameworks(reps=1)
    table = trace_diff.compare(runs, phases).set_index("part")
    assert table.loc["step", "low_ms"] != table.loc["step", "low_ms"]  # NaN
    assert "interval" not in trace_diff.section(runs, phases).sentences[0]
