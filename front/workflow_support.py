"""The little the Snakefile needs, kept here where it can be tested."""

from __future__ import annotations

import ast
import contextlib
import csv
import os
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import NoReturn

from analysis import replication
from ddlcompare.plan import yaml_safe
from ddlcompare.run import diskspace, machine_lock, plan_checks, refile, runner
from runfiles import atomic, files, names, ownership, records
from runfiles.tables import Damaged, check_table
from front.cli import UserError, configfile_problem, load_design, runs_no_job, snakemake_options
from ddlcompare.plan.params import RunRow, shown, shown_key
from frameworks import registry

# Run paths are built from validated values only (see params.SAFE_TEXT).
PATH_PATTERN = r"[A-Za-z0-9._+~/-]+"


def is_dry_run(workflow, argv: list[str] | None = None) -> bool:
    """Whether Snakemake was asked for a plan only (-n), or anything else
    that runs no job (--summary, --dag, --lint, --list-rules, --touch...):
    the Snakefile is read alike, so ``prepare`` must not act for them.
    ``workflow.dryrun`` is False while the Snakefile is read (Snakemake 9
    sets the executor later), but the output settings hold -n from the
    start; the other modes only Snakemake's command line (``argv``) says."""
    settings = getattr(workflow, "output_settings", None)
    return bool(
        workflow.dryrun or getattr(settings, "dryrun", False) or runs_no_job(argv or sys.argv)
    )


def prepare(design_file: str, results: Path, main: bool, dryrun: bool, options: dict | None = None):
    """Load the design or stop with its problems listed (no traceback), and
    put failed runs back in the queue: their attempt moves to attempts/<n>/
    and their done marker goes with it, so Snakemake runs them again.
    ``options`` is Snakemake's config (kill_orphans=1 stops the training
    processes of earlier attempts that outlived their workflow).

    Returns the design, its planned runs, and the paths of the runs that a
    dry run leaves in place but a real invocation queues again (their done
    markers still there: the Snakefile plans them all the same)."""
    options = options or {}
    if problem := results_problem(results):
        _stop(problem)
    try:
        # This machine's cores matter where the jobs run here, which only
        # the executor tells, at onstart (warn_of_shared_cores).
        design = load_design(design_file, check_ready=main, runs_here=False)
    except UserError as exc:
        _stop(str(exc))
    runs = replication.planned(design, results)
    requeued: set[str] = set()
    if main and not dryrun:
        try:  # a run's jobs: run, phases, and a share of the rest
            diskspace.check_temp(4 * len(runs))
        except diskspace.NoSpace as exc:
            _stop(str(exc))
    if main:
        os.environ[ownership.WORKFLOW_ENV] = ownership.workflow_mark()
        os.environ[yaml_safe.DIGEST_ENV] = yaml_safe.file_digest(design_file) or ""
        try:
            requeued = _tidy(runs, results, design, options, dryrun)
        except OSError as exc:  # a read-only folder, an attempts that is a link...
            where = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc
            _stop(f"{where}; the results folder must be a writable folder of plain folders")
    return design, runs, requeued


def _tidy(runs: list[RunRow], results: Path, design, options: dict, dryrun: bool) -> set[str]:
    """Before the jobs are planned: refuse a folder still in use, move runs
    to their folders, queue failed and damaged runs again (their files go to
    attempts/), delete damaged tables. A dry run only says what it would do,
    and returns the paths of the runs it would queue again."""
    folders = [results / row.path for row in runs] + [results / design.root / "tables"]
    _refuse_misplaced([files.place_problem(f, results) for f in folders])
    _check_occupants(runs, results, _flag(options, "kill_orphans"), dryrun)
    _refile_finished(runs, results, results / design.name, dryrun)
    damaged = _requeue_damaged(runs, results, _flag(options, "rerun_damaged"), dryrun)
    failed = runner.failed_runs(runs, results)
    if failed and dryrun:
        print(
            f"{len(failed)} failed run(s) will run again (their files move to attempts/)",
            file=sys.stderr,
        )
    elif failed:
        for row in failed:
            runner.archive_attempt(results / row.path)
        print(
            f"{len(failed)} failed run(s) queued again; earlier attempts kept under attempts/",
            file=sys.stderr,
        )
    _drop_damaged_tables(runs, results, results / design.root / "tables", dryrun)
    note_changed_results(runs, results, results / design.root / "tables", dryrun)
    _warn_of_space(runs, results)
    return {row.path for row in [*failed, *damaged]} if dryrun else set()


