"""Run one design row: start its processes, watch them, record the outcome.

Whatever happens, the run ends with a ``run.json`` that says what happened.
A run that finished, well or badly, also gets its done marker
(``done.json``, carrying the exit status), which is the workflow's output for
that run. A run interrupted by the user or the scheduler gets no done marker,
so the next workflow invocation runs it again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runfiles.names import CONFIG, DONE, EPOCHS, METRICS, PHASE_TABLE, RUN_RECORD, TRAIN_LOG
from ddlcompare.run import (
    conditions,
    cores,
    diskspace,
    launch,
    machine_load,
    machine_lock,
    netem,
    provenance,
    schedulers,
    stacks,
    stall,
    stopping,
    tracers,
)
from runfiles import energy, names, ownership, records, tables
from runfiles.atomic import write_json
from ddlcompare.plan.design import check_run
from ddlcompare.plan.design import identity as design_identity
from ddlcompare.plan.params import RunRow
from frameworks import balance, data, knobs, registry
from runfiles import files
from runfiles.run_config import RunConfig

# Everything an attempt writes; moved aside before the next attempt.
ATTEMPT_FILES = (
    DONE,
    RUN_RECORD,
    TRAIN_LOG,
    EPOCHS,
    METRICS,
    PHASE_TABLE,
    names.PHASES_LOG,
    names.STACKS,
    names.HOROVOD_TIMELINE,
    knobs.KNOBS_TIMELINE_FILE,
    names.OTF2_DIR,
    names.OTF2_PARTS_DIR,
    names.TORCH_PROFILER_DIR,
    names.SCOREP_DIR,
    names.LBANN_BATCH_TIMES,
    names.LBANN_DIR,
    names.NETWORK,
    energy.ENERGY,
    balance.BALANCE,
)
ATTEMPT_GLOBS = (
    names.STEPS_GLOB,
    names.INTERVALS_GLOB,
    names.RANK_RECORD_GLOB,
    names.ENERGY_SAMPLES_GLOB,
    names.ENERGY_SOURCES_GLOB,
    names.FAILED_RANK_GLOB,
    names.PROGRESS_GLOB,
)


class Interrupted(Exception):
    def __init__(self, reason: str, signum: int | None = None):
        self.reason, self.signum = reason, signum


class StopSignals:
    """Ctrl-C, the scheduler's SIGTERM and a lost terminal, over a whole
    attempt. Until the launcher has ended, the first one is recorded, stops
    the launcher's whole tree and raises Interrupted; after, and while a
    stop is being recorded, a signal is only kept: the attempt's outcome is
    recorded first. (A lost node: Slurm tells srun, which fails, as it
    signals the runner; the signal's default action killed the runner
    between the two records.)"""

    NAMES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, record: Callable[[str], None] | None = None):
        self.launcher: subprocess.Popen | None = None
        self.held = False
        self.signum: int | None = None  # the first one
        # Records the stop as it comes, in the scheduler's words, before
        # the launcher's tree is stopped: the scheduler kills the runner
        # outright a moment after its signal (Slurm's KillWait: 5 s on
        # ./ddlc cluster), and kill_tree's grace alone is as long.
        self.record = record
        self.recorded = False

    @contextlib.contextmanager
    def caught(self):
        previous = {s: signal.getsignal(s) for s in self.NAMES}
        for s in previous:
            signal.signal(s, self._stop)
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def hold(self) -> None:
        """From now on a signal is kept, not raised."""
        self.held = True

    def _stop(self, signum: int, _frame) -> None:
        self.signum = self.signum or signum
        if self.held or (self.launcher and self.launcher.returncode is not None):
            return
        self.held = True  # a second signal must not cut the stop short
        reason = f"stopped by {signal.Signals(signum).name}"
        if self.launcher and self.launcher.returncode is None:
            try:
                if self.record:
                    self.record(reason)
                    self.recorded = True
            finally:  # a record refused (the folder another attempt's) stops it too
                stopping.kill_tree(self.launcher)
        raise Interrupted(reason, signum)


class LostOwnership(Exception):
    """Another attempt owns the run folder now: this one writes nothing more."""


def derived_timeout(config: RunConfig) -> int:
    """Seconds before a run counts as hung: generous, from the work it does
    (at least 20 images/s, plus start-up), unless the design sets it."""
    if timeout := config.get("timeout_s"):
        return timeout
    info = data.DATASETS[config["dataset"]]
    n = config["train_images"] or (60000 if info is data.FASHION_MNIST else 50000)
    if config["max_steps"]:
        n = min(
            n,
            config["max_steps"] * config["batch_size"] * config["nodes"] * config["procs_per_node"],
        )
    return int(180 + config["epochs"] * (n + 10000) / 20)


def execute(row: RunRow, results: Path, kill_orphans: bool = False) -> int:
    """Run ``row``; return 0 when a done marker was written (ok or failed).
    The run folder is claimed first (ownership.Busy when an earlier attempt
    still runs there) and released at the end."""
    if problem := files.place_problem(results / row.path, results):
        raise files.NotRegular(problem)  # a file, a link out or to nowhere, a link loop
    # absolute, as workers start in the repository (realpath: Path.resolve
    # raises RuntimeError on a link loop, which place_problem names)
    run_dir = Path(os.path.realpath(results / row.path))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        diskspace.check(run_dir, diskspace.estimate_bytes(row.config))
    except (diskspace.NoSpace, OSError) as exc:
        if isinstance(exc, OSError) and not diskspace.is_full(exc):
            raise
        ownership.evict(run_dir, kill=False)  # never write over a live attempt
        return _no_space(row, run_dir, str(exc), earlier_attempt=True)
    token = ownership.claim(run_dir, kill=kill_orphans)
    try:
        if _finished_ok(row, run_dir):
            return 0
        return _attempt(row, run_dir, token)
    except LostOwnership:
        print(
            f"{run_dir}: another attempt owns this run folder now; this one stopped "
            "without writing",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        if not diskspace.is_full(exc):
            raise
        return _no_space(
            row,
            run_dir,
            f"No space left on {diskspace.mount_point(run_dir)} "
            f"while the run wrote its files ({exc.strerror})",
        )
    finally:
        ownership.release(run_dir, token)


def _finished_ok(row: RunRow, run_dir: Path) -> bool:
    """A run that finished ok whose done marker is gone: Snakemake removes
    the output of a job it interrupted (Ctrl-C) even when the run had just
    finished, and reruns a job it never saw end. Its sound files are kept
    and its done marker written again from run.json: a finished run is
    never trained twice."""
    if (run_dir / DONE).exists() or not (run_dir / RUN_RECORD).exists():
        return False
    try:
        record = records.read_json(run_dir / RUN_RECORD)
    except tables.Damaged:
        return False
    config = record.get("config")
    if record["status"] != "ok" or not isinstance(config, dict):
        return False
    if design_identity(config) != design_identity(row.config):
        return False
    if check_run(run_dir, row.config):
        return False
    write_json(
        run_dir / DONE,
        {
            "status": "ok",
            "exit_status": record.get("exit_status", 0),
            "reason": record.get("reason"),
            "run_id": record["run_id"],
        },
    )
    print(
        f"{run_dir}: finished ok before (its done marker was lost to an interrupted "
        "workflow); kept, not trained again",
        file=sys.stderr,
    )
    return True


def _no_space(row: RunRow, run_dir: Path, reason: str, earlier_attempt: bool = False) -> int:
    """A full disk: say so, and record the failure wherever it still fits
    (the done marker makes it a failed run, queued again next time). Before
    the run started, an earlier attempt's files move aside first."""
    print(f"error: {reason}", file=sys.stderr, flush=True)
    try:
        if earlier_attempt:
            archive_attempt(run_dir)
    except OSError:
        pass  # the leftovers stay; the next attempt moves them
    diskspace.record_anyway(
        run_dir / RUN_RECORD,
        {
            "run_id": row.run_id,
            "path": row.path,
            "status": "failed",
            "reason": reason,
            "end": _now(),
        },
    )
    done = diskspace.record_anyway(
        run_dir / DONE,
        {"status": "failed", "exit_status": None, "reason": reason, "run_id": row.run_id},
    )
    return 0 if done else 1


