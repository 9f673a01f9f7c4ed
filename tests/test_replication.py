"""replications: auto: a cell with a wide interval gets more runs, a tight one
does not, the cap holds, and the decisions are files a new start reads."""

import json
import math
import random
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis import replication, stats
from ddlcompare.plan import design
from ddlcompare.plan.design import DesignError
from ddlcompare.run import progress


def adaptive(**over):
    doc = {
        "name": "auto",
        "factors": {"framework": ["torch-ddp", "horovod-torch"], "procs_per_node": [1, 2]},
        "replications": "auto",
        "max_replications": 6,
        "seed": 3,
    }
    doc.update(over)
    return design.parse(doc)


def finish(results, rows, throughput, status="ok"):
    """Leave the files a finished run leaves that the decision reads."""
    for row in rows:
        folder = results / row.path
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "done.json").write_text(
            json.dumps({"status": status, "exit_status": 0, "reason": None, "run_id": row.run_id})
        )
        (folder / "metrics.json").write_text(json.dumps({"images_per_s": throughput(row)}))


def spread_by_cell(spreads):
    """Throughput 1000 per run, varied by the cell's relative spread."""
    rng = random.Random(1)

    def value(row):
        spread = spreads[row.factors["framework"], row.factors["procs_per_node"]]
        return 1000 * (1 + spread * rng.uniform(-1, 1))

    return value


def test_plan_has_least_and_most():
    plan = adaptive()
    assert plan.adaptive == design.Adaptive(0.05, 3, 6)
    assert len(plan.runs()) == 4 * 3
    most = plan.runs(most=True)
    assert len(most) == 4 * 6
    # the first round runs first; the replications auto may add come after, shuffled
    assert [r.rep <= 3 for r in most] == [True] * 12 + [False] * 12
    assert sorted(r.order for r in most) == list(range(24))
    # the first round's rows are those of a fixed design of 3 replications
    fixed = design.parse({**_doc(), "replications": 3})
    assert [(r.path, r.order) for r in plan.runs()] == [(r.path, r.order) for r in fixed.runs()]


def _doc():
    return {
        "name": "auto",
        "factors": {"framework": ["torch-ddp", "horovod-torch"], "procs_per_node": [1, 2]},
        "seed": 3,
    }


def key(cell: str) -> tuple[str, int]:
    """(framework, procs_per_node) of a cell's folder name."""
    parts = dict(part.split("~") for part in cell.split("/") if "~" in part)
    return parts["framework"], int(parts["procs_per_node"])


def test_wide_cell_gets_more_tight_cell_none_and_the_cap_holds(tmp_path):
    plan = adaptive()
    spreads = {
        ("torch-ddp", 1): 0.001,  # tight: meets 5 % at 3
        ("torch-ddp", 2): 0.06,  # a few more
        ("horovod-torch", 1): 0.9,  # wide: to the cap
        ("horovod-torch", 2): 0.001,
    }
    throughput = spread_by_cell(spreads)
    finish(tmp_path, replication.planned(plan, tmp_path), throughput)
    first = replication.write_round(plan, tmp_path, 0)
    by = {key(c["cell"]): c for c in first["cells"]}
    assert len(by) == 4
    assert by["torch-ddp", 1]["met"] and by["torch-ddp", 1]["add"] == 0
    assert by["horovod-torch", 2]["add"] == 0
    assert by["horovod-torch", 1]["add"] == 3  # 3 + 3 = the cap of 6
    assert not by["horovod-torch", 1]["met"]
    # the added runs come in the plan's shuffled order, interleaved across cells
    most = [r.path for r in plan.runs(most=True)]
    assert first["add"] == sorted(first["add"], key=most.index)
    planned = replication.planned(plan, tmp_path)
    assert len(planned) == 12 + len(first["add"])
    # round 1: the wide cell is at its cap and gets no more
    finish(tmp_path, [r for r in planned if r.path in first["add"]], throughput)
    second = replication.write_round(plan, tmp_path, 1)
    capped = next(c for c in second["cells"] if c["cell"] == by["horovod-torch", 1]["cell"])
    assert capped["replications"] == 6 and capped["add"] == 0
    assert all(c["replications"] <= 6 for c in second["cells"])
    rounds = [first, second]
    while rounds[-1]["add"]:
        added = rounds[-1]["add"]
        finish(
            tmp_path,
            [r for r in replication.planned(plan, tmp_path) if r.path in added],
            throughput,
        )
        rounds.append(replication.write_round(plan, tmp_path, len(rounds)))
    assert replication.rounds(plan, tmp_path)[-1]["add"] == []  # the rounds are over
    final = {c["cell"]: c for c in rounds[-1]["cells"]}
    assert final[by["torch-ddp", 1]["cell"]]["replications"] == 3
    assert final[by["horovod-torch", 1]["cell"]]["replications"] == 6


