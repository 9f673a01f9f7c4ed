"""Damaged results, for real: a run trained once, then its files damaged the
ways a full disk, a cut copy or a careless edit damage them. Each damaged run
is "damaged" in the tables with the file and the problem, never "ok"; nothing
crashes; the tables are built again when files change and kept when the
collect fails; damaged runs run again on request."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, TABLES_ONLY, ddlc, tiny_design, write_design
from ddlcompare.plan import design
from ddlcompare.run import runner
from test_workflow import snakemake


@pytest.fixture
def trained(tiny_trained) -> tuple[Path, design.Design]:
    """One real 2-rank run, trained once for the whole session (conftest)."""
    return tiny_trained


def copy_of(trained, tmp_path) -> tuple[Path, design.Design, Path]:
    results, plan = trained
    shutil.copytree(results, tmp_path / "r")
    return tmp_path / "r", plan, tmp_path / "r" / plan.runs()[0].path


def text_in_a_number(tsv: str) -> str:
    lines = [line.split("\t") for line in tsv.splitlines()]
    lines[1][1] = "fast"
    return "\n".join("\t".join(cells) for cells in lines) + "\n"


def loop(path: Path) -> None:
    """A damage: the file replaced by a link to itself."""
    path.unlink()
    path.symlink_to(path.name)


def edit(key: str, value):
    """A damage: the JSON file's ``key`` set to ``value``."""
    return lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), key: value}))


DAMAGE = [
    ("metrics.json", lambda f: f.write_text('["a", "list"]'), "metrics.json: the file:"),
    ("metrics.json", lambda f: f.write_text(f.read_text()[:40]), "metrics.json: not valid JSON"),
    ("metrics.json", lambda f: f.write_text(""), "metrics.json: empty"),
    (
        "metrics.json",
        lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "images_per_s": "fast"})),
        "metrics.json: images_per_s: 'fast' is not of type",
    ),
    (
        "metrics.json",
        lambda f: f.write_text(
            f.read_text().replace('"images_per_s": ', '"images_per_s": NaN, "x": ')
        ),
        "metrics.json: images_per_s is not a finite number",
    ),
    ("done.json", lambda f: f.write_text('"ok"'), "done.json: the file: 'ok' is not of type"),
    ("done.json", lambda f: f.write_text('["ok"]'), "done.json: the file:"),
    ("steps.rank1.tsv", lambda f: f.unlink(), "steps.rank1.tsv: missing"),
    (
        "steps.rank0.tsv",
        lambda f: f.write_text(f.read_text().splitlines()[0] + "\n"),
        "steps.rank0.tsv: no rows",
    ),
    (
        "epochs.tsv",
        lambda f: f.write_text(text_in_a_number(f.read_text())),
        "epochs.tsv: row 2, column wall_s: 'fast' is not a number",
    ),
    ("epochs.tsv", lambda f: f.unlink(), "epochs.tsv: missing"),
    ("run.json", lambda f: f.write_text("{"), "run.json: not valid JSON"),
    ("rank1.json", lambda f: f.write_text("[]"), "rank1.json: the file:"),
    (
        "energy.json",
        lambda f: f.write_text('{"status": 3, "joules": null}'),
        "energy.json: status: 3 is not of type",
    ),
    # Each file sound alone, but not with the others: cut at a line boundary,
    # a row dropped, a figure or a setting edited.
    ("steps.rank1.tsv", lambda f: keep_lines(f, 3), "steps.rank1.tsv: 2 step rows in epoch 1"),
    ("steps.rank0.tsv", lambda f: keep_lines(f, -1), "steps.rank0.tsv: 11 step rows in epoch 2"),
    ("epochs.tsv", lambda f: keep_lines(f, 2), "epochs.tsv: epochs 1, but metrics.json says 2"),
    (
        "metrics.json",
        lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "epochs_done": 3})),
        "epochs.tsv: epochs 1, 2, but metrics.json says 3",
    ),
    (
        "metrics.json",
        lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "steps_per_epoch": 5})),
        "steps.rank0.tsv: 12 step rows in epoch 1, but metrics.json says 5 steps per epoch",
    ),
    (
        "config.json",
        lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "batch_size": 64})),
        "config.json: not this run's settings",
    ),
    # counts the checks count with: a float, or beyond what a count holds
    ("metrics.json", edit("epochs_done", 2.0), "metrics.json: epochs_done: 2.0 is not of type"),
    ("metrics.json", edit("steps_per_epoch", 1e308), "metrics.json: steps_per_epoch: 1e+308 is"),
    ("metrics.json", edit("epochs_done", 10**30), "metrics.json: epochs_done: 10000"),
    # what the tables hold: 64-bit numbers, the conditions as run.json writes them
    ("metrics.json", edit("images_per_s", 10**30), "metrics.json: images_per_s is not a finite"),
    ("run.json", edit("conditions", "x"), "run.json: conditions: 'x' is not of type"),
    ("run.json", edit("conditions", {"ranks_per_node": ["a"]}), "run.json: conditions.ranks_per"),
    # a file that is a link to itself is there, unreadable: never taken for absent
    ("done.json", loop, "done.json: cannot be read"),
    ("config.json", loop, "config.json: not valid JSON"),
    ("energy.json", loop, "energy.json: cannot be read"),
    # the largest count: said in one line, without a list or table that long
    (
        "metrics.json",
        edit("epochs_done", 2**31 - 1),
        "epochs.tsv: epochs 1, 2, but metrics.json says 2147483647",
    ),
    ("phases.parquet", lambda f: f.write_bytes(b"PAR1" + bytes(100)), "phases.parquet: damaged"),
    # a rank's steps file beyond the run's world (copied in from a larger run)
    (
        "steps.rank1.tsv",
        lambda f: shutil.copy(f, f.with_name("steps.rank7.tsv")),
        "steps.rank7.tsv: rank 7 in a run of 2",
    ),
]