def _attempt(row: RunRow, run_dir: Path, token: str) -> int:
    def save(name: str, doc: Mapping[str, Any]) -> None:
        if not ownership.owns(run_dir, token):
            raise LostOwnership()
        write_json(run_dir / name, doc)

    archive_attempt(run_dir)
    config = row.config
    record = {
        "run_id": row.run_id,
        "path": row.path,
        "factors": row.factors,
        "rep": row.rep,
        "order": row.order,
        "config": config,
        "status": "running",
        "start": _now(),
        # the scheduler's job that runs this attempt, which its job end command checks
        "job": schedulers.current().job_id(os.environ),
        **provenance.harness(),
        **provenance.tools(),
    }
    if config.get("tracer") == "scorep":
        record["scorep"] = tracers.installed_version()
    save(CONFIG, config)
    save(RUN_RECORD, record)
    stops = stop_signals(record, save)
    with stops.caught():
        try:
            outcome = _launch(row, run_dir, token, record, save, stops)
        except Interrupted as stop:
            return _record_stop(record, save, stops, stop.reason)
        except (RuntimeError, OSError) as exc:
            outcome = {"exit_status": None, "reason": f"could not start: {exc}"}
        except Exception as exc:  # noqa: BLE001 (a harness defect: the run is failed, not lost)
            traceback.print_exc()  # into the run's runner.log, for whoever fixes it
            outcome = {
                "exit_status": None,
                "reason": f"could not start, a defect of the harness ({type(exc).__name__}: "
                f"{exc}; the traceback is in runner.log): please report it",
            }
        return record_outcome(row, run_dir, record, save, stops, outcome)


