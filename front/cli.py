"""ddlc: the harness's command line (the workflow calls the same commands).

ddlc plan [--design design.yaml]     the run table and its size
ddlc run-one --path P                one run (what each workflow job does)
ddlc replicate --round K             replications: auto: the next round's runs
ddlc collect / ddlc report           results tables; the HTML report
ddlc follow-up                       the second stage's design from the first's tables
ddlc two-stage                       run the design, then its follow-up (one command)
ddlc improve                         run the design, then the test of its top hypotheses
ddlc timeline RUN_DIR... -o F.json   one merged Chrome/Perfetto trace of all ranks
ddlc import TRACE_OR_FOLDER... -o F   traces from elsewhere into one phase table (Parquet)
ddlc check [--rerun]                 damaged run files, listed (and queued again)
ddlc fetch-data cifar10              download CIFAR-10 (needs internet)
ddlc envs [--design design.yaml]     the environments envs/setup.sh sets up for it
ddlc cluster up|down|status          a Slurm and OAR cluster of namespaces on this machine
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis import stage_limits
from runfiles import atomic, files
from traces.loading import converter_loading

# Each command imports what it needs when it runs: `ddlc import` needs none
# of the design's machinery (a second of imports before its first byte).
if TYPE_CHECKING:
    from ddlcompare.plan import design as design_mod
    from ddlcompare.run import progress


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""


def load_design(
    path: str, check_ready: bool = True, runs_here: bool | None = None
) -> design_mod.Design:
    from ddlcompare.plan import design as design_mod
    from ddlcompare.run import plan_checks, preflight

    try:
        design = design_mod.load(path)
    except design_mod.DesignError as exc:
        raise UserError(str(exc)) from None
    if check_ready and (found := preflight.problems(design)):
        raise UserError("\n".join(f"{path}: {p}" for p in found))
    if check_ready:
        for text in plan_checks.warnings(design, runs_here):
            print(f"warning: {path}: {text}", file=sys.stderr)
    return design


def cmd_plan(args) -> int:
    from ddlcompare.run import progress

    design = load_design(args.design, check_ready=not args.no_check)
    runs = design.runs()
    left = progress.summary(planned_so_far(design, Path(args.results)), Path(args.results))
    if args.summary:
        print(left.line())
        return 0
    factors = design.path_factors()
    widths = {f: max(len(f), *(len(str(r.factors[f])) for r in runs)) for f in factors}
    header = ["order"] + [f.ljust(widths[f]) for f in factors] + ["rep", "run_id"]
    print("  ".join(header))
    for r in runs:
        print(
            "  ".join(
                [str(r.order).rjust(5)]
                + [str(r.factors[f]).ljust(widths[f]) for f in factors]
                + [str(r.rep).rjust(3), r.run_id]
            )
        )
    cells = len({tuple(r.factors.values()) for r in runs})
    if design.fraction:
        print("\n".join(design.fraction.describe()))
    if design.sample:
        print("\n".join(design.sample.describe(design.factors)))
    if design.adaptive:
        print(adaptive_words(design.adaptive, cells))
    print(
        f"{len(runs)} runs ({cells} cells x {design.replications} replications) "
        f"in {Path(args.results, design.root)}/"
    )
    print(left.line())
    return 0


def planned_so_far(design: design_mod.Design, results: Path) -> progress.Planned:
    """The runs planned so far, with those replications: auto may add."""
    from ddlcompare.run import progress

    if not design.adaptive:
        return progress.Planned(design.runs())
    from analysis import replication  # pandas and scipy: only where the design has rounds

    return progress.Planned(*replication.forecast(design, results))


def adaptive_words(rule: design_mod.Adaptive, cells: int) -> str:
    """replications: auto's least and most runs, and the rule between."""
    return (
        f"replications auto: at least {cells * rule.least} runs ({cells} cells x "
        f"{rule.least}), at most {cells * rule.most} ({cells} cells x {rule.most}); "
        f"a cell gets more while the 95 % interval of its mean images_per_s is wider "
        f"than {rule.target_half_width * 100:g} % of the mean. The table lists the first "
        f"{rule.least} of each cell"
    )