def _refile_finished(runs: list[RunRow], results: Path, root: Path, dryrun: bool) -> None:
    """Planned runs that finished under another folder name (a fixed setting
    made a factor) move to their planned folders instead of running again."""
    found = refile.moves(runs, results, root)
    if not found:
        return
    if dryrun:
        print(
            f"{len(found)} finished run(s) found under earlier folder names (same settings): "
            f"they move to their folders, not run again (first: {found[0][1]})",
            file=sys.stderr,
        )
        return
    moved = [row for row, source in found if refile.move(row, source, results)]
    if moved:
        print(
            f"{len(moved)} finished run(s) found under earlier folder names (same settings): "
            f"moved to their folders, not run again (first: {moved[0].path})",
            file=sys.stderr,
        )


def _drop_damaged_tables(runs: list[RunRow], results: Path, tables: Path, dryrun: bool) -> None:
    """Tables are built from the run files: one that cannot be read (cut
    short, overwritten) is deleted, so that the workflow builds it again,
    instead of failing the analysis that reads it."""
    paths = [results / r.path / names.PHASE_TABLE for r in runs] + sorted(tables.glob("*.parquet"))
    for path in paths:
        if not path.exists() or path.is_dir():  # a folder: the outputs' check names it
            continue
        try:
            check_table(path)
        except Damaged:
            if not dryrun:
                path.unlink()
            print(
                f"warning: {path}: damaged table; built again from the run files", file=sys.stderr
            )


def _warn_of_space(runs: list[RunRow], results: Path) -> None:
    """The campaign's runs still to do, against the room left: each run
    checks again before it starts, and fails with the message if short."""
    todo = [r for r in runs if not (results / r.path / names.DONE).exists()]
    needed = sum(diskspace.estimate_bytes(r.config) for r in todo)
    try:
        diskspace.check(results, needed)
    except diskspace.NoSpace as exc:
        print(f"warning: {len(todo)} run(s) to do: {exc}", file=sys.stderr)


# Every --config key the workflow reads, with what it takes: a key not here
# is refused (a misspelt design= would run the default design).
CONFIG_KEYS = {
    "design": "the design file (default design.yaml)",
    "results": "the results folder (default results)",
    "import_traces": "trace files or folders to convert and show in the report, comma-separated",
    "kill_orphans": "1: stop training processes of earlier attempts still in the run folders",
    "rerun_damaged": "1: run the runs with damaged files again",
    "allow_failures": "1: exit 0 even when some run is not ok",
}
FLAGS = ("kill_orphans", "rerun_damaged", "allow_failures")
FLAG_VALUES = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def unknown_key(key) -> str | None:
    """Why --config KEY=... is refused: not a key the workflow reads."""
    import difflib

    if key in CONFIG_KEYS:
        return None
    close = difflib.get_close_matches(str(key), CONFIG_KEYS, n=1)
    return (
        f"--config {shown_key(key)}: not a setting of the workflow"
        + (f"; did you mean {close[0]}=?" if close else "")
        + f" (known: {', '.join(CONFIG_KEYS)})"
    )


def check_options(options: dict) -> None:
    """Refuse --config keys the workflow does not read, and flags that are
    not a yes or a no."""
    for key in options:
        if problem := unknown_key(key):
            _stop(problem)
    for name in FLAGS:
        if name in options and str(options[name]).strip().lower() not in FLAG_VALUES:
            _stop(
                f"--config {name}={options[name]}: must be 1 or 0 (true/false, yes/no): "
                f"{CONFIG_KEYS[name]}"
            )


# A path given to --config: it goes into every job's command line (and a
# cluster's submission), so like the names of the design (params.SAFE_TEXT)
# it holds no character a shell or Snakemake reads ($, `, quotes, braces,
# newlines...).
SAFE_PATH = re.compile(r"[\w.+~/@,= -]+")