def _launch(row: RunRow, run_dir: Path, token: str, record: dict, save, stops: StopSignals) -> dict:
    """Start the launcher on the machine or nodes given, watch it to its
    end, and return its outcome; ``record`` gains where and how it ran."""
    config = row.config
    info = registry.FRAMEWORKS[config["framework"]]
    with netem.network(config, run_dir) as net:
        scheduler, host_list = schedulers.detect(
            config["nodes"], config["procs_per_node"], {**os.environ, **net.env}
        )
        argv, env = launch.command(info.launcher, host_list, config, run_dir, scheduler)
        argv = net.enter(argv)
        record.update(
            scheduler=scheduler.name,
            hosts=[h.__dict__ for h in host_list],
            command=argv,
            cores=cores.record(net.node_cpus, net.hostnames),
        )
        # Saved now: a scheduler that kills the runner outright (OAR's
        # SIGKILL) leaves this record, completed by whoever records the stop.
        save(RUN_RECORD, record)
        hang = stall.EpochWatch(run_dir / EPOCHS, config["epochs"])
        timeout = derived_timeout(config)
        watch = Watch(run_dir, token, timeout, scheduler.one_machine, hang, stops)
        watch.cpus = tuple(sorted({c for node in net.node_cpus or [] for c in node})) or None
        with _machine(scheduler, row.path, watch) as waited:
            record["waited_for_machine_s"] = round(waited, 1)
            # held shared with other runs of ours that only check correctness
            record["machine_shared"] = scheduler.one_machine and machine_lock.shared_mode()
            started = time.time()
            outcome = watch.run(argv, {**os.environ, **net.env, **env})
            record["machine_held"] = [started, time.time()]  # unix seconds
            if watch.meter:
                record[records.MACHINE_LOAD] = machine_load.summarize(
                    watch.meter, run_dir, config, row.world_size, watch.held_ns
                )
            energy.write_run_energy(run_dir, [h.name for h in host_list], started, time.time())
    return outcome


AGAIN = "; the next workflow run starts it again"


def stop_signals(record: dict, save) -> StopSignals:
    """An attempt's stop signals, each recorded as it comes."""
    return StopSignals(lambda reason: _save_stop(record, save, reason))


def _save_stop(record: dict, save, reason: str, said: str | None = None) -> None:
    """The attempt recorded interrupted (no done marker: the next workflow
    run starts it again), in the scheduler's words too where it stops the
    job. Saved before the scheduler is asked: it kills outright a moment
    after its signal (Slurm's KillWait), and asking may take seconds."""
    record.update(status="interrupted", end=_now(), reason=reason + AGAIN)
    save(RUN_RECORD, record)
    if said := said or _scheduler_says(record):  # e.g. Slurm's TIMEOUT
        record["reason"] = f"{reason} ({said}){AGAIN}"
        save(RUN_RECORD, record)