def cmd_replicate(args) -> int:
    """One round's decision of replications: auto (the workflow's checkpoint)."""
    from analysis import replication

    design = load_design(args.design, check_ready=False)
    if not design.adaptive:
        raise UserError(f"{args.design}: replications is not auto; nothing to decide")
    if args.round >= design.adaptive.most:
        raise UserError(
            f"--round {args.round}: above the last possible round ({design.adaptive.most - 1}: "
            f"max_replications {design.adaptive.most} in {args.design})"
        )
    results = existing_folder(args.results, "--results")
    out = output_file(args.out, "--out", [args.design]) if args.out else None
    doc = replication.write_round(design, results, args.round, out)
    more = [c for c in doc["cells"] if c["add"]]
    print(
        f"round {args.round}: {len(doc['add'])} more run(s) for {len(more)} cell(s)"
        + "".join(f"\n  {c['cell']}: +{c['add']}" for c in more)
    )
    return 0


def cmd_run_one(args) -> int:
    from ddlcompare.run import progress, runner
    from runfiles import ownership

    try:
        design = load_design(args.design, check_ready=False)
    except UserError as exc:
        raise UserError(design_changed(args.design) or str(exc)) from None
    by_path = {r.path: r for r in design.runs(most=True)}
    if args.path not in by_path:
        raise UserError(design_changed(args.design) or f"{args.path}: not a run of {args.design}")
    results = Path(args.results)
    progress.announce(lambda: planned_so_far(design, results), by_path[args.path], results)
    try:
        return runner.execute(
            by_path[args.path], Path(args.results), kill_orphans=args.kill_orphans
        )
    except ownership.Busy as exc:
        raise UserError(str(exc)) from None


def design_changed(path: str) -> str | None:
    """The message for a job whose design file was edited after its workflow
    planned the campaign (the workflow records the file's digest)."""
    from ddlcompare.plan import yaml_safe

    planned = os.environ.get(yaml_safe.DIGEST_ENV)
    if not planned or yaml_safe.file_digest(path) == planned:
        return None
    return (
        f"{path}: the design changed since this campaign started (it was edited while "
        "the workflow ran); this run is no longer in it. Let the workflow end, then "
        "start it again to plan the new design"
    )


def cmd_collect(args) -> int:
    from analysis import collect, replication

    design = load_design(args.design, check_ready=False)
    results = existing_folder(args.results, "--results")
    out = output_folder(args.out, "--out")
    read = [results, *(results / r.path for r in replication.planned(design, results))]
    # realpath, not Path.resolve: a run folder that is a link to itself is
    # named by collect as damaged; resolve raised RuntimeError on it
    if any(os.path.realpath(out) == os.path.realpath(folder) for folder in read):
        raise UserError(
            f"--out {args.out}: the results folder or a run folder, whose files collect "
            "reads (a run's phases.parquet among them); give a folder of its own"
        )
    refuse_foreign_folder(out, results, "--out")
    collect.write_tables(design, results, out)
    return 0


def refuse_foreign_folder(out: Path, results: Path, option: str) -> None:
    """Tables are written within the results folder (the workflow's tables
    folder holds its logs before the first tables), into a new or empty
    folder, or over tables written before; never among other files
    elsewhere (``--out /`` wrote them into the root folder)."""
    if not out.is_dir() or out.resolve().is_relative_to(results.resolve()):
        return
    if not any(out.iterdir()) or any(out.glob("*.parquet")) or (out / "runs.csv").exists():
        return
    first = sorted(p.name for p in out.iterdir())[:3]
    raise UserError(
        f"{option} {out}: a folder of other files ({', '.join(first)}...) and no tables; "
        "give a new or empty folder, or the tables folder to write again"
    )


def cmd_report(args) -> int:
    design = load_design(args.design, check_ready=False)
    out = output_file(
        args.out, "--out", [args.design, *_files_of(args.tables)], writes="an HTML report"
    )
    # Once the arguments are found good: a refused --out costs no report's imports.
    from analysis import report

    out = report.build(design, Path(args.tables), out)
    print(f"report: {out.resolve()}")
    return 0


def default_tables(design: design_mod.Design, results: str) -> Path:
    return Path(results) / design.root / "tables"