def keep_lines(path: Path, n: int) -> None:
    """The file cut at a line boundary: its first n lines (n < 0: all but -n)."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:n]))


@pytest.mark.slow
@pytest.mark.parametrize("name,damage,message", DAMAGE, ids=[m for _, _, m in DAMAGE])
def test_damaged_file_marks_the_run_damaged(trained, tmp_path, name, damage, message):
    from analysis import collect

    results, plan, folder = copy_of(trained, tmp_path)
    damage(folder / name)
    collect.write_tables(plan, results, tmp_path / "tables")
    runs = pd.read_parquet(tmp_path / "tables" / "runs.parquet")
    assert list(runs["status"]) == ["damaged"]
    assert message in runs["reason"][0], runs["reason"][0]
    assert runs["images_per_s"].isna().all()
    assert len(pd.read_parquet(tmp_path / "tables" / "step_stats.parquet")) == 0
    assert runner.damaged_runs(plan.runs(), results)[0][1].split(":")[0] == message.split(":")[0]


@pytest.mark.slow
def test_sound_copy_is_ok(trained, tmp_path):
    from analysis import collect

    results, plan, _ = copy_of(trained, tmp_path)
    collect.write_tables(plan, results, tmp_path / "tables")
    runs = pd.read_parquet(tmp_path / "tables" / "runs.parquet")
    assert list(runs["status"]) == ["ok"] and (runs["images_per_s"] > 0).all()
    assert runner.damaged_runs(plan.runs(), results) == []


@pytest.mark.slow
def test_a_copy_beside_a_ranks_steps_file_is_no_ranks_file(trained, tmp_path):
    """steps.rank0.old.tsv (a copy kept by hand) matches the steps files'
    pattern but is no rank's: the tables count rank 0's steps once."""
    from analysis import collect

    results, plan, folder = copy_of(trained, tmp_path)
    collect.write_tables(plan, results, tmp_path / "sound")
    shutil.copy(folder / "steps.rank0.tsv", folder / "steps.rank0.old.tsv")
    (folder / "steps.rank.tsv").write_text("epoch\tstep\n")
    collect.write_tables(plan, results, tmp_path / "tables")
    for table in ("runs", "step_stats", "step_phases"):
        sound = pd.read_parquet(tmp_path / "sound" / f"{table}.parquet")
        read = pd.read_parquet(tmp_path / "tables" / f"{table}.parquet")
        assert len(read) == len(sound), table
    assert runner.damaged_runs(plan.runs(), results) == []


@pytest.mark.slow
def test_workflow_reports_damage_rebuilds_tables_and_reruns_on_request(trained, tmp_path):
    """The workflow over the session's real run (the same design, so its
    run is found finished and kept: test_workflow's end-to-end test trains
    through the workflow) finds it damaged once a file of it goes, rebuilds
    its tables and report, and trains it again on request."""
    doc = tiny_design()
    write_design(tmp_path, doc)
    shutil.copytree(trained[0], tmp_path / "results")  # times kept
    plan = design.parse(doc, str(tmp_path / "design.yaml"))
    folder = tmp_path / "results" / plan.runs()[0].path
    trained_at = (folder / "train.log").stat().st_mtime_ns
    first = snakemake(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (folder / "train.log").stat().st_mtime_ns == trained_at  # not trained again
    tables = tmp_path / "results" / plan.root / "tables"

    (folder / "steps.rank1.tsv").unlink()  # tables are rebuilt when run files change
    second = snakemake(tmp_path)
    assert second.returncode != 0 and "Traceback" not in second.stderr
    runs = pd.read_parquet(tables / "runs.parquet")
    assert list(runs["status"]) == ["damaged"]
    assert "steps.rank1.tsv: missing" in runs["reason"][0]
    report = (tmp_path / "results" / plan.root / "report.html").read_text()
    assert "steps.rank1.tsv: missing" in report and "0 of 1 runs ok" in report

    (folder / "done.json").write_text('["a", "list"]')  # plans still work
    dry = snakemake(tmp_path, "-n")
    assert dry.returncode == 0 and "Traceback" not in dry.stderr
    assert "1 run(s) with damaged results" in dry.stderr and "rerun_damaged=1" in dry.stderr

    again = snakemake(tmp_path, "rerun_damaged=1", *TABLES_ONLY)  # its tables are checked
    assert again.returncode == 0, again.stderr[-3000:]
    assert list(pd.read_parquet(tables / "runs.parquet")["status"]) == ["ok"]
    kept = folder / "attempts" / "1"
    assert (kept / "done.json").read_text() == '["a", "list"]'


@pytest.mark.slow
def test_a_finished_run_whose_done_marker_was_lost_is_not_trained_again(trained, tmp_path):
    """Snakemake removes the output of a job it interrupted, even one whose
    run had just finished: the runner finds the finished run and keeps it."""
    results, plan, folder = copy_of(trained, tmp_path)
    done = json.loads((folder / "done.json").read_text())
    log = (folder / "train.log").stat().st_mtime_ns
    (folder / "done.json").unlink()
    assert runner.execute(plan.runs()[0], results) == 0
    assert json.loads((folder / "done.json").read_text()) == done
    assert (folder / "train.log").stat().st_mtime_ns == log and not (folder / "attempts").exists()
    (folder / "done.json").unlink()  # a damaged one is trained again
    keep_lines(folder / "steps.rank1.tsv", 3)
    other = design.parse(tiny_design(epochs=1), "tiny.yaml").runs()[0]
    assert runner._finished_ok(other, folder) is False  # another run's settings
    assert runner._finished_ok(plan.runs()[0], folder) is False


@pytest.mark.slow
def test_ddlc_check_lists_and_requeues_damaged_runs(trained, tmp_path):
    results, plan, folder = copy_of(trained, tmp_path)
    path = write_design(tmp_path, tiny_design())
    (folder / "metrics.json").write_text("[]")
    listed = ddlc("check", "--design", str(path), "--results", str(results))
    assert listed.returncode == 1
    assert f"damaged: {plan.runs()[0].path}: metrics.json" in listed.stdout
    queued = ddlc("check", "--design", str(path), "--results", str(results), "--rerun")
    assert queued.returncode == 0 and not (folder / "done.json").exists()
    assert (folder / "attempts" / "1" / "metrics.json").read_text() == "[]"


@pytest.mark.slow
def test_three_checks_rerun_at_once_each_say_what_they_moved(trained, tmp_path):
    """Three `ddlc check --rerun` at once on one damaged run: the run's files
    are moved once, into one attempts folder, and each command counts only
    what it moved itself (all three said "moved" before)."""
    results, plan, folder = copy_of(trained, tmp_path)
    path = write_design(tmp_path, tiny_design())
    (folder / "metrics.json").write_text("[]")
    command = [*DDLC, "check", "--rerun", "--design", str(path), "--results", str(results)]
    checks = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in "abc"]
    lines = [check.communicate(timeout=300)[0].splitlines()[-1] for check in checks]
    assert all(check.returncode == 0 for check in checks), lines
    moved = [re.search(r"; (\d+) run\(s\) moved to attempts/", line) for line in lines]
    assert sum(int(m[1]) for m in moved if m) == 1, lines
    for line, m in zip(lines, moved):
        damaged = int(re.search(r", (\d+) damaged", line)[1])
        assert (m is None) == (damaged == 0), line  # a run seen damaged is moved or said gone
        if m and m[1] == "0":
            assert "(1 moved or deleted by another command meanwhile)" in line, line
    assert [p.name for p in (folder / "attempts").iterdir()] == ["1"]
    assert (folder / "attempts" / "1" / "metrics.json").read_text() == "[]"


@pytest.mark.parametrize("where", ["missing", "a file"])
def test_ddlc_check_of_no_results_folder_is_an_error(tmp_path, where):
    path = write_design(tmp_path, tiny_design())
    results = tmp_path / "res"
    if where == "a file":
        results.write_text("x")
    out = ddlc("check", "--design", str(path), "--results", str(results))
    assert out.returncode == 2 and out.stderr.startswith(f"error: --results {results}: ")
    assert "0 checked" not in out.stdout


# Each table of the tables folder, and the commands that read it.
READERS = {
    "runs": "report figures",
    "step_phases": "report figures",
    "phases": "report",
    "epochs": "figures",
    "step_stats": "report",
}


@pytest.mark.slow
@pytest.mark.parametrize("table", READERS)
def test_a_damaged_table_is_one_line_for_its_readers_and_check(trained, tmp_path, table):
    from analysis import collect

    results, plan, _ = copy_of(trained, tmp_path)
    path = write_design(tmp_path, tiny_design())
    tables = results / plan.root / "tables"
    collect.write_tables(plan, results, tables)
    (tables / f"{table}.parquet").write_bytes((tables / f"{table}.parquet").read_bytes()[:-30])
    commands = {
        "report": [
            *DDLC,
            "report",
            "--design",
            str(path),
            "--tables",
            str(tables),
            "--out",
            str(tmp_path / "r.html"),
        ],
        "figures": [sys.executable, "-m", "analysis.figures", str(tables)],
    }
    for reader in READERS[table].split():
        done = subprocess.run(commands[reader], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (reader, done.stderr)
        assert done.stderr.count("\n") == 1 and f"{table}.parquet: damaged table" in done.stderr
    checked = ddlc("check", "--design", str(path), "--results", str(results))
    assert checked.returncode == 1 and f"{table}.parquet: damaged table" in checked.stdout


@pytest.mark.slow
def test_a_table_edited_to_hold_text_where_numbers_belong_is_one_line(trained, tmp_path):
    """Each table collect builds, with a column the analysis computes on
    rewritten as the other kind (a hand edit: "fast" for a throughput, a
    number for a framework): its readers refuse it naming the column, and
    report and follow-up say so in one line, never a mean of words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis import collect
    from runfiles import names, tables

    results, plan, _ = copy_of(trained, tmp_path)
    path = write_design(tmp_path, tiny_design())
    built = results / plan.root / "tables"
    collect.write_tables(plan, results, built)
    edited = 0
    for table in sorted(built.glob("*.parquet")):
        arrow = pq.read_table(table)
        for i, field in enumerate(arrow.schema):
            kind = names.column_kind(table.name, field.name)
            if kind is None or pa.types.is_null(field.type):
                continue
            other = pa.array(["fast"] * len(arrow) if kind == "numbers" else [1] * len(arrow))
            other = other.cast(pa.string() if kind == "numbers" else pa.int64())  # typed when empty
            copy = tmp_path / "edited" / f"{table.stem}-{field.name}" / table.name
            copy.parent.mkdir(parents=True)
            pq.write_table(arrow.set_column(i, field.name, other), copy)
            for read in (tables.check_table, tables.read_table):
                with pytest.raises(tables.Damaged, match=f"{table.name}: column {field.name} "):
                    read(copy)
            edited += 1
    assert edited > 20  # the tables' columns of every kind, not a few
    runs = pq.read_table(built / "runs.parquet")
    i = runs.schema.get_field_index("images_per_s")
    fast = pa.array(["fast"] * len(runs))
    pq.write_table(runs.set_column(i, "images_per_s", fast), built / "runs.parquet")
    for command, out in (("report", "r.html"), ("follow-up", "f.yaml")):
        args = ["--design", str(path), "--tables", str(built), "--out", str(tmp_path / out)]
        done = ddlc(command, *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert "runs.parquet: column images_per_s holds string, not numbers" in done.stderr
        assert not (tmp_path / out).exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, damage, said",
    [
        ("steps.rank0.tsv", lambda b: b + b"\xff\xfe\t\n", "steps.rank0.tsv: cannot be read as"),
        ("steps.rank0.tsv", lambda b: b"a\tb\n1\t2\n", "steps.rank0.tsv: column epoch missing"),
        ("intervals.rank0.tsv", lambda b: b"\xb6" * 300, "intervals.rank0.tsv: cannot be read as"),
        (
            "intervals.rank0.tsv",
            lambda b: b"epoch\tstart_ns\tend_ns\n1\tsoon\t2\n",
            "intervals.rank0.tsv: row 2, column start_ns: 'soon' is not a number",
        ),
    ],
)
def test_the_timeline_of_a_run_with_a_damaged_steps_file_is_one_line(
    trained, tmp_path, name, damage, said
):
    """The timeline reads a run folder no check has passed: a steps or
    intervals file overwritten with bytes, another table or words is one
    line naming the run, the file and the way out, never a traceback."""
    results, plan, _ = copy_of(trained, tmp_path)
    folder = results / plan.runs()[0].path
    (folder / name).write_bytes(damage((folder / name).read_bytes()))
    done = ddlc("timeline", str(folder), "-o", str(tmp_path / "t.json"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {folder}: ") and said in done.stderr, done.stderr
    assert "ddlc check --rerun" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, said", [("link out", "leads out of"), ("file", "where a folder is expected")]
)
def test_figures_are_never_drawn_through_a_link_out_of_the_tables(trained, tmp_path, kind, said):
    """tables/figures a link to a folder outside the results (or a file):
    the report and the figures step refuse it in one line naming it, and
    draw nothing there (the report drew the critical path through it)."""
    from analysis import collect

    results, plan, _ = copy_of(trained, tmp_path)
    path = write_design(tmp_path, tiny_design())
    tables = results / plan.root / "tables"
    collect.write_tables(plan, results, tables)
    outside = tmp_path / "outside"
    outside.mkdir()
    if kind == "link out":
        (tables / "figures").symlink_to(outside)
    else:
        (tables / "figures").write_text("x")
    report = [*DDLC, "report", "--design", str(path), "--tables", str(tables)]
    for command in (
        [*report, "--out", str(tmp_path / "r.html")],
        [sys.executable, "-m", "analysis.figures", str(tables)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {tables / 'figures'}: ") and said in last, last
    assert list(outside.iterdir()) == [] and not (tmp_path / "r.html").exists()


DDLC = [sys.executable, "-m", "front.cli"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "factors",
    [{"epochs": [2]}, {"compression": ["none"]}, {"epochs": [2, 3], "compression": ["none"]}],
    ids=["a fixed setting made a factor", "a default made a factor", "and a new level"],
)
def test_a_finished_run_is_found_again_by_its_settings(trained, tmp_path, monkeypatch, factors):
    """The folder names change when a setting becomes a factor; the run is
    what it ran: the workflow moves it to its new folder instead of training
    it again, and only the new level is left to run."""
    from ddlcompare.plan import yaml_safe
    from front import workflow_support as ws
    from runfiles import ownership

    for name in (ownership.WORKFLOW_ENV, yaml_safe.DIGEST_ENV):  # prepare sets them
        monkeypatch.setenv(name, "")
    results, plan, old = copy_of(trained, tmp_path)
    log = (old / "train.log").stat().st_mtime_ns
    doc = tiny_design()
    doc["factors"].update(factors)
    doc["fixed"] = {k: v for k, v in doc["fixed"].items() if k not in factors}
    path = write_design(tmp_path, doc)
    new = design.parse(doc, str(path))
    assert new.runs()[0].path != plan.runs()[0].path
    ws.prepare(str(path), results, main=True, dryrun=False)
    same = next(r for r in new.runs() if r.config["epochs"] == 2)
    folder = results / same.path
    assert (folder / "train.log").stat().st_mtime_ns == log and not old.exists()
    assert runner.damaged_runs(new.runs(), results) == []
    assert json.loads((folder / "config.json").read_text())["run_id"] == same.run_id
    record = json.loads((folder / "run.json").read_text())
    assert record["moved_from"] == plan.runs()[0].path and record["run_id"] == same.run_id
    left = [r for r in new.runs() if not (results / r.path / "done.json").exists()]
    assert [r.config["epochs"] for r in left] == ([3] if len(new.runs()) == 2 else [])


@pytest.mark.parametrize("workflow_ok", [True, False])
def test_the_last_line_says_when_the_workflow_stopped(tmp_path, capsys, workflow_ok):
    """Every run ok, but an analysis job failed: the last line does not read
    as a success."""
    from front import workflow_support as ws

    rows = design.parse(tiny_design(procs=(1, 2)), "tiny.yaml").runs()
    for row in rows:
        (tmp_path / row.path).mkdir(parents=True)
        marker = {"status": "ok", "exit_status": 0, "reason": None, "run_id": row.run_id}
        (tmp_path / row.path / "done.json").write_text(json.dumps(marker))
    ws.finish(rows, tmp_path, tmp_path / "tables", tmp_path / "report.html", {}, workflow_ok)
    last = capsys.readouterr().err.splitlines()[-1]
    if workflow_ok:
        assert last == "2 ok"
    else:
        assert last.startswith("2 ok, but the workflow stopped before its end")


def test_a_dry_run_names_the_runs_it_would_queue_again_and_moves_nothing(tmp_path, monkeypatch):
    """A failed run and a damaged one (with rerun_damaged=1): a dry run
    leaves both in place and returns their paths, which the Snakefile plans
    (workflows/runs.smk, the requeue rule); a real invocation moves them and
    returns none."""
    from ddlcompare.plan import yaml_safe
    from front import workflow_support as ws
    from runfiles import ownership

    for name in (ownership.WORKFLOW_ENV, yaml_safe.DIGEST_ENV):  # prepare sets them
        monkeypatch.setenv(name, "")
    path = write_design(tmp_path, tiny_design(procs=(1, 2)))
    failed, damaged = design.parse(tiny_design(procs=(1, 2)), str(path)).runs()
    results = tmp_path / "results"
    for row, text in ((failed, json.dumps({"status": "failed", "run_id": failed.run_id})),
                      (damaged, "{cut sho")):  # fmt: skip
        (results / row.path).mkdir(parents=True)
        (results / row.path / "done.json").write_text(text)
    options = {"rerun_damaged": "1"}
    _, _, requeued = ws.prepare(str(path), results, main=True, dryrun=True, options=options)
    assert requeued == {failed.path, damaged.path}
    assert all((results / r.path / "done.json").exists() for r in (failed, damaged))
    _, _, requeued = ws.prepare(str(path), results, main=True, dryrun=False, options=options)
    assert requeued == set()
    assert not any((results / r.path / "done.json").exists() for r in (failed, damaged))
