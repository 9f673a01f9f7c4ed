"""The second stage: the follow-up rule on a constructed study where the
answer is known, the follow-up design it writes, and a real two-stage run
of a tiny design (first stage, follow-up design, follow-up run, its report
linking back with the tracing cost per cell)."""

import subprocess
import sys

import pandas as pd
import pytest
import yaml

from analysis import followup
from conftest import REPO, ddlc, tiny_design, write_design
from ddlcompare.plan import design

# images/s per (framework, procs_per_node, batch_size)
THROUGHPUT = {
    ("torch-ddp", 1, 32): 100,
    ("torch-ddp", 2, 32): 190,
    ("torch-ddp", 4, 32): 300,
    ("horovod-torch", 1, 32): 95,
    ("horovod-torch", 2, 32): 120,
    ("horovod-torch", 4, 32): 310,
}


def constructed():
    d = design.parse(
        {
            "name": "study",
            "factors": {
                "framework": ["torch-ddp", "horovod-torch"],
                "procs_per_node": [1, 2, 4],
                "batch_size": [32],
            },
            "replications": 2,
        }
    )
    runs = pd.DataFrame(
        [
            {
                "run_id": f"{f}-{p}-{r}",
                "status": "ok",
                "framework": f,
                "nodes": 1,
                "procs_per_node": p,
                "world_size": p,
                "batch_size": b,
                "dataset": "fashion-mnist",
                "images_per_s": y + r,
            }
            for (f, p, b), y in THROUGHPUT.items()
            for r in (0, 1)
        ]
    )
    found = pd.DataFrame(
        [
            {
                "framework": f,
                "world_size": p,
                "setting": "batch_size 32",
                "bottleneck": name,
                "value": value,
                "finding": "",
            }
            for (f, p), shares in {
                ("horovod-torch", 2): (0.45, 0.01),
                ("torch-ddp", 4): (0.20, 0.02),
                ("horovod-torch", 4): (0.10, 0.30),
                ("torch-ddp", 2): (0.0, 0.0),
            }.items()
            for name, value in zip(("exposed communication", "data loading"), shares)
        ]
    )
    return d, runs, found


def test_rule_picks_best_worst_most_different_and_strongest_bottleneck():
    d, runs, found = constructed()
    chosen = followup.select(d, runs, found)
    why = {(r.framework, r.procs_per_node): r.reasons for r in chosen.itertuples()}
    assert "best cell of torch-ddp" in why[("torch-ddp", 4)]
    assert "worst cell of torch-ddp" in why[("torch-ddp", 1)]
    assert "best cell of horovod-torch" in why[("horovod-torch", 4)]
    assert "worst cell of horovod-torch" in why[("horovod-torch", 1)]
    # 2 processes: 190 against 120 is the largest relative gap (37 %)
    assert "frameworks differ most here (37% apart)" in why[("horovod-torch", 2)]
    assert "frameworks differ most here" in why[("torch-ddp", 2)]
    # the two strongest findings: 45 % exposed exchange, then 30 % data loading
    assert "strongest bottleneck: horovod-torch, 2 processes" in why[("horovod-torch", 2)]
    assert "30 % of the step is data loading" in why[("horovod-torch", 4)]
    assert "strongest" not in why[("torch-ddp", 4)]  # 20 % is only third


def test_follow_up_design_keeps_exactly_the_chosen_cells(tmp_path):
    d, runs, found = constructed()
    runs = runs[~(runs["procs_per_node"] == 2)]  # fewer cells chosen: 1 and 4 only
    found = found[found["world_size"] != 2]
    doc = followup.design_doc(d, runs, found, tmp_path)
    follow = design.parse(doc)
    cells = {(r.factors["framework"], r.factors["procs_per_node"]) for r in follow.runs()}
    assert cells == {(f, p) for f in ("torch-ddp", "horovod-torch") for p in (1, 4)}
    assert follow.replications == 3 and doc["fixed"]["tracer"] in ("otf2", "scorep")
    assert doc["fixed"]["epochs"] == 1 and doc["fixed"]["max_steps"] == followup.STEPS
    assert doc["fixed"]["horovod_timeline"] and doc["fixed"]["torch_profiler"]
    assert "fit_step_phases" not in doc["fixed"]  # no framework here owns its step
    assert followup.instruments(["tarantella", "torch-ddp"])["fit_step_phases"] is True
    assert doc["follow_up"]["rule"] == followup.RULE
    assert doc["follow_up"]["name"] == "study" and len(doc["follow_up"]["cells"]) == 4