def _unsafe(text: str, what: str) -> str | None:
    if SAFE_PATH.fullmatch(text):
        return None
    bad = next(c for c in text if not SAFE_PATH.fullmatch(c))
    return (
        f"{what}: the character {shown(bad)} is not allowed in a path the workflow's jobs are "
        "given (letters, digits, . _ + ~ / @ , = - and spaces); rename or move"
    )


def path_problem(key: str, value) -> str | None:
    """Why a path given as --config KEY=VALUE is refused, or None."""
    text = "" if value is None else str(value)
    if not text.strip():
        return f"{key}= is empty; pass --config {key}=PATH ({CONFIG_KEYS[key]})"
    return _unsafe(text, f"{key}={shown(text)}")


def places_problem() -> str | None:
    """Why the working folder (Snakemake's -d), this checkout or its Python
    cannot go into a cluster job's command line, or None. Snakemake quotes
    them there with repr(): a name holding a quote and $(...) or `...` ran
    as a command in the job's shell (tested through a real Slurm), so they
    are checked like the paths given to --config."""
    for what, place in (
        ("the working folder (-d)", Path.cwd()),
        ("the checkout", Path(__file__).resolve().parent.parent),
        ("the Python", Path(sys.executable)),
    ):
        if problem := _unsafe(str(place), f"{what} {shown(str(place))}"):
            return problem
    return None


def workflow_paths(options: dict) -> tuple[str, Path]:
    """design= and results= from Snakemake's config (an empty value arrives
    as None), once every key is known."""
    check_options(options)
    if problem := places_problem():
        _stop(problem)
    design = options.get("design", "design.yaml")
    results = options.get("results", "results")
    for key, value in (("design", design), ("results", results)):
        if problem := path_problem(key, value):
            _stop(problem)
    return str(design), Path(str(results))


def results_problem(results: Path) -> str | None:
    """``results=`` must name a folder (or a place for one): not a file, nor
    a link to nowhere or to itself (exists() is False on both, and the
    first job failed to make it)."""
    if os.path.lexists(results) and not results.is_dir():
        what = "a file" if results.exists() else "a link to nowhere or to itself"
        return (
            f"results={results} is {what}, not a folder; pass --config results=FOLDER "
            "(it is created if missing)"
        )
    return None


def imported_traces(options: dict) -> list[str]:
    """import_traces=: every file named must exist (else it would be left out
    silently on a campaign already built)."""
    if "import_traces" in options and not options["import_traces"]:
        _stop(
            "import_traces= is empty; give trace files or folders, comma-separated, "
            "or leave the key out"
        )
    paths = as_list(options.get("import_traces", []))
    for path in paths:
        if problem := path_problem("import_traces", path):
            _stop(problem)
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        _stop(
            f"import_traces: {missing[0]} not found"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; give existing trace files or folders, comma-separated"
        )
    for path in paths:  # a FIFO would hang the conversion, a device feed it forever
        if not (Path(path).is_file() or Path(path).is_dir()):
            kind = files.kind(Path(path).stat().st_mode)
            _stop(f"import_traces: {path} is {kind}, neither a trace file nor a folder")
    return paths