def cmd_follow_up(args) -> int:
    from analysis import followup

    design = load_design(args.design, check_ready=False)
    tables = Path(args.tables) if args.tables else default_tables(design, args.results)
    if not (tables / "runs.parquet").exists():
        raise UserError(
            f"{tables}: no runs.parquet; run the first stage (./ddlc run) or pass --tables"
        )
    out = output_file(
        args.out or Path(args.design).with_name(f"{Path(args.design).stem}-follow-up.yaml"),
        "--out",
        [args.design, *_files_of(tables)],
    )
    try:
        doc = followup.write(design, tables, out, args.replications, args.max_runs)
    except ValueError as exc:
        raise UserError(f"{tables}: {exc}") from None
    origin = doc["follow_up"]
    print(
        f"follow-up design: {out} ({len(origin['cells'])} cells x "
        f"{doc['replications']} replications, tracer {doc['fixed']['tracer']}, "
        f"at most {doc['fixed']['max_steps']} steps each)"
    )
    if origin["left_out"]:
        print(
            f"left out for the budget of {origin['max_runs']} runs (--max-runs): "
            + "; ".join(_cell_words(cell) for cell in origin["left_out"])
        )
    print(f"rule: {followup.RULE}")
    return 0


def _cell_words(cell: dict) -> str:
    factors = ", ".join(f"{k} {v}" for k, v in cell.items() if k != "reasons")
    return f"{factors} ({cell['reasons']})"


# Snakemake's options that list, draw, lint, summarise, touch or clean
# without running a job: snakemake/cli.py's args_to_api takes each branch
# before execute_workflow.
NO_JOB_MODES = (
    "dryrun", "touch", "lint", "list_target_rules", "list_rules", "print_compilation",
    "containerize", "generate_unit_tests", "dag", "rulegraph", "filegraph", "d3dag", "unlock",
    "cleanup_metadata", "conda_cleanup_envs", "conda_create_envs_only", "list_conda_envs",
    "cleanup_shadow", "container_cleanup_images", "list_changes", "list_input_changes",
    "list_params_changes", "list_untracked", "summary", "detailed_summary", "archive",
    "delete_all_output", "delete_temp_output",
)  # fmt: skip


def snakemake_options(argv: list[str]) -> argparse.Namespace | None:
    """``argv``, Snakemake's command line, read by Snakemake's own parser;
    None for another program's, or a line Snakemake answers itself."""
    if not argv or "snakemake" not in str(argv[0]):
        return None
    from snakemake.cli import get_argument_parser

    try:
        return get_argument_parser().parse_known_args(argv[1:])[0]
    except SystemExit:  # Snakemake answers a bad command line itself
        return None


def runs_no_job(argv: list[str]) -> bool:
    """Whether ``argv``, Snakemake's command line, asks for no job to run."""
    args = snakemake_options(argv)
    if args is None:
        return False
    report_only = getattr(args, "report", None) is not None and not args.report_after_run
    return report_only or any(getattr(args, mode, None) for mode in NO_JOB_MODES)


# A config file holds a few settings; far more is no config file.
MAX_CONFIG_BYTES = 1 << 20


def configfile_problem(argv: list[str]) -> str | None:
    """Why Snakemake cannot read a --configfile of ``argv``, or None: it reads
    each before our Snakefile runs, and a FIFO (bash's <(...) included) or a
    device hangs it there, a link to /dev/zero fills its memory."""
    args = snakemake_options(argv)
    for path in (args.configfile or []) if args else []:
        try:
            files.regular(path, MAX_CONFIG_BYTES)
        except FileNotFoundError:
            return f"--configfile {path}: no such file; give a YAML or JSON file of settings"
        except files.NotRegular as exc:
            return f"--configfile {exc}; give a YAML or JSON file of settings (write it to a file)"
        except OSError as exc:
            return f"--configfile {path}: cannot be read ({exc.strerror})"
    return None