def test_run_budget_keeps_the_most_telling_cells(tmp_path):
    d, runs, found = constructed()
    doc = followup.design_doc(d, runs, found, tmp_path, max_runs=10)  # 3 cells of 3 runs
    kept = [(c["framework"], c["procs_per_node"]) for c in doc["follow_up"]["cells"]]
    # best cells first (the one that is also a bottleneck before the other),
    # then the strongest bottleneck; the largest difference and worst cells go
    assert kept == [("horovod-torch", 4), ("torch-ddp", 4), ("horovod-torch", 2)]
    left = {(c["framework"], c["procs_per_node"]) for c in doc["follow_up"]["left_out"]}
    assert left == {("torch-ddp", 2), ("torch-ddp", 1), ("horovod-torch", 1)}
    assert len(design.parse(doc).runs()) == 9 and doc["follow_up"]["max_runs"] == 10
    # the default budget: as many runs as the first stage planned (12: 4 cells)
    assert len(followup.design_doc(d, runs, found, tmp_path)["follow_up"]["cells"]) == 4
    with pytest.raises(ValueError, match="raise --max-runs or lower --replications"):
        followup.design_doc(d, runs, found, tmp_path, max_runs=2)
    # the follow-up's report names the cells the budget left out
    from types import SimpleNamespace

    follow = design.parse(doc, str(tmp_path / "study-follow-up.yaml"))
    html = followup.section(SimpleNamespace(design=follow, runs=runs)).html()
    assert "cells the rule chose but the budget of 10 runs left out" in html
    assert "worst cell of torch-ddp" in html


def test_a_follow_up_finds_its_first_stage_after_both_move(tmp_path):
    """The record's paths are relative to the design's folder: a committed
    design, or a clone elsewhere, still finds the first stage's tables."""
    import dataclasses
    import shutil
    from types import SimpleNamespace

    d, runs, found = constructed()
    study = tmp_path / "study"
    tables = study / "results" / "cfg" / "tables"
    tables.mkdir(parents=True)
    (study / "designs").mkdir()
    runs.to_parquet(tables / "runs.parquet")
    d = dataclasses.replace(d, source=str(study / "designs" / "study.yaml"))
    doc = followup.located(followup.design_doc(d, runs, found, tables), study / "designs")
    assert doc["follow_up"]["design"] == "study.yaml"
    assert doc["follow_up"]["tables"] == "../results/cfg/tables"
    (study / "designs" / "study-follow-up.yaml").write_text(yaml.safe_dump(doc))
    shutil.move(study, tmp_path / "clone")
    follow = design.load(tmp_path / "clone" / "designs" / "study-follow-up.yaml")
    html = followup.section(SimpleNamespace(design=follow, runs=runs)).html()
    assert "tracing cost per cell" in html and "tables are gone" not in html


def test_follow_up_without_tables_is_one_clear_message(tmp_path):
    path = write_design(tmp_path, tiny_design())
    out = ddlc("follow-up", "--design", str(path), "--tables", str(tmp_path / "nothing"))
    assert out.returncode == 2
    assert "no runs.parquet; run the first stage" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_two_stages_run_for_real(tmp_path):
    doc = tiny_design(frameworks=("torch-ddp",), procs=(1, 2))
    write_design(tmp_path, doc)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "front.cli",
            "two-stage",
            "--design",
            str(tmp_path / "design.yaml"),
            "--results",
            str(tmp_path / "results"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    follow = yaml.safe_load((tmp_path / "design-follow-up.yaml").read_text())
    assert follow["follow_up"]["name"] == "tiny" and follow["replications"] == 3
    assert follow["follow_up"]["design"] == "design.yaml"  # beside the follow-up's design
    assert follow["follow_up"]["tables"].startswith("results/tiny/cfg~")
    first = next((tmp_path / "results" / "tiny").rglob("report.html"))
    second = next((tmp_path / "results" / "tiny-follow-up").rglob("report.html"))
    page = second.read_text()
    assert first.resolve().as_uri() in page  # links back to the first stage
    assert "tracing cost per cell" in page and "tracing_cost" in page
    assert (second.parent / "summary.md").exists()
    runs = pd.read_parquet(second.parent / "tables" / "runs.parquet")
    assert (runs["status"] == "ok").all() and runs["torch_profiler"].all()