def _stop(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _flag(options: dict, name: str) -> bool:
    return FLAG_VALUES.get(str(options.get(name, "0")).strip().lower(), False)


def _requeue_damaged(runs: list[RunRow], results: Path, rerun: bool, dryrun: bool) -> list[RunRow]:
    """Damaged runs are reported; with rerun_damaged=1 they run again (all
    their files are checked then; else only the done markers, which is cheap).
    Returns those queued again (a dry run: those it would queue)."""
    damaged = runner.damaged_runs(runs, results) if rerun else runner.damaged_markers(runs, results)
    if not damaged:
        return []
    row, problem = damaged[0]
    what = f"{len(damaged)} run(s) with damaged results (first: {row.path}: {problem})"
    if not rerun:
        print(
            f"warning: {what}; they show as damaged in the report; run them again with "
            "--config rerun_damaged=1 (ddlc check lists them all)",
            file=sys.stderr,
        )
        return []
    if dryrun:
        print(f"{what} will run again (their files move to attempts/)", file=sys.stderr)
    else:
        for row, _ in damaged:
            runner.archive_attempt(results / row.path)
        print(f"{what} queued again; their files kept under attempts/", file=sys.stderr)
    return [row for row, _ in damaged]


# An input of the collect rule that exists once a run's files changed after
# the tables were built (a run queued again included): it holds the new
# fingerprint, so that Snakemake, which compares the content of small inputs
# and not only their times, builds the tables again, and reruns the runs
# whose done markers went to attempts/ on the way.
CHANGED = ".results-changed"


def note_changed_results(runs: list[RunRow], results: Path, tables: Path, dryrun: bool) -> None:
    try:
        built = files.read_json(tables / records.INPUTS)["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no tables yet (or unreadable: collect writes them again)
    now = records.fingerprint([results / row.path for row in runs])
    if now == built:
        return
    if dryrun:
        print(
            "run files changed since the tables were built: they will be built again",
            file=sys.stderr,
        )
        return
    atomic.write_text(tables / CHANGED, now + "\n")  # replaces a link, never writes through it


def _check_occupants(runs: list[RunRow], results: Path, kill: bool, dryrun: bool) -> None:
    """Refuse to start while an earlier attempt still trains in one of the
    run folders (e.g. after Snakemake was killed), or stop it (kill)."""
    table = ownership.process_table()
    busy = []
    for row in runs:
        folder = results / row.path
        if not folder.is_dir():
            continue
        try:
            ownership.evict(folder, kill and not dryrun, table)
        except ownership.Busy as exc:
            busy.append(str(exc))
    if busy and dryrun:
        print(
            f"warning: {busy[0]}"
            + (f" ({len(busy) - 1} more run folders alike)" if len(busy) > 1 else ""),
            file=sys.stderr,
        )
    elif busy:
        _stop(busy[0] + (f" ({len(busy) - 1} more run folders alike)" if len(busy) > 1 else ""))


def warn_of_shared_cores(design_file: str, design, workflow) -> None:
    """In the workflow's onstart, once Snakemake has its executor: the
    warning about this machine's cores, where the jobs run on it (the local
    executor), not where a cluster's nodes run them."""
    plugin = workflow.executor_plugin
    if plugin and plugin.common_settings.local_exec and (text := plan_checks.cores_warning(design)):
        print(f"warning: {design_file}: {text}", file=sys.stderr)


def relay_stop_requests(tables: Path) -> None:
    """In the workflow's onstart: when Snakemake is told to stop (SIGTERM,
    SIGINT), create the stop file its jobs know (machine_lock.STOP_ENV), then
    let Snakemake's own handler run. Snakemake lets running jobs end; a job
    still waiting for the machine sees the file and ends without starting
    (workflows/share_machine.sh, the runner's wait for the machine)."""
    import signal

    stop = Path(tables).resolve() / "logs" / f".stop-{os.getpid()}"
    stop.unlink(missing_ok=True)
    os.environ[machine_lock.STOP_ENV] = str(stop)

    def relay(previous):
        def handler(signum, frame):
            with contextlib.suppress(OSError):
                stop.parent.mkdir(parents=True, exist_ok=True)
                stop.touch()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        return handler

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, relay(signal.getsignal(signum)))


def forget_stop_request() -> None:
    """At the workflow's end: its stop file, if any, goes."""
    if stop := os.environ.get(machine_lock.STOP_ENV):
        Path(stop).unlink(missing_ok=True)


# Every job's shell starts here: it holds the machine shared while it runs
# (workflows/share_machine.sh, ddlcompare/run/machine_lock.py).
SHARE_MACHINE = Path(__file__).resolve().parent.parent / "workflows" / "share_machine.sh"


def job_prefix(journal: Path) -> str:
    """Snakemake's shell prefix: bash's strict mode, then the shared hold on
    the machine, with a line per job in ``journal`` (its held interval)."""
    words = f"source {shlex.quote(str(SHARE_MACHINE))} {shlex.quote(str(journal))}"
    # shell.prefix formats its text once: braces stay braces
    return f"set -euo pipefail; {words}; : ddlc-job; ".replace("{", "{{").replace("}", "}}")


def rules_outside_the_prefix(rules) -> list[str]:
    """Rules whose jobs would run code without the shell prefix (a run:,
    script:, notebook: or wrapper: rule), so without waiting for
    measurements: the workflow refuses them."""
    return sorted(r.name for r in rules if not r.norun and not r.is_shell)


def check_rules(rules, results: Path, written=()) -> None:
    """Every rule a shell: rule; every file the workflow writes (each
    rule's named outputs and logs, and ``written``: the jobs' journal) a
    file in folders of the results folder, or not there yet."""
    if wrong := rules_outside_the_prefix(rules):
        _stop(
            f"rule(s) {', '.join(wrong)}: every job must be a shell: command, whose "
            "shell holds the machine shared (workflows/share_machine.sh); write them "
            "as shell: rules"
        )
    _refuse_misplaced(output_problems(rules, results, written))


def output_problems(rules, results: Path, written=()) -> list[str | None]:
    """Where a rule writes a named file (an output or a log, the tables and
    the report), what is there already must be a file in folders: a FIFO as
    a log's folder, or a folder as a table, fails the job late or hangs it;
    a link would have the job write where it leads. Outputs with wildcards
    are in the run folders, checked in ``prepare``."""
    from snakemake.io import is_flagged

    paths = {
        (Path(str(f)), is_flagged(f, "directory"))
        for rule in rules
        for f in [*rule.output, *rule.log]
        if not f.contains_wildcard() and Path(str(f)).is_relative_to(results)
    } | {(Path(f), False) for f in written}
    return [files.place_problem(p, results, folder=folder) for p, folder in sorted(paths)]


def _refuse_misplaced(problems: list[str | None]) -> None:
    """Stop on the first place of the results folder that is not what the
    workflow expects there: a dry run says it too, before anything runs."""
    if found := [p for p in problems if p]:
        more = f" ({len(found) - 1} more alike)" if len(found) > 1 else ""
        _stop(f"{found[0]}{more}; the results folder must be a folder of plain folders")


def runtime_minutes(row: RunRow) -> int:
    """The scheduler's walltime for a run: its hang timeout plus a margin."""
    return runner.derived_timeout(row.config) // 60 + 5


def as_list(value) -> list[str]:
    """A config value given as a YAML list or a comma-separated string."""
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    return [str(v) for v in value]


# Memory a training process asks for (the model is small; the data set and
# the framework's runtime dominate). Override per cluster with
# ``set-resources: {run: {mem_mb: ...}}`` in a profile.
MB_PER_PROCESS = 3000


def job_resources(row: RunRow) -> dict:
    """What a run's job asks a cluster for, under Snakemake's resource names
    (the Slurm executor reads them as they are; the Grid'5000 submit command
    gets them as arguments). Values of None are left out by Snakemake.

    Inside a Slurm allocation Snakemake runs each job's command in a one-task
    ``srun`` step unless the job has an ``mpi`` resource. A run of several
    processes per node takes the ``mpi`` route so that its launcher owns the
    whole allocation; ``tasks_per_node`` must then be above 1. A run of one
    process per node asks for ``tasks`` instead, and its launcher's own
    ``srun`` (multi-node) shares the step's CPUs (``--overlap``).
    """
    c = row.config
    nodes, per_node = c["nodes"], c["procs_per_node"]
    gpu = c["device"] == "gpu"
    whole = registry.FRAMEWORKS[c["framework"]].whole_nodes
    gpus = per_node if gpu else c["hybrid_gpus"] if c["device"] == "hybrid" else 0
    return {
        "nodes": nodes,
        "tasks_per_node": per_node,
        "tasks": nodes if per_node == 1 else None,
        "mpi": "launcher" if per_node > 1 else None,
        "cpus_per_task": c["threads"],
        "mem_mb": per_node * MB_PER_PROCESS,  # per node
        "runtime": runtime_minutes(row),
        "gpus_per_node": gpus,
        "gres": f"gpu:{gpus}" if gpus else None,
        "tasks_per_gpu": 1 if gpu else None,
        # Whole nodes where two runs cannot share one (AdapterInfo.whole_nodes):
        # Slurm's --exclusive; OAR's hosts without a per-host part.
        "slurm_extra": "--exclusive" if whole else None,
        "oar_resources": "" if whole else None,
    }


def users_slurm_extra(default_resources) -> str | None:
    """The ``slurm_extra`` of the user's ``--default-resources`` (or the
    profile's), a quoted string as docs/clusters.md writes it. A rule that
    sets its own ``slurm_extra`` replaces the default's: the run rule joins
    the two (slurm_extra below), so that a user's ``--no-requeue`` reaches
    the runs beside their ``--exclusive``."""
    found = default_resources.get("slurm_extra") if default_resources is not None else None
    if found is None or found.raw is None:
        return None
    try:
        value = ast.literal_eval(str(found.raw))
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, str):
        _stop(
            f"--default-resources slurm_extra={found.raw}: give the sbatch options as one "
            "quoted string, e.g. \"slurm_extra='--no-requeue --mail-type=END'\""
        )
    return value or None