def workflow_argv(design, results, *options: str) -> list[str]:
    """Snakemake on this checkout's workflow and local profile, for one
    design and results folder (None: the workflow's own, results/ in the
    working folder): what `./ddlc run` runs; the benches and tests too.
    More --config entries may follow the list."""
    repo = Path(__file__).resolve().parent.parent
    if problem := configfile_problem(["snakemake", *options]):
        raise UserError(problem)
    return [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(repo / "Snakefile"),
        "--profile",
        str(repo / "profiles" / "local"),
        *options,
        "--config",
        f"design={design}",
        *([] if results is None else [f"results={results}"]),
    ]


def cmd_two_stage(args) -> int:
    """The study plan's two stages: the designed experiment, then its
    telling cells instrumented, each through the workflow."""
    import subprocess

    first = subprocess.run(workflow_argv(args.design, args.results, *args.snakemake))
    if first.returncode or _planned_only(args.snakemake, "the follow-up's"):
        return first.returncode
    follow = Path(args.design).with_name(f"{Path(args.design).stem}-follow-up.yaml")
    cmd_follow_up(
        argparse.Namespace(
            design=args.design,
            tables=None,
            results=args.results,
            out=str(follow),
            replications=None,
            max_runs=args.max_runs,
        )
    )
    return subprocess.run(workflow_argv(follow, args.results, *args.snakemake)).returncode


def _planned_only(options: list[str], second: str) -> bool:
    """Whether the first stage ran no job (-n, --summary...): then the
    second stage's design is neither written nor run, its tables not there."""
    if not runs_no_job(["snakemake", *options]):
        return False
    print(f"a dry run: {second} design is written once the first stage has run")
    return True


def _prediction_cell(prediction: dict) -> str:
    """Where a prediction holds, in the design's words: "2 processes",
    then any other setting that tells two cells of one world size apart."""
    others = {"world_size", "predicted_gain", "low", "high", "runs"}
    said = [
        f"{k} {int(v) if isinstance(v, float) and v.is_integer() else v}"
        for k, v in prediction.items()
        if k not in others and v is not None
    ]
    from analysis import humanize

    return ", ".join([humanize.processes(prediction["world_size"]), *said])


def cmd_improve(args) -> int:
    """The study plan's outcome: the hypotheses the first stage's evidence
    ranks highest, tested before and after as a second stage."""
    import subprocess

    from analysis import improve

    design = load_design(args.design, check_ready=False)
    tables = Path(args.tables) if args.tables else default_tables(design, args.results)
    out = output_file(
        args.out or Path(args.design).with_name(f"{Path(args.design).stem}-improve.yaml"),
        "--out",
        [args.design, *_files_of(tables)],
    )
    if not args.no_run:
        first = subprocess.run(workflow_argv(args.design, args.results, *args.snakemake))
        if first.returncode or _planned_only(args.snakemake, "the test's"):
            return first.returncode
    if not (tables / "runs.parquet").exists():
        raise UserError(f"{tables}: no runs.parquet; run the first stage (./ddlc run) first")
    try:
        doc = improve.write(design, tables, out, args.top, args.replications)
    except ValueError as exc:
        raise UserError(f"{tables}: {exc}") from None
    hypotheses = doc["follow_up"]["hypotheses"]
    for h in hypotheses:
        gains = ", ".join(
            f"{_prediction_cell(p)}: {p['predicted_gain']:.0%} "
            + (
                f"[{p['low']:.0%}, {p['high']:.0%}]"
                if p["low"] is not None
                else f"(no interval from {p['runs']} runs; {improve.MIN_PREDICTING_RUNS} give one)"
            )
            for p in h["predictions"]
        )
        print(
            f"testing {h['framework']}: {h['change']} (acts on {h['phase']}), "
            f"{h['factor']} {h['before']} -> {h['after']}; predicted gain {gains}"
        )
    fewest = min((p["runs"] for h in hypotheses for p in h["predictions"]), default=None)
    if fewest is not None and fewest < improve.MIN_PREDICTING_RUNS:
        print(
            f"note: some predictions rest on {fewest} run(s) a cell; with at least "
            f"{improve.MIN_PREDICTING_RUNS} (replications: in {args.design}) they would be "
            "narrow enough to be tested by the second stage"
        )
    print(f"improve design: {out} ({doc['replications']} replications, randomized)")
    if args.no_run:
        return 0
    return subprocess.run(workflow_argv(out, args.results, *args.snakemake)).returncode


