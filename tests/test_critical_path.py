"""Critical path and root causes of waiting on traces whose answer is known
by construction, and on real traces converted from the shared fixtures."""

import pandas as pd
import pytest

from analysis import critical_path as cp

from conftest import REAL_TRACES as REAL, needs_shared
from phase_tables import MS, constructed, run_table


def test_injected_slow_phase_on_one_rank():
    phases = constructed(extra=lambda r, s: {"data_load": 20} if r == 2 else {})
    found = cp.analyse(phases)
    assert found.method == {"r1": "grad_comm"}
    joins = found.joins
    assert (joins[joins["last"]]["rank"] == 2).all()
    waits = joins.groupby("rank")["wait_ns"].mean() / MS
    assert waits.to_dict() == pytest.approx({0: 20, 1: 20, 2: 0, 3: 20})
    assert (joins["comm_ns"] == 3 * MS).all()
    # Waiting caused: 3 ranks x 20 ms per join, all by rank 2's data_load.
    causes = found.causes.groupby(["late_rank", "cause"])["waited_ns"].sum() / MS
    assert causes[(2, "data_load")] == pytest.approx(60 * 20)
    assert causes.drop((2, "data_load")).sum() == pytest.approx(0)
    # The path: rank 2's window (25 + 10 + 20 ms), 3 ms of communication,
    # then 2 ms of optimizer in the next window, per step.
    path = found.path
    assert set(path[path["kind"] == "phase"]["rank"]) == {2} | set(
        path[(path["join"] == 20)]["rank"]
    )
    totals = path.groupby("phase")["dur_ns"].sum() / MS
    assert totals["data_load"] == pytest.approx(20 * 25)
    assert totals["grad_comm"] == pytest.approx(20 * 3)
    assert totals["optimizer"] == pytest.approx(20 * 2)
    assert path["dur_ns"].sum() == phases["end_ns"].max() - phases["start_ns"].min()


def test_two_alternating_stragglers():
    def extra(rank, step):
        if rank == 1 and step % 2 == 0:
            return {"backward": 10}
        if rank == 3 and step % 2 == 1:
            return {"forward": 15}
        return {}

    found = cp.analyse(constructed(steps=40, extra=extra))
    late = found.joins[found.joins["last"]].set_index("step")["rank"]
    assert (late[late.index % 2 == 0] == 1).all() and (late[late.index % 2 == 1] == 3).all()
    causes = found.causes.groupby(["late_rank", "cause"])["waited_ns"].sum() / MS
    assert causes[(1, "backward")] == pytest.approx(20 * 3 * 10)
    assert causes[(3, "forward")] == pytest.approx(20 * 3 * 15)
    summary = cp.run_summary(found).iloc[0]
    assert summary["waiting_ms_per_step"] == pytest.approx((3 * 10 + 3 * 15) / 2 / 4)
    ranks = cp.rank_table(found).set_index("rank")
    assert ranks.loc[1, "last_share"] == pytest.approx(0.5)
    assert ranks.loc[3, "last_share"] == pytest.approx(0.5)
    assert ranks.loc[0, "last_share"] == 0


def test_a_collective_with_a_late_arrival():
    """DDP-like: no exposed grad_comm; rank 1 hands its last gradient over
    7 ms late at every step; the collective then takes 4 ms."""
    phases = constructed(
        extra=lambda r, s: {"backward": 7} if r == 1 else {}, comm_ms=4, exposed=False
    )
    found = cp.analyse(phases)
    assert found.method == {"r1": "collective"}
    joins = found.joins
    assert (joins[joins["last"]]["rank"] == 1).all()
    assert joins[joins["rank"] != 1]["wait_ns"].eq(7 * MS).all()
    assert joins["comm_ns"].eq(4 * MS).all()
    causes = found.causes.groupby(["late_rank", "cause"])["waited_ns"].sum() / MS
    assert causes[(1, "backward")] == pytest.approx(20 * 3 * 7)
    summary = cp.run_summary(found).iloc[0]
    assert summary["communication_ms_per_step"] == pytest.approx(4)
    # Without the collectives (tracer none) the join is backward itself.
    no_trace = cp.analyse(phases[phases["collective"].isna()])
    assert no_trace.method == {"r1": "backward"}