def slurm_extra(row: RunRow, users: str | None) -> str | None:
    """The run's own sbatch options (job_resources) and the user's, both."""
    own = job_resources(row)["slurm_extra"]
    joined = " ".join(part for part in (own, users) if part)
    return joined or None


def finish(
    runs: list[RunRow], results: Path, tables: Path, report: Path, options: dict, workflow_ok: bool
) -> None:
    """The workflow's last line: how many runs are ok and how many not, and
    a non-zero exit when any is not (unless allow_failures=1)."""
    counts = Counter(_statuses(runs, results, tables if workflow_ok else None))
    order = ["ok", "failed", "damaged", "suspect", "interrupted", "running", "missing"]
    parts = [f"{counts[s]} {s}" for s in order + sorted(set(counts) - set(order)) if counts[s]]
    bad = sum(n for s, n in counts.items() if s != "ok")
    if not workflow_ok:
        parts.append(
            "but the workflow stopped before its end (the failed jobs' logs are above): "
            "the tables and the report are not up to date"
        )
        print(", ".join(parts), file=sys.stderr)
        return
    where = f": see {report.resolve()}" if report.exists() else ": see the runs' logs"
    print(", ".join(parts) + (where if bad else ""), file=sys.stderr)
    if loaded := _loaded_runs(tables):
        print(
            f"{loaded} run(s) measured beside heavy foreign load or on a machine shared "
            f"with other runs of ours (machine_shared), not clean: see "
            f"{report.resolve()} (run status)",
            file=sys.stderr,
        )
    if bad and not _flag(options, "allow_failures"):
        print(
            "exit status 1: not every run is ok (--config allow_failures=1 to exit 0 all the same)",
            file=sys.stderr,
        )
        sys.exit(1)


