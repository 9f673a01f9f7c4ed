"""Tarantella's phase recording (fit_step_phases) is off by default and on
where a design asks for it, the default design included; the report says
beside Tarantella's phases, and in every section that lacks them because
the recording was off, whether its runs recorded them and what that costs,
linking to the one place the figure is stated (docs/tracing.md). On
constructed tables: a design of torch-ddp and Tarantella, with Tarantella's
steps in phases or whole."""

import html
import json
import re

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, step_phase_rows, tiny_design
from analysis import bottlenecks, cells, collect, explain, phase_recording, report, spread, summary
from analysis.collect import PHASE_COLUMNS
from analysis.page import Context
from analysis.section import plain
from ddlcompare.plan import design
from ddlcompare.plan.params import PARAMS
from runfiles.tables import read_runs, read_table

MS = 1_000_000
STEPS = 20
PHASE_MS = {"data_load": 2, "forward": 10, "backward": 20, "grad_comm": 3, "optimizer": 2}


def test_off_by_default_and_asked_for_by_the_default_design():
    assert PARAMS["fit_step_phases"].default is False
    runs = design.load(REPO / "design.yaml").runs()
    tarantella = [r for r in runs if r.config["framework"] == "tarantella"]
    others = [r for r in runs if r.config["framework"] != "tarantella"]
    assert tarantella and others
    assert all(r.config["fit_step_phases"] for r in tarantella)
    # a level of Tarantella's folders only: the other runs' stay as they were
    assert all("/fit_step_phases~true/" in r.path for r in tarantella)
    assert not any(r.config["fit_step_phases"] or "fit_step_phases" in r.path for r in others)
    (row,) = design.parse(tiny_design(["tarantella"]), "t.yaml").runs()
    assert row.config["fit_step_phases"] is False


def test_asked_where_no_run_owns_its_step_is_refused_by_name():
    with pytest.raises(design.DesignError) as refused:
        design.parse(tiny_design(["torch-ddp"], fit_step_phases=True), "t.yaml")
    assert "fit_step_phases: True applies to frameworks whose own fit runs the step" in str(
        refused.value
    )


def test_a_setting_acting_on_some_frameworks_is_no_level_of_the_others():
    """The default design's runs: Tarantella's ask for phases, the others
    hold the default; that is no setting a cell differs by."""
    d = design.load(REPO / "design.yaml")
    runs = pd.DataFrame([collect.run_row(d, row, REPO / "no-results") for row in d.runs()])
    assert set(cells.with_setting(runs)["setting"]) == {"batch_size 64", "batch_size 256"}
    both = pd.concat([runs, runs.assign(fit_step_phases=False)])
    assert "fit_step_phases" in cells.varied(both)  # Tarantella's runs differ: a level


def constructed(root, recorded: bool):
    """A results folder's tables: torch-ddp and Tarantella at 1 and 2
    processes, 3 replications, Tarantella's steps in phases (``recorded``)
    or whole (fit_step_phases: false)."""
    doc = {
        **tiny_design(["torch-ddp", "tarantella"], procs=(1, 2)),
        "replications": 3,
    }
    doc["fixed"] = {**doc["fixed"], "fit_step_phases": recorded, "warmup_steps": 2}
    d = design.parse(doc, "t.yaml")
    rng = np.random.default_rng(0)
    runs, phases = [], []
    for row in d.runs():
        run = collect.run_row(d, row, root / "results")
        world, framework = row.world_size, run["framework"]
        step_ms = (40 if framework == "torch-ddp" else 80) * (1.1 if world == 2 else 1)
        rate = 32 * world / step_ms * 1e3 + rng.normal(0, 5)
        run.update(  # as tests/test_report_words.py's constructed runs
            status="ok",
            exit_status=0,
            harness_commit="abc1234",
            hosts="node-1",
            version_torch="2.13.0",
            images_per_s=rate,
            time_per_epoch_s=2.0,
            init_s=1.0,
            final_test_accuracy=0.86,
            target_status="reached",
            time_to_accuracy_s=30000 / rate,
            epochs_to_accuracy=1.0,
            energy_to_accuracy_j=np.nan,
            comm_bytes_per_step=1.7e6 if world == 2 else 0.0,
        )
        runs.append(run)
        whole = framework == "tarantella" and not recorded
        for rank in range(world):
            start = 0
            for step in range(STEPS):
                timed = {"other": step_ms} if whole else PHASE_MS
                scale = step_ms / sum(timed.values()) * (1 + rng.normal(0, 0.02))
                durations = [(phase, int(ms * scale * MS)) for phase, ms in timed.items()]
                phases += step_phase_rows(run["run_id"], rank, step, start, durations)
                start = phases[-1]["end_ns"]
    tables = root / "results" / d.root / "tables"
    tables.mkdir(parents=True)
    cells.with_setting(pd.DataFrame(runs)).to_parquet(tables / "runs.parquet", index=False)
    pd.DataFrame(phases)[PHASE_COLUMNS].to_parquet(tables / "step_phases.parquet", index=False)
    ctx = Context(
        design=d,
        runs=read_runs(tables / "runs.parquet", d.factors),
        step_phases=read_table(tables / "step_phases.parquet"),
        tables=tables,
    )
    page, _ = report.render(ctx, SECTIONS)
    return page, pd.DataFrame(runs)


# The sections that show or need phases, and the spread (whole steps).
SECTIONS = [
    spread.section,
    bottlenecks.phases_section,
    bottlenecks.section,
    explain.critical_path_section,
    explain.what_if_section,
    explain.trace_diff_section,
]