def cmd_timeline(args) -> int:
    from analysis import timeline

    steps = None
    if args.steps:
        try:
            first, last = (int(v) for v in args.steps.split(":"))
        except ValueError:
            raise UserError(f"--steps {args.steps}: give two step numbers, A:B") from None
        if not 0 <= first <= last:
            low = max(0, min(first, last))  # the example is never the value refused
            raise UserError(
                f"--steps {args.steps}: the first step must be >= 0 and at most the last "
                f"(e.g. --steps {low}:{max(low, first, last)})"
            )
        steps = (first, last)
    # a run folder given is read whole (its phases.parquet, steps files)
    out = output_file(
        args.out,
        "-o",
        [*args.paths, *(f for p in args.paths for f in _files_of(p))],
        writes="a JSON trace",
    )
    try:
        info = timeline.export(
            args.paths, out, args.max_intervals, steps, args.align, args.keep_going
        )
    except timeline.TimelineError as exc:
        raise UserError(str(exc)) from None
    counts = info["counts"]
    print(
        f"{args.out}: {counts['processes']} processes, {counts['slices']} slices, "
        f"{counts['flows']} critical-path flows; open it in ui.perfetto.dev or chrome://tracing"
    )
    for skipped in info["skipped"]:
        print(f"skipped: {skipped}", file=sys.stderr)
    for run_id, run in info["runs"].items():
        print(f"{run_id}: clocks {run['clock_alignment']['method']}, join {run['join']}")
    if info["downsampled"]:
        d = info["downsampled"]
        print(
            f"downsampled: steps {d['steps'][0]}-{d['steps'][1]} of {d['of_steps'][0]}-"
            f"{d['of_steps'][1]} ({d['intervals']} of {d['of_intervals']} intervals)"
        )
    return 0


def cmd_import(args) -> int:
    """Traces written elsewhere (OTF2, PyTorch profiler, Horovod Timeline)
    into one phase table: what ``python -m traces.convert`` does."""
    with converter_loading():
        from traces import convert

    keep = ["--keep-going"] if args.keep_going else []
    output_file(args.out, "-o", args.paths, writes="a Parquet table")
    status = convert.main([*map(str, args.paths), "-o", args.out, *keep])
    global _ENDS_AT_ONCE
    _ENDS_AT_ONCE = True  # the table is closed and in place, its lines printed
    return status


# Set by a command whose process has nothing left to do once it returns:
# ``python -m front.cli`` then ends without the interpreter's teardown,
# which after a conversion (its modules, caches and freed memory) took some
# 0.05 to 0.08 s of CPU on one core, the last thing a user waits for
# (measured beside other work). Not when main() is called in a process
# that goes on (the tests).
_ENDS_AT_ONCE = False