def _scheduler_says(record: dict) -> str | None:
    """Why the scheduler stops this job on the run's hosts, in its words."""
    hosts = [h["name"] for h in record.get("hosts", [])]
    return schedulers.current().stop_reason(os.environ, hosts)


def _record_stop(
    record: dict, save, stops: StopSignals, reason: str, said: str | None = None
) -> int:
    """Record the attempt interrupted, unless its stop signal did; the exit
    status of a process ended by the first stop signal."""
    stops.hold()
    if not stops.recorded:
        _save_stop(record, save, reason, said)
    return 128 + stops.signum if stops.signum else 1


def record_outcome(
    row: RunRow, run_dir: Path, record: dict, save, stops: StopSignals, outcome: dict
) -> int:
    """Record how the launcher ended, with the run's done marker; a failure
    that came with a stop (a node lost: the scheduler stops the job as the
    launcher fails of it) is recorded as the stop instead."""
    config = row.config
    status = "ok" if outcome["exit_status"] == 0 and (run_dir / METRICS).exists() else "failed"
    if status == "failed" and not outcome.get("reason"):
        outcome["reason"] = "exited 0 but wrote no metrics.json"
    if outcome["exit_status"] != 0 and (stop := _stop_behind_failure(record, stops, outcome)):
        return _record_stop(record, save, stops, *stop)
    if status == "ok" and (missing := tracers.missing_trace(config, run_dir)):
        status, outcome["reason"] = "failed", missing  # not clean: its trace is lost
    if status == "ok" and outcome.get("overlap"):
        status = "suspect"
        outcome["reason"] = "measured while other training shared this machine: " + "; ".join(
            outcome["overlap"][:3]
        )
    ranks = _ranks(run_dir)
    if status == "ok" and (unconfined := cores.check(record.get("cores"), ranks)):
        status, outcome["reason"] = "failed", unconfined  # not measured as designed
    record.update(status=status, end=_now(), ranks=ranks, **outcome)
    record["conditions"] = conditions.of_run(record, run_dir / names.NETWORK)
    save(RUN_RECORD, record)
    save(
        DONE,
        {
            "status": status,
            "exit_status": outcome["exit_status"],
            "reason": outcome.get("reason"),
            "run_id": row.run_id,
        },
    )
    return 0


def _stop_behind_failure(
    record: dict, stops: StopSignals, outcome: dict
) -> tuple[str, str | None] | None:
    """The stop that came with the launcher's failure, if any: a stop signal
    while its outcome was being recorded, or the scheduler ending the job (a
    lost node: Slurm tells srun, which fails, as it signals the runner)."""
    failure = f"the launcher ended ({outcome['reason']})"
    if stops.signum:
        return f"stopped by {signal.Signals(stops.signum).name} as {failure}", None
    if said := _scheduler_says(record):
        return f"stopped by the scheduler as {failure}", said
    return None


def _machine(scheduler: schedulers.Scheduler, what: str, watch: Watch):
    """On one machine (local, or its emulated network), the host-wide
    measuring lock; elsewhere the scheduler gives each run its own nodes."""
    if not scheduler.one_machine:
        return contextlib.nullcontext(0.0)

    def check() -> None:  # each second of the wait
        watch.check_workflow()
        try:
            machine_lock.check_stop()
        except machine_lock.StopRequested as exc:
            raise Interrupted(str(exc)) from None

    return machine_lock.measuring(
        what, lambda text: print(text, file=sys.stderr, flush=True), check
    )