def test_failed_cell_gets_no_more_and_a_changed_target_decides_again(tmp_path):
    plan = adaptive()
    rows = replication.planned(plan, tmp_path)
    finish(tmp_path, rows, lambda row: 1000.0 + 300 * row.rep, status="failed")
    first = replication.write_round(plan, tmp_path, 0)
    assert first["add"] == [] and not any(c["met"] for c in first["cells"])
    assert all(c["ok"] == 0 for c in first["cells"])
    assert replication.rounds(plan, tmp_path)[-1]["add"] == []  # the rounds are over
    looser = adaptive(target_half_width=0.5)
    assert replication.rounds(looser, tmp_path) == []  # decided under another target


def test_needed_is_steins_smallest_n_from_the_first_round():
    first = [100.0, 104.0, 96.0]  # sd 4
    n = replication.needed(first, 0.05, 50)
    assert replication.relative_half_width(n, first) <= 0.05
    assert replication.relative_half_width(n - 1, first) > 0.05
    # Stein's: t at the first round's 2 degrees of freedom, whatever n
    t = scipy_stats.t.ppf(0.975, 2)
    assert n == math.ceil((t * 4 / 5) ** 2) == 12
    assert replication.needed(first, 0.05, 5) == 5
    assert replication.needed([100.0], 0.05, 10) == 1


def test_later_rounds_do_not_decide_again_and_make_up_for_failures():
    """A cell whose first round asked for 6 keeps 6, however its later runs
    spread; one run of them failed, and the next round makes up for it."""
    plan = adaptive(max_replications=8)
    cell = replication.cell_of(plan.runs()[0])
    first = {1: 1000.0, 2: 1027.0, 3: 973.0}  # sd 27: 6 runs meet 5 %, 5 do not
    assert replication.needed(list(first.values()), 0.05, 8) == 6
    later = {4: 1000.0, 5: 1000.2}  # run 6 failed; these two would look tight
    doc = replication.decide(plan, {cell: 6}, {cell: {**first, **later}})
    row = next(c for c in doc["cells"] if c["cell"] == cell)
    assert row["add"] == 1 and row["ok"] == 5


def test_steins_interval_covers_a_known_mean_after_the_rule():
    """2,000 cells of 5 % variation through the rule (3 to 10 runs) and the
    report's interval: Stein's covers the true mean in at least 93.5 %;
    the usual t interval over all runs after a rule that looked again at
    each round covered 92.3 % (bench/interval_coverage.py)."""
    rng = np.random.default_rng(2)
    inside = []
    for _ in range(2000):
        first = list(rng.normal(1000, 50, 3))
        values = first + list(rng.normal(1000, 50, replication.needed(first, 0.05, 10) - 3))
        _, low, high, _ = stats.positive_interval(pd.Series(values), first_stage=pd.Series(first))
        inside.append(low <= 1000 <= high)
    assert np.mean(inside) >= 0.935, np.mean(inside)


@pytest.mark.parametrize(
    "over, words",
    [
        ({"replications": "auto", "max_replications": 2}, "max_replications (2) is below"),
        ({"replications": "auto", "target_half_width": 0}, "target_half_width: must be a number"),
        ({"replications": 3, "min_replications": 4}, "applies to replications: auto only"),
        ({"replications": "often"}, "replications: must be an integer"),
    ],
)
def test_adaptive_settings_are_checked(over, words):
    with pytest.raises(DesignError) as err:
        design.parse({**_doc(), **over})
    assert words in str(err.value)


def test_plan_command_shows_least_and_most(tmp_path):
    from conftest import ddlc

    path = tmp_path / "d.yaml"
    path.write_text(json.dumps({**_doc(), "replications": "auto"}))
    out = ddlc("plan", "--design", str(path), "--no-check")
    assert "at least 12 runs (4 cells x 3), at most 40 (4 cells x 10)" in out.stdout