def end_at_once(status: int) -> None:
    """Ends the process with ``status`` once what it printed is written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away (| head): nothing to write to
            pass
    os._exit(status)


def cmd_check(args) -> int:
    """Every finished run's files checked, each alone and against each other,
    and the design's tables; --rerun moves the damaged runs' files to
    attempts/ so that the next workflow run does them again."""
    from ddlcompare.run import runner
    from runfiles.tables import Damaged, read_table
    from runfiles import names

    design = load_design(args.design, check_ready=False)
    results = existing_folder(args.results, "--results")
    from analysis import replication

    planned = replication.planned(design, results)
    tables = default_tables(design, str(results))
    # A run or tables folder that is a file, a FIFO or a link out of the
    # results is not theirs: named, never read, moved, deleted or counted.
    places = {r.path: files.place_problem(results / r.path, results) for r in planned}
    places["tables"] = files.place_problem(tables, results)
    misplaced = [problem for problem in places.values() if problem]
    planned = [r for r in planned if not places[r.path]]
    damaged = runner.damaged_runs(planned, results)
    for problem in misplaced:
        print(f"damaged: {problem}")
    # Another `check --rerun` at the same time may move or delete first.
    moved = deleted = 0
    for row, problem in damaged:
        print(f"damaged: {row.path}: {problem}")
        if args.rerun:
            moved += runner.archive_attempt(results / row.path) is not None
    bad_tables = []
    for path in [] if places["tables"] else sorted(tables.glob("*.parquet")):
        try:
            read_table(path)
        except Damaged as exc:
            bad_tables.append(path)
            print(f"damaged: {exc}")
            if args.rerun:
                deleted += _unlinked(path)
    done = sum((results / r.path / names.DONE).exists() for r in planned)
    print(
        f"{done} finished run(s) checked, {len(damaged)} damaged"
        + (f"; {len(bad_tables)} damaged table(s) in {tables}" if bad_tables else "")
        + (
            f"; {len(misplaced)} folder(s) not a folder of the results (neither moved "
            "nor deleted: remove or rename them, and the workflow runs them again)"
            if misplaced
            else ""
        )
        + (
            rerun_outcome(len(damaged), moved, len(bad_tables), deleted)
            if args.rerun
            else "; ddlc check --rerun queues them again"
            if damaged or bad_tables
            else ""
        )
    )
    return 1 if misplaced or ((damaged or bad_tables) and not args.rerun) else 0


def _unlinked(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:  # by another command meanwhile
        return False
    return True


def rerun_outcome(damaged: int, moved: int, bad_tables: int, deleted: int) -> str:
    """What ``check --rerun`` did, counting only what this command did:
    another one at the same time may have moved a run's files first."""
    if not damaged and not bad_tables:
        return ""
    said = []
    if damaged:
        said.append(f"{moved} run(s) moved to attempts/")
    if bad_tables:
        said.append(f"{deleted} table(s) deleted")
    others = (damaged - moved) + (bad_tables - deleted)
    return f"; {', '.join(said)}: the next workflow run does them again" + (
        f" ({others} moved or deleted by another command meanwhile)" if others else ""
    )


def existing_folder(text: str, option: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise UserError(f"{option} {text}: {what}; give the folder the workflow wrote (results=)")
    return path


# What a command writes, by the first bytes of a file of that kind: an
# existing file of another kind is refused, not replaced (a slip of -o, such
# as `ddlc import trace.json -o design.yaml`, would lose the design).
WRITES = {
    "a Parquet table": (b"PAR1",),
    "an HTML report": (b"<!doctype html",),
    "a JSON trace": (b"{",),
}


def output_file(text: str | Path, option: str, inputs=(), writes: str | None = None) -> Path:
    """``-o/--out`` where a file is to be written, checked before the work:
    its folder exists, it is not a folder, a device or a FIFO, it is none
    of the command's inputs (it would replace what it reads), and a file
    already there is of the kind ``writes`` (a key of WRITES)."""
    path = Path(text)
    if not path.parent.is_dir():
        raise UserError(
            f"{option} {text}: the folder {path.parent} does not exist; create it first"
        )
    try:
        atomic.refuse_to_replace(path)
    except files.NotRegular as exc:
        raise UserError(f"{option} {exc}; give the path of a file to write") from None
    try:
        atomic.refuse_inputs(path, inputs)
    except files.NotRegular as exc:
        raise UserError(f"{option} {exc}") from None
    if own := files.harness_file(path):
        raise UserError(
            f"{option} {text}: {own}; the harness writes it, give a file outside the run "
            f"folders and tables (e.g. {option} {path.stem}-mine{path.suffix or '.out'})"
        )
    if writes and not _of_kind(path, WRITES[writes]):
        raise UserError(
            f"{option} {text}: a file there is not {writes}, which this command writes; "
            "give a new name, or remove that file first"
        )
    return path


def _of_kind(path: Path, starts: tuple[bytes, ...]) -> bool:
    """True where nothing is there yet, the file is empty, or it begins as
    a file of the kind does (letter case and leading blanks aside)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip().lower()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return not head or head.startswith(tuple(s.lower() for s in starts))


def _files_of(folder) -> list[Path]:
    """The files under ``folder`` (a tables folder an output must not replace)."""
    return [p for p in Path(folder).rglob("*") if p.is_file()] if Path(folder).is_dir() else []


def output_folder(text: str, option: str) -> Path:
    """``--out`` where a folder is to be written: a folder or a new name in
    an existing folder."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {text}: not a folder; give a folder (created if missing)")
    if not path.parent.is_dir():
        raise UserError(
            f"{option} {text}: the folder {path.parent} does not exist; create it first"
        )
    return path