def test_shares_of_path_and_of_mean_step_differ():
    phases = constructed(extra=lambda r, s: {"data_load": 20} if r == 2 else {})
    shares = cp.phase_shares(cp.analyse(phases)).set_index("phase")
    # The mean step holds 15 ms of waiting inside grad_comm; the path only
    # the 3 ms of communication proper.
    assert shares.loc["grad_comm", "path_share"] == pytest.approx(3 / 60)
    assert shares.loc["grad_comm", "step_share"] == pytest.approx((3 * 23 + 3) / 4 / 60)
    assert shares.loc["data_load", "path_share"] == pytest.approx(25 / 60)


def test_sentence_names_the_cause():
    phases = constructed(extra=lambda r, s: {"data_load": 20} if r == 2 else {})
    section = cp.section(run_table(), phases)
    text = " ".join(section.sentences)
    assert "rank 2's slower data_load causes 100% of the waiting" in text
    assert len(section.tables["per cell"]) == 1


def test_warmup_and_incomplete_steps_are_left_out():
    phases = constructed(steps=10)
    phases = phases[~((phases["step"] == 9) & (phases["rank"] == 0))]
    found = cp.analyse(phases, run_table().assign(warmup_steps=2))
    assert sorted(found.joins["step"].unique()) == list(range(2, 9))


@needs_shared("scorep-8.4-horovod-torch-mpi-np2")
def test_real_scorep_horovod_trace(tmp_path):
    from traces.convert import convert
    from traces.rules import PhaseRules, RULES_FILE

    table, _, errors = convert(
        [REAL / "scorep-8.4-horovod-torch-mpi-np2"], PhaseRules(RULES_FILE), "scorep"
    )
    assert not errors
    phases = table.to_pandas()
    found = cp.analyse(phases)
    assert found.method["scorep"] == "grad_comm"
    joins = found.joins
    # Horovod's background thread records its MPI calls on the main thread's
    # location, interleaved with the phases: a few steps pair up badly in
    # the trace and lack a phase on a rank, so they are left out.
    assert joins["rank"].nunique() == 2 and joins["step"].nunique() >= 10
    # Waiting is split into what it is caused by, and nothing is lost.
    waited = found.causes["waited_ns"].sum()
    assert waited == pytest.approx(joins["wait_ns"].sum(), rel=1e-9)
    # The path covers the analysed span exactly.
    path = found.path
    span = (
        found.intervals.groupby("rank")["end_ns"].max().max()
        - joins.groupby("rank")["entry_ns"].min().min()
    )
    assert 0 < path["dur_ns"].sum()
    assert path["dur_ns"].sum() <= phases["end_ns"].max() - phases["start_ns"].min()
    assert (
        len(
            cp.section(
                pd.DataFrame(
                    [
                        {
                            "run_id": "scorep",
                            "status": "ok",
                            "framework": "horovod-torch",
                            "world_size": 2,
                            "setting": "imported",
                        }
                    ]
                ),
                phases,
            ).sentences
        )
        == 1
    )
    assert span > 0


@needs_shared("kineto-tb-resnet50-numworkers0")
def test_real_single_rank_profiler_trace():
    """One rank of a PyTorch profiler trace: no waiting, and the path is its
    steps end to end (the ProfilerStep intervals)."""
    from traces.convert import convert
    from traces.rules import PhaseRules, RULES_FILE

    trace = REAL / "kineto-tb-resnet50-numworkers0" / "worker0.pt.trace.json.gz"
    table, _, _ = convert([trace], PhaseRules(RULES_FILE), "k")
    phases = table.to_pandas()
    found = cp.analyse(phases)
    assert found.method == {"k": "backward"}
    assert (found.joins["wait_ns"] == 0).all() and found.causes["waited_ns"].sum() == 0
    steps = phases[phases["phase"] == "step"]
    assert found.path["dur_ns"].sum() == pytest.approx(steps["dur_ns"].sum(), rel=0.01)
    assert set(found.path["rank"]) == {0}


def test_runs_without_a_critical_path_are_named_in_a_stable_order():
    """The report's "no critical path" sentences follow the run ids, not a
    set's hash order (which changes from one Python process to the next)."""
    ids = [f"run{n:02d}" for n in range(24, 0, -1)]
    broken = []
    for run_id in ids:  # in each step one rank is missing: no step every rank joined
        phases = constructed(steps=4, run_id=run_id)
        broken.append(phases[phases["rank"] != phases["step"] % 4])
    found = cp.analyse(pd.concat([constructed(steps=4), *broken], ignore_index=True))
    assert list(found.problems) == sorted(ids)