@pytest.mark.slow
def test_workflow_adds_a_round_and_redoes_nothing(tmp_path):
    """Through snakemake: round 0 runs both replications, its decision adds
    the third (a target no real timing meets), round 1 stops at the cap; a
    second start finds nothing to do."""
    from conftest import TINY_FIXED, ddlc, snakemake_cmd, write_design

    doc = {
        "name": "tiny",
        "factors": {"framework": ["torch-ddp"], "procs_per_node": [1], "batch_size": [32]},
        "replications": "auto",
        "target_half_width": 1e-6,
        "min_replications": 2,
        "max_replications": 3,
        "fixed": {**TINY_FIXED, "epochs": 1, "max_steps": 4, "train_images": 1000},
    }
    write_design(tmp_path, doc)
    plan = design.parse(doc)
    last = replication.round_file(plan, tmp_path / "results", 1).relative_to(tmp_path)

    def snakemake(*extra, targets=(str(last),)):
        command = snakemake_cmd(tmp_path)
        at = command.index("--config")
        return subprocess.run(
            [*command[:at], *extra, *targets, *command[at:]], capture_output=True, text=True
        )

    def left() -> str:
        out = ddlc(
            *("plan", "--no-check", "--summary", "--design", str(tmp_path / "design.yaml")),
            *("--results", str(tmp_path / "results")),
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    # The time left counts the round replications: auto may add: before any
    # run, none or one; once round 0's runs are done, what it will decide.
    assert left().startswith(
        "0 of 2 runs done, 2 to do and 0 to 1 more that replications: auto may add "
        "(as many as the first runs' spread asks): about "
    )
    round_0 = [str(Path("results", r.path, "done.json")) for r in plan.runs()]
    ran = snakemake(targets=round_0)
    assert ran.returncode == 0, ran.stderr[-3000:]
    # each run's start line on the console says the same
    assert "runs done, 2 to do and 0 to 1 more that replications: auto may add" in ran.stderr
    assert not replication.rounds(plan, tmp_path / "results")  # not decided yet
    # the added run priced from the cell's two real runs
    timed = [progress.timed_seconds(tmp_path / "results" / r.path) for r in plan.runs()]
    added = statistics.median(timed) + progress.BETWEEN_RUNS_S + progress.REPORT_S
    assert left() == (
        f"2 of 2 runs done and 1 more that replications: auto adds: about "
        f"{progress.duration(added)} left, the report included"
    )
    first = snakemake()
    assert first.returncode == 0, first.stderr[-3000:]
    assert "/rep~3: 2 of 3 runs done, 1 to do: about " in first.stderr  # the added run
    rounds = replication.rounds(plan, tmp_path / "results")
    assert [len(r["add"]) for r in rounds] == [1, 0]
    assert rounds[-1]["cells"][0]["replications"] == 3 and not rounds[-1]["cells"][0]["met"]
    done = [
        r for r in plan.runs(most=True) if (tmp_path / "results" / r.path / "done.json").exists()
    ]
    assert sorted(r.rep for r in done) == [1, 2, 3]
    again = snakemake("-n")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr
    assert left() == "3 of 3 runs done; none to do"


def test_an_added_replication_is_announced_as_one(tmp_path):
    """The console's line as a run starts counts the planned runs; a run
    beyond them (not yet decided) says so instead of "none to do"."""
    d = adaptive()
    planned, every = progress.Planned(*replication.forecast(d, tmp_path)), d.runs(most=True)
    added = next(r for r in every if r.path not in {p.path for p in planned.rows})
    assert "runs done, " in progress.start_line(planned, planned.rows[0], tmp_path)
    assert progress.start_line(planned, added, tmp_path).endswith(
        f": a replication added beyond the {len(planned.rows)} planned\n"
    )


def test_the_forecast_counts_what_round_0_will_add_once_a_cell_is_done(tmp_path):
    """A cell whose first round is done is forecast exactly the runs round 0
    will give it (the decision's own rule); one not yet done, none up to the
    cap; once round 0 is decided, none (later rounds make up for failures)."""
    plan = adaptive()  # 4 cells, 3 to 6 replications
    spreads = {
        ("torch-ddp", 1): 0.001,  # meets the target: none more
        ("torch-ddp", 2): 0.06,  # a few more
        ("horovod-torch", 1): 0.9,  # to the cap
        ("horovod-torch", 2): 0.001,
    }
    rows = replication.planned(plan, tmp_path)
    waiting = [r for r in rows if key(replication.cell_of(r)) == ("horovod-torch", 2)]
    finish(tmp_path, [r for r in rows if r not in waiting[1:]], spread_by_cell(spreads))
    planned, forecast = replication.forecast(plan, tmp_path)
    assert [r.path for r in planned] == [r.path for r in rows]
    more = {key(c): n for c, n in forecast.items()}
    assert more[("torch-ddp", 1)] == (0, 0)
    assert more[("horovod-torch", 1)] == (3, 3)
    assert more[("torch-ddp", 2)][0] == more[("torch-ddp", 2)][1]
    assert more[("horovod-torch", 2)] == (0, 3)  # 2 of its 3 done: the cap's 3 at most
    finish(tmp_path, waiting[1:], spread_by_cell(spreads))
    now = {key(c): n for c, n in replication.forecast(plan, tmp_path)[1].items()}
    first = replication.write_round(plan, tmp_path, 0)
    assert now == {key(c["cell"]): (c["add"], c["add"]) for c in first["cells"]}
    rows, more = replication.forecast(plan, tmp_path)
    assert not more and len(rows) == 12 + len(first["add"])