def _loaded_runs(tables: Path) -> int:
    """Runs of the fresh runs table not clean: measured beside heavy
    foreign load, or held the machine shared (analysis/collect.py)."""
    try:
        with open(tables / "runs.csv", newline="") as f:
            return sum(row.get("loaded") == "True" for row in csv.DictReader(f))
    except (OSError, csv.Error):
        return 0


def _statuses(runs: list[RunRow], results: Path, tables: Path | None) -> list[str]:
    """Each run's status: from the fresh runs table (which knows damaged
    runs), else from the done markers and run records."""
    if tables is not None:
        try:
            with open(tables / "runs.csv", newline="") as f:
                return [row["status"] for row in csv.DictReader(f)]
        except (OSError, KeyError, csv.Error):
            pass
    found = []
    for row in runs:
        status, _ = records.done_status(results / row.path)
        if status is None:
            try:
                status = records.read_json(results / row.path / names.RUN_RECORD)["status"]
            except Damaged:
                status = "missing"
        if status == "running" and not any(ownership.occupants(results / row.path)):
            status = "interrupted"  # its runner was killed before it could say so
        found.append(status)
    return found


if __name__ == "__main__":  # ./ddlc run: set-up only where Snakemake will run jobs
    if sys.argv[1:2] == ["runs-no-job"]:
        sys.exit(0 if runs_no_job(["snakemake", *sys.argv[2:]]) else 1)
    if sys.argv[1:2] == ["check-args"]:  # what Snakemake reads before the Snakefile:
        # a --configfile (it hangs on a FIFO) and the --config keys (it answers
        # a key of one letter or one that is no name with a traceback)
        argv = ["snakemake", *sys.argv[2:]]
        if problem := configfile_problem(argv):
            _stop(problem)
        entries = getattr(snakemake_options(argv), "config", None) or []
        for key in (entry.partition("=")[0] for entry in entries):
            if problem := unknown_key(key):
                _stop(problem)
        sys.exit(0)
    sys.exit(2)
