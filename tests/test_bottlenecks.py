"""Bottleneck analyses on constructed phase tables with known answers."""

import pandas as pd
import pytest

from analysis import bottlenecks

MS = 1_000_000


def constructed(world=4, steps=40, late_rank=2, late_every=2, extra_ms=20):
    """A Horovod-like run: each step data_load 5, forward 10, backward 20,
    then grad_comm until the last rank arrives, optimizer 2 (ms). Rank
    ``late_rank`` spends ``extra_ms`` more in data_load every ``late_every``
    steps, so it arrives last there and the others wait for it."""
    rows, clock = [], 0
    for step in range(steps):
        load = {
            r: 5 * MS + (extra_ms * MS if r == late_rank and step % late_every == 0 else 0)
            for r in range(world)
        }
        arrival = {r: clock + load[r] + 30 * MS for r in range(world)}
        done = max(arrival.values()) + 3 * MS  # the all-reduce itself
        for r in range(world):
            t = clock
            for phase, dur in (
                ("data_load", load[r]),
                ("forward", 10 * MS),
                ("backward", 20 * MS),
                ("grad_comm", done - arrival[r]),
                ("optimizer", 2 * MS),
            ):
                rows.append(
                    {
                        "run_id": "r1",
                        "rank": r,
                        "epoch": 1,
                        "step": step,
                        "phase": phase,
                        "start_ns": t,
                        "end_ns": t + dur,
                        "dur_ns": dur,
                        "source": "test",
                    }
                )
                t += dur
        clock = done + 2 * MS
    phases = pd.DataFrame(rows)
    runs = pd.DataFrame(
        [
            {
                "run_id": "r1",
                "status": "ok",
                "framework": "horovod-torch",
                "world_size": world,
                "batch_size": 64,
                "warmup_steps": 0,
                "init_s": 1.0,
                "time_per_epoch_s": 9.0,
                "epochs": 1,
            }
        ]
    )
    return phases, runs


def test_injected_straggler_is_found_with_its_phase():
    phases, runs = constructed()
    steps = bottlenecks.per_step(phases, runs)
    found = bottlenecks.stragglers(steps).iloc[0]
    assert found["rank"] == 2
    assert found["late_share"] == pytest.approx(0.5)
    assert found["lost_in"] == "data_load"
    assert found["lost_s"] == pytest.approx(0.020)


def test_collective_wait_follows_scalasca():
    phases, runs = constructed()
    waits = bottlenecks.collective_wait(bottlenecks.per_step(phases, runs))
    step0 = waits[waits["step"] == 0].set_index("rank")["wait_s"]
    assert step0[2] == pytest.approx(0) and step0[0] == pytest.approx(0.020)
    step1 = waits[waits["step"] == 1]["wait_s"]
    assert (step1 == 0).all()


def test_imbalance_and_shares():
    phases, runs = constructed()
    imb = bottlenecks.imbalance(bottlenecks.per_step(phases, runs)).set_index("phase")
    # data_load means: ranks 0,1,3: 5 ms; rank 2: 15 ms -> max/mean = 15 / 7.5
    assert imb.loc["data_load", "imbalance"] == pytest.approx(2.0)
    assert imb.loc["forward", "imbalance"] == pytest.approx(1.0)
    table = bottlenecks.findings(phases, runs).set_index("bottleneck")
    assert "Rank 2 arrives last in 50 % of steps" in table.loc["straggler", "finding"]
    assert 0 < table.loc["exposed communication", "value"] < 1


def test_waterfall_splits_the_scaling_gap_exactly():
    cell = pd.DataFrame(
        [
            {"framework": "f", "world_size": 1, "phase": "forward", "mean": 0.010},
            {"framework": "f", "world_size": 1, "phase": "grad_comm", "mean": 0.0},
            {"framework": "f", "world_size": 4, "phase": "forward", "mean": 0.010},
            {"framework": "f", "world_size": 4, "phase": "grad_comm", "mean": 0.010},
        ]
    )
    table = bottlenecks.waterfall(cell, ["framework"]).set_index("phase")
    # step 10 ms -> 20 ms at 4x: speedup 2 of ideal 4, all lost in grad_comm
    assert table.loc["grad_comm", "speedup_lost"] == pytest.approx(2.0)
    assert table.loc["forward", "speedup_lost"] == pytest.approx(0.0)
    assert table["speedup"].iloc[0] == pytest.approx(2.0)
    assert table["ideal_speedup"].iloc[0] - table["speedup"].iloc[0] == pytest.approx(
        table["speedup_lost"].sum()
    )


def test_evaluation_that_does_not_scale_is_said():
    info = pd.DataFrame(
        {"framework": ["t"] * 2, "setting": ["batch_size 64"] * 2, "world_size": [1, 4]},
        index=["a", "b"],
    )
    evals = pd.Series({"a": 2.0, "b": 1.9})
    found = bottlenecks.eval_scaling(evals, info).iloc[0]
    assert "does not scale" in found["finding"]
    evals = pd.Series({"a": 2.0, "b": 0.55})
    assert "scales with ranks" in bottlenecks.eval_scaling(evals, info).iloc[0]["finding"]


def test_breakdown_has_intervals_over_replications():
    phases, runs = constructed()
    second = phases.assign(
        run_id="r2",
        dur_ns=phases["dur_ns"] * 1.1,
        end_ns=phases["start_ns"] + phases["dur_ns"] * 1.1,
    )
    both = pd.concat([phases, second])
    runs = pd.concat([runs, runs.assign(run_id="r2")])
    table = bottlenecks.breakdown(both, runs, ["framework", "world_size"]).set_index("phase")
    assert table.loc["forward", "replications"] == 2
    assert table.loc["forward", "mean"] == pytest.approx(0.0105)
    # two values 0.010 and 0.011: s = 0.000707, t(0.975, 1) = 12.706
    assert table.loc["forward", "ci_half_width"] == pytest.approx(
        12.706 * 0.000707 / 2**0.5, rel=1e-3
    )


def test_whole_step_framework_gets_no_invented_shares():
    """Tarantella times whole steps only (phase 'other'): its report must
    neither crash on phases it never timed nor claim 0 % communication."""
    phases, runs = constructed(world=2)
    whole = (
        phases.groupby(["run_id", "rank", "epoch", "step"])
        .agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        .reset_index()
        .assign(phase="other", source="test")
    )
    whole["dur_ns"] = whole["end_ns"] - whole["start_ns"]
    table = bottlenecks.findings(whole, runs.assign(framework="tarantella"))
    found = set(table.dropna(subset=["world_size"])["bottleneck"])
    assert found == {"initialisation"}, table


def test_study_of_single_rank_runs_has_findings_without_stragglers():
    """A follow-up may keep only one-process cells: no rank can be last at
    a synchronisation, and the findings must still be built."""
    phases, runs = constructed(world=1)
    assert bottlenecks.stragglers(bottlenecks.per_step(phases, runs)).empty
    table = bottlenecks.findings(phases, runs)
    assert "straggler" not in set(table["bottleneck"])
    assert "initialisation" in set(table["bottleneck"])