def section_text(page: str, section: str) -> str:
    found = re.search(rf'<section id="{section}".*?</section>', page, re.S).group(0)
    found = re.sub(r"</(p|li|tr|h\d)>", "\n", found)
    return html.unescape(re.sub(r"<[^>]+>", "", found))


# The sections that need phases, and what each does for whole steps instead.
LACKING = {
    "bottlenecks": "no phase of its step is a finding here",
    "critical-path": "its ranks join at the whole step",
    "what-if": "the model counts its whole step as compute",
    "trace-diff": "its step is compared whole, as 'other'",
}
COST = "recording them lengthens its step, most likely by more than 1 % (measured: docs/tracing.md)"


def lines_naming(text: str, words: str) -> list[str]:
    return [line for line in text.splitlines() if words in line]


def test_the_report_says_beside_tarantellas_phases_that_they_were_recorded(tmp_path):
    page, _ = constructed(tmp_path, recorded=True)
    (line,) = lines_naming(section_text(page, "phases"), "tarantella: its phases come from")
    assert "recorded in all 6 of its runs because the design asks for them" in line
    assert "fit_step_phases: true" in line and COST in line
    for section in LACKING:  # nothing lacks: no line there
        assert not lines_naming(section_text(page, section), "whole steps only"), section
    assert phase_recording.COST_DOC.as_uri() + "#" + phase_recording.COST_ANCHOR in page


def test_each_section_lacking_tarantellas_phases_says_why_in_one_line(tmp_path):
    page, runs = constructed(tmp_path, recorded=False)
    (line,) = lines_naming(section_text(page, "phases"), "tarantella: its runs recorded")
    assert "whole steps only, no phases (fit_step_phases: false, the default)" in line
    assert COST in line and "a design asks for them with fit_step_phases: true" in line
    for section, instead in LACKING.items():
        (line,) = lines_naming(section_text(page, section), "tarantella: its runs recorded")
        assert f"the default), so {instead}" in line and COST in line, section
    # the steps themselves are kept: never 0 s
    spread = section_text(page, "spread")
    assert "tarantella" in spread and not re.search(r"tarantella[^\n]*\| 0 s", spread)
    assert not lines_naming(section_text(page, "phases"), "torch-ddp: ")  # its own loop
    # its phases were not measured: no 0 ms for them, the whole step in 'other'
    table = section_text(page, "phases")
    (whole,) = [line for line in table.splitlines() if line.startswith("tarantella2")]
    assert "0 ms" not in whole and "88" in whole
    assert "nan" not in section_text(page, "what-if")
    assert "the compute it holds fixed is not timed apart in these runs" in page


def test_the_summary_says_why_no_bottleneck_is_named():
    found = pd.DataFrame(
        [
            {"framework": f, "world_size": 2, "setting": "batch_size 64"}
            | {"bottleneck": "initialisation", "value": 0.05, "finding": ""}
            for f in ("tarantella", "tarantella-patched")
        ]
    )
    for sentence in summary.dominant_bottlenecks(found)["sentence"]:
        assert sentence.endswith(
            "it times whole steps only, so no phase can be named the bottleneck (its runs "
            "did not record them, fit_step_phases: false; recording them lengthens its step, "
            "most likely by more than 1 %: docs/tracing.md)."
        )


def test_some_runs_recorded_and_some_not():
    runs = pd.DataFrame(
        {"framework": "tarantella", "status": "ok", "fit_step_phases": [True, False, False]}
    )
    (line,) = phase_recording.lines(runs, lacking="the section does without")
    assert plain(line).startswith(
        "tarantella: 2 of its 3 runs recorded whole steps only, no phases (fit_step_phases: "
        "false, the default), so the section does without"
    )
    assert phase_recording.lines(runs.assign(fit_step_phases=True), lacking="x") == []


def test_the_link_leads_to_the_one_place_the_cost_is_stated():
    """docs/tracing.md has the section linked to, with the paired figure;
    no other document or module states that figure."""
    text = phase_recording.COST_DOC.read_text()
    headings = [
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    ]
    assert phase_recording.COST_ANCHOR in headings
    figure = "800 pairs +1.65 %"
    assert figure in re.sub(r"\s+", " ", text)
    elsewhere = [
        path
        for pattern in ("*.md", "docs/*.md", "analysis/*.py", "frameworks/*.py", "design.yaml")
        for path in REPO.glob(pattern)
        if path != phase_recording.COST_DOC
        and path.name != "CHANGES.md"
        and "+1.65 %" in path.read_text()
    ]
    assert elsewhere == []


def test_a_run_recorded_under_the_old_default_says_which_setting_differs(tmp_path):
    """A Tarantella run from before the default changed wrote
    fit_step_phases: true; a design that leaves it unset now asks false:
    not the same run, and the reason names the setting."""
    (row,) = design.parse(tiny_design(["tarantella"]), "t.yaml").runs()
    (tmp_path / "config.json").write_text(json.dumps({**row.config, "fit_step_phases": True}))
    problems = design.check_run(tmp_path, row.config)
    assert (
        "config.json: not this run's settings (fit_step_phases: True there, False in the "
        "design): a harness with other defaults wrote it, or the folder was copied or edited"
    ) in problems
    (tmp_path / "config.json").write_text(json.dumps(row.config))
    assert not [p for p in design.check_run(tmp_path, row.config) if "config.json" in p]