def check_results(text: str | None) -> None:
    """Every command's --results: a folder, or a name not made yet; never a
    file, a FIFO or a device (read as an empty campaign, it said "0 runs
    done")."""
    if text is not None and not text.strip():  # Path("") is the current folder
        raise UserError("--results is empty; give the results folder (results= of the workflow)")
    # lexists: a link to itself or to nowhere is no folder either (exists()
    # is False on both: read as an empty campaign, "0 runs done")
    if text is not None and os.path.lexists(text) and not os.path.isdir(text):
        raise UserError(
            f"--results {text}: not a folder; give the results folder (results= of the workflow)"
        )


def at_least(least: int):
    """argparse type: an integer >= ``least``."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return check


positive_int = at_least(1)


def cmd_fetch_data(args) -> int:
    from frameworks import data

    if args.data_dir and Path(args.data_dir).exists() and not Path(args.data_dir).is_dir():
        raise UserError(
            f"--data-dir {args.data_dir}: not a folder; give a folder (created if missing)"
        )
    try:
        folder = data.fetch_cifar10(args.data_dir)
    except data.DataError as exc:
        raise UserError(str(exc)) from None
    print(f"cifar10: verified and unpacked in {folder}")
    return 0


def cmd_envs(args) -> int:
    """The environments ./ddlc run sets up for the design, for envs/setup.sh."""
    from ddlcompare.plan import envs
    from ddlcompare.run import preflight
    from frameworks import registry

    design = load_design(args.design, check_ready=False)
    needed = {registry.FRAMEWORKS[n].env for n in preflight.levels(design, "framework")}
    print(" ".join(envs.for_setup(needed)))
    return 0


def cmd_cluster(args) -> int:
    from ddlcompare.run import cluster

    return cluster.main(args.action)


def first_stage_inputs(parser: argparse.ArgumentParser) -> None:
    """Where a second stage (follow-up, improve) finds the first's runs."""
    parser.add_argument("--results", default="results")
    parser.add_argument("--tables", help="the first stage's tables (default: its results)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddlc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, fn, help_text):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--design", default="design.yaml", help="design file (design.yaml)")
        s.set_defaults(fn=fn)
        return s

    plan = command("plan", cmd_plan, "print the run table and its size")
    plan.add_argument("--no-check", action="store_true", help="skip data/environment checks")
    plan.add_argument("--results", default="results", help="the runs done so far (results)")
    plan.add_argument(
        "--summary", action="store_true", help="only the runs done, to do, and the time left"
    )
    one = command("run-one", cmd_run_one, "execute one run of the design")
    one.add_argument("--path", required=True, help="the run's path under the results folder")
    one.add_argument("--results", default="results")
    one.add_argument(
        "--kill-orphans",
        action="store_true",
        help="stop an earlier attempt still training in the run folder",
    )
    rnd = command("replicate", cmd_replicate, "decide a round of replications: auto")
    rnd.add_argument("--results", default="results")
    rnd.add_argument(
        "--round", type=at_least(0), required=True, help="the round just done (0: the first)"
    )
    rnd.add_argument("--out", help="the decision's file (default: results/<design>/replication/)")
    col = command("collect", cmd_collect, "gather every run into the results tables")
    col.add_argument("--results", default="results")
    col.add_argument("--out", required=True, help="folder for the tables")
    rep = command("report", cmd_report, "build the HTML report from the tables")
    rep.add_argument("--tables", required=True)
    rep.add_argument("--out", required=True)
    follow = command(
        "follow-up", cmd_follow_up, "write the second stage's design from a finished study's tables"
    )
    first_stage_inputs(follow)
    follow.add_argument("--out", help="the follow-up design (default: <design>-follow-up.yaml)")
    follow.add_argument(
        "--replications",
        type=positive_int,
        help="runs per chosen cell (default: the first stage's + 1, at least "
        f"{stage_limits.FOLLOW_UP_MIN_REPLICATIONS})",
    )
    budget = dict(
        type=positive_int,
        help="at most this many follow-up runs (default: as many as the first stage's, at least one cell)",
    )
    follow.add_argument("--max-runs", **budget)
    two = command("two-stage", cmd_two_stage, "run the design, then its follow-up")
    two.add_argument("--max-runs", **budget)
    two.add_argument("--results", default="results")
    two.add_argument(
        "snakemake", nargs="*", help="options passed to snakemake, after -- (e.g. -- --cores 2)"
    )
    imp = command("improve", cmd_improve, "run the design, then test its top hypotheses")
    first_stage_inputs(imp)
    imp.add_argument("--out", help="the test's design (default: <design>-improve.yaml)")
    imp.add_argument(
        "--top",
        type=positive_int,
        default=stage_limits.TOP,
        help="hypotheses to test (default %(default)s)",
    )
    imp.add_argument(
        "--replications",
        type=at_least(stage_limits.IMPROVE_MIN_REPLICATIONS),
        help=f"runs per level and cell (at least {stage_limits.IMPROVE_MIN_REPLICATIONS})",
    )
    imp.add_argument(
        "--no-run", action="store_true", help="only write the test's design from finished tables"
    )
    imp.add_argument("snakemake", nargs="*", help="options passed to snakemake, after --")
    line = sub.add_parser("timeline", help="one clock-aligned Chrome trace JSON of all ranks")
    line.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR_OR_TRACE")
    line.add_argument("-o", "--out", required=True, help="the JSON file to write")
    line.add_argument(
        "--max-intervals",
        type=positive_int,
        default=400_000,
        help="above this, keep a window of steps (default 400000)",
    )
    line.add_argument("--steps", help="keep steps A:B (inclusive)")
    line.add_argument(
        "--align",
        choices=["auto", "trace", "join"],
        default="auto",
        help="clock alignment (default auto: join offsets across nodes)",
    )
    line.add_argument(
        "--keep-going",
        action="store_true",
        help="skip an input that cannot be read (listed in the file), exit 0",
    )
    line.set_defaults(fn=cmd_timeline)
    imp = sub.add_parser("import", help="traces from elsewhere into one phase table (Parquet)")
    imp.add_argument("paths", nargs="+", type=Path, metavar="TRACE_OR_FOLDER")
    imp.add_argument("-o", "--out", required=True, help="the Parquet file to write")
    imp.add_argument(
        "--keep-going", action="store_true", help="exit 0 even when a trace could not be read"
    )
    imp.set_defaults(fn=cmd_import)
    chk = command("check", cmd_check, "check every finished run's files; list the damaged")
    chk.add_argument("--results", default="results")
    chk.add_argument("--rerun", action="store_true", help="queue the damaged runs again")
    command("envs", cmd_envs, "the environments envs/setup.sh sets up for the design")
    fetch = sub.add_parser("fetch-data", help="download and verify CIFAR-10")
    fetch.add_argument("dataset", choices=["cifar10"])
    fetch.add_argument("--data-dir")
    fetch.set_defaults(fn=cmd_fetch_data)
    # Its own options and --help are the cluster's (ddlcompare/run/cluster.py).
    clu = sub.add_parser(
        "cluster",
        help="a Slurm and OAR cluster of namespaces on this machine: up, down, status",
        add_help=False,
        prefix_chars="+",
    )
    clu.add_argument("action", nargs=argparse.REMAINDER, help="up|down|status [--nodes N]")
    clu.set_defaults(fn=cmd_cluster)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_results(getattr(args, "results", None))
        return args.fn(args)
    except OSError as exc:  # a path the system refuses (read-only, /proc, a full disk)
        where = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc
        print(f"error: {where}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not isinstance(exc, UserError) and not _damaged(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _damaged(exc: Exception) -> bool:
    """Whether ``exc`` is a table the analysis reads found damaged: only a
    command that imported the validation can raise one (a command that did
    not, ``ddlc import``, does not import it for this)."""
    tables = sys.modules.get("runfiles.tables")
    return tables is not None and isinstance(exc, tables.Damaged)


if __name__ == "__main__":
    status = main()
    if _ENDS_AT_ONCE:
        end_at_once(status)
    sys.exit(status)