class Watch:
    """Runs the launcher and watches it: the timeout, this process's stop
    signals, the workflow that started it (a killed Snakemake must not leave
    an attempt training), the folder's ownership, and other training that
    shares the machine."""

    POLL_S = 1.0  # also how often the machine's load is sampled
    OVERLAP_EVERY_S = 5.0
    # After a rank's guard said it failed, how long the launcher has to end
    # the job itself before the runner stops it (rank_guard.py).
    RANK_FAILURE_GRACE_S = 10.0

    def __init__(
        self,
        run_dir: Path,
        token: str,
        timeout: int,
        shared_machine: bool = True,
        progress: stall.EpochWatch | None = None,
        stops: StopSignals | None = None,
    ):
        self.run_dir, self.token, self.timeout = run_dir, token, timeout
        self.stops = stops or StopSignals()
        self.progress = progress  # a hang between epochs, seen before the timeout
        # Overlapping training is looked for where runs share one machine by
        # design (local, emulated network); a cluster scheduler gives each
        # job its own cores.
        self.shared_machine = shared_machine
        # Runs that hold the machine shared (machine_lock.shared_mode) overlap
        # by design: recorded as machine_shared, not as suspect.
        self.overlap_looked_for = shared_machine and not machine_lock.shared_mode()
        self.workflow = ownership.workflow_process()
        self.proc: subprocess.Popen | None = None
        self.overlap: list[str] = []
        self.meter: machine_load.Meter | None = None
        self.cpus: tuple[int, ...] | None = None  # the run's cores, where confined to some
        self.held_ns = (0, 0)  # perf_counter ns: the launcher's start and end
        self.stacks: Path | None = None  # where the ranks waited, dumped at the timeout
        self.stalled: str | None = None  # why the run counted as hung before its timeout
        self.rank_failed_at: float | None = None  # when a guard's record was seen
        self.stopped_for_rank: dict | None = None  # the failed rank the runner stopped the job for

    def check_workflow(self) -> None:
        if self.workflow and not ownership.alive(*self.workflow):
            if self.proc:
                stopping.kill_tree(self.proc)
            raise Interrupted(
                f"the workflow that started it (Snakemake, pid "
                f"{self.workflow[0]}) ended; stopped so that no orphan trains on"
            )

    def run(self, argv: list[str], env: dict) -> dict:
        with open(self.run_dir / TRAIN_LOG, "wb") as log:
            proc = self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=provenance.REPO,
                start_new_session=True,
                preexec_fn=ownership.die_with_parent,
            )
            self.stops.launcher = proc
            start = time.perf_counter_ns()
            try:
                with machine_lock.training(self.run_dir, proc.pid, provenance.REPO):
                    if self.shared_machine:
                        self.meter = machine_load.Meter(os.getpid(), proc.pid, self.cpus)
                    timed_out = self._wait(proc)
                    if self.meter:
                        self.meter.sample()  # up to the end, however short the run
            finally:
                self.stops.hold()  # the launcher has ended: its outcome is recorded first
                stopping.stop_session(proc.pid)
                self.held_ns = (start, time.perf_counter_ns())
        outcome = self._outcome(proc, timed_out)
        if self.overlap:
            outcome["overlap"] = self.overlap
        return outcome

    def _wait(self, proc: subprocess.Popen) -> bool:
        """Wait for the launcher; True when it ran past the timeout or
        stalled between epochs."""
        deadline = time.monotonic() + self.timeout
        beat = probe = time.monotonic()
        while True:
            if self.meter:
                self.meter.sample()
            try:
                proc.wait(timeout=self.POLL_S)
                return False
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.progress and not self.stalled:
                self.stalled = self.progress.stalled()
            if now > deadline or self.stalled:
                self.stacks = stacks.record(proc.pid, self.run_dir)
                stopping.kill_tree(proc)
                return True
            if failed := self._rank_failure(now):
                stopping.kill_tree(proc)
                self.stopped_for_rank = failed
                return False
            self.check_workflow()
            if not ownership.owns(self.run_dir, self.token):
                stopping.kill_tree(proc)
                raise LostOwnership()
            if now - beat > ownership.HEARTBEAT_S:
                ownership.heartbeat(self.run_dir, self.token)
                beat = now
            if self.overlap_looked_for and now - probe > self.OVERLAP_EVERY_S:
                self._note_overlap()
                probe = now

    def _rank_failure(self, now: float) -> dict | None:
        """The record of the first rank whose guard said it failed, once the
        launcher has had its grace to end the job itself: GPI-2 leaves the
        other ranks waiting for it in a collective until the timeout."""
        if self.rank_failed_at is None:
            if not any(self.run_dir.glob(names.FAILED_RANK_GLOB)):
                return None
            self.rank_failed_at = now
        if now - self.rank_failed_at < self.RANK_FAILURE_GRACE_S:
            return None
        return _first_rank_record(self.run_dir)

    def _note_overlap(self) -> None:
        for line in machine_lock.other_training(self.run_dir, provenance.REPO):
            if line not in self.overlap:
                self.overlap.append(line)

    def _outcome(self, proc: subprocess.Popen, timed_out: bool) -> dict:
        code = proc.returncode
        if timed_out:
            said = self.stalled or f"timeout: still running after {self.timeout} s; killed"
            return {
                "exit_status": code,
                "reason": said
                + (f" (where each rank waited: {self.stacks.name})" if self.stacks else ""),
            }
        if self.stopped_for_rank:  # the rank's status, not that of the launcher it stopped
            code = self.stopped_for_rank.get("exit_status")
            reason = _last_error(self.run_dir / TRAIN_LOG)
            said = (
                f"exit status {code}"
                if code is not None
                else "a rank failed (its record unreadable)"
            )
            return {"exit_status": code, "reason": f"{said}: {reason}"}
        if code == 0:
            return {"exit_status": 0, "reason": None}
        if code < 0:
            return {"exit_status": code, "reason": f"killed by {signal.Signals(-code).name}"}
        return {
            "exit_status": code,
            "reason": f"exit status {code}: {_last_error(self.run_dir / TRAIN_LOG)}",
        }


# "[rank1]: KeyError: 0" (torchrun), "[0]<stderr>:TypeError: ..." (horovodrun),
# "[1,0]<stderr>:..." (mpirun), "ValueError: ...", "SystemExit: ..." and the like.
EXCEPTION_LINE = re.compile(
    r"^(\[[\w,]+\](<std\w+>)?:\s*)?([\w.]*(Error|Exception|Exit|Interrupt))\b:?"
)
# A tool's fatal error ("[Score-P] src/...: Fatal: Bug 'timestamp < ...'",
# "[Score-P] ...: Error: ..."): it explains the exit better than any
# exception a rank raised after it.
FATAL_LINE = re.compile(r"\bFatal:|\[Score-P\].*\bError:")
# frameworks/worker.py's word for a rank that exited 0 before its training ended.
EARLY_EXIT_LINE = re.compile(r"\bEarlyExit: rank \d+ exited")
# mpirun frames its messages with lines of dashes or stars: never a reason.
SEPARATOR_LINE = re.compile(r"^[\W_]*$")


# How each launcher says that a rank died of a signal: (rank, what the code
# is, code, [node]). torchrun's failure summary, Horovod's Gloo runner (a
# shell's 128 + signal), mpirun, and our spawner (tf-workers).
RANK_SIGNAL = (
    re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+).*\n\s*exitcode\s*:\s*-(?P<signal>\d+)", re.M),
    re.compile(
        r"Terminating remaining workers after failure of Process (?P<rank>\d+)\.(?:.|\n)*?"
        r"Process (?P=rank) exit with status code (?P<shell>1[3-9]\d)\b"
    ),
    re.compile(
        r"Process (?P<rank>\d+) exit with status code (?P<shell>1[3-9]\d)\b(?:.|\n)*?"
        r"Terminating remaining workers after failure of Process (?P=rank)\."
    ),
    re.compile(
        r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) exited on signal "
        r"(?P<signal>\d+)"
    ),
    re.compile(
        r"(spawn|rank guard): rank (?P<rank>\d+) \(pid \d+\) killed by signal (?P<signal>\d+)"
    ),
)


def _rank_killed(text: str) -> str | None:
    """'rank R killed by SIGNAME (signal N)': the cause of a run whose rank
    a signal ended (its peers' errors and the launcher's follow from it)."""
    root = text.find("Root Cause")  # torchrun lists the first failure there
    for pattern in RANK_SIGNAL:
        # After torchrun's root cause, only it counts: the ranks it lists
        # before were ended by torchrun itself.
        if found := pattern.search(text, root) if root >= 0 else pattern.search(text):
            fields = found.groupdict()
            number = int(fields["signal"]) if fields.get("signal") else int(fields["shell"]) - 128
            try:
                name = signal.Signals(number).name
            except ValueError:
                continue
            node = f" on {fields['node']}" if fields.get("node") else ""
            return f"rank {fields['rank']}{node} killed by {name} (signal {number})"
    return None


def _first_rank_record(run_dir: Path) -> dict:
    """The record of the rank whose guard wrote first; a record that cannot
    be read (damaged, gone, not an object) still says that a rank failed."""
    found = []
    for path in run_dir.glob(names.FAILED_RANK_GLOB):
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue  # gone since: another one says it
    for _, path in sorted(found):
        try:
            record = files.read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            return record
    return {"exit_status": None}


def _last_error(log: Path) -> str:
    """The most telling line of a failed run's log: a rank killed by a
    signal, else the first exception a rank raised (launchers report their
    own wrapper errors after it)."""
    text = log.read_text(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not SEPARATOR_LINE.match(ln)]
    # A rank that left early says so itself; the signals its launcher then
    # sends the others follow from it.
    for line in lines:
        if EARLY_EXIT_LINE.search(line):
            return line[:400]
    if killed := _rank_killed(text):
        # A tool that aborts the rank (Score-P out of memory) said why first.
        fatal = next((line for line in lines if FATAL_LINE.search(line)), None)
        return f"{killed} after {fatal}"[:400] if fatal else killed
    for pattern in (FATAL_LINE.search, EXCEPTION_LINE.match):
        for line in lines:
            if pattern(line):
                return line[:400]
    return lines[-1][:400] if lines else "no output"


def _ranks(run_dir: Path) -> list[dict]:
    """Each rank's record; one cut short (a full disk) is left out."""
    ranks = []
    for path in sorted(run_dir.glob(names.RANK_RECORD_GLOB)):
        try:
            ranks.append(records.read_json(path, "rank.json"))
        except tables.Damaged:
            pass
    return ranks


def archive_attempt(run_dir: Path) -> Path | None:
    """Move a previous attempt's files to attempts/<n>/: nothing is deleted.
    The folder they went to; None when there was nothing to move (another
    command, such as a second ``ddlc check --rerun``, moved them first)."""
    if not run_dir.is_dir():
        return None
    with ownership.folder_lock(run_dir):
        leftovers = [run_dir / f for f in ATTEMPT_FILES if (run_dir / f).exists()]
        leftovers += [p for g in ATTEMPT_GLOBS for p in run_dir.glob(g)]
        if not leftovers:
            return None
        target = _next_attempt(run_dir / names.ATTEMPTS_DIR)
        for path in leftovers:
            shutil.move(str(path), target / path.name)
        return target


def _next_attempt(attempts: Path) -> Path:
    """A new attempts/<n>/, n one above the highest number there (folders
    may be missing or named otherwise: counting them would reuse a number).
    A link or a file named attempts is refused (files.NotRegular): the
    run's files never move out of the results folder."""
    files.plain_folder(attempts)
    numbers = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()]
    n = max(numbers, default=0) + 1
    while True:
        try:
            (attempts / str(n)).mkdir()
            return attempts / str(n)
        except FileExistsError:  # a file named so, or another attempt's
            n += 1


def failed_runs(rows: list[RunRow], results: Path) -> list[RunRow]:
    """Runs whose done marker says they failed, or measured while other
    training shared the machine (suspect): the workflow runs them again."""
    return [
        row for row in rows if records.done_status(results / row.path)[0] in ("failed", "suspect")
    ]


def damaged_markers(rows: list[RunRow], results: Path) -> list[tuple[RunRow, str]]:
    """Runs whose done marker is damaged, with what is wrong with it."""
    found = []
    for row in rows:
        status, problem = records.done_status(results / row.path)
        if status == "damaged":
            found.append((row, problem or "damaged"))
    return found


def damaged_runs(rows: list[RunRow], results: Path) -> list[tuple[RunRow, str]]:
    """Every finished run whose files are damaged (reads them all)."""
    found = damaged_markers(rows, results)
    for row in rows:
        if records.done_status(results / row.path)[0] == "ok":
            if problems := check_run(results / row.path, row.config):
                found.append((row, problems[0]))
    return found


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
