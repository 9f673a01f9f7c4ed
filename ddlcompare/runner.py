"""Run one design row: start its processes, watch them, record the outcome.

Whatever happens, the run ends with a ``run.json`` that says what happened.
A run that finished, well or badly, also gets its done marker
(``done.json``, carrying the exit status), which is the workflow's output for
that run. A run interrupted by the user or the scheduler gets no done marker,
so the next workflow invocation runs it again.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from ddlcompare import energy, launch, netem, provenance, schedulers
from ddlcompare.atomic import write_json
from ddlcompare.params import RunRow
from frameworks import data, registry

DONE = "done.json"
RECORD = "run.json"
LOG = "train.log"
# Everything an attempt writes; moved aside before the next attempt.
ATTEMPT_FILES = (DONE, RECORD, LOG, "epochs.tsv", "metrics.json", "phases.parquet", "phases.log",
                 "horovod_timeline.json", "trace", "torch_profiler", "scorep",
                 "lbann_batch_times.tsv", "lbann", netem.RECORD, energy.ENERGY)
ATTEMPT_GLOBS = ("steps.rank*.tsv", "intervals.rank*.tsv", "rank*.json", energy.SAMPLES_GLOB,
                 energy.SOURCES_GLOB)


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def derived_timeout(config: dict) -> int:
    """Seconds before a run counts as hung: generous, from the work it does
    (at least 20 images/s, plus start-up), unless the design sets it."""
    if config.get("timeout_s"):
        return config["timeout_s"]
    info = data.DATASETS[config["dataset"]]
    n = config["train_images"] or (60000 if info is data.FASHION_MNIST else 50000)
    if config["max_steps"]:
        n = min(n, config["max_steps"] * config["batch_size"] * config["nodes"]
                * config["procs_per_node"])
    return int(180 + config["epochs"] * (n + 10000) / 20)


def execute(row: RunRow, results: Path) -> int:
    """Run ``row``; return 0 when a done marker was written (ok or failed)."""
    run_dir = (results / row.path).resolve()  # workers start in the repository
    run_dir.mkdir(parents=True, exist_ok=True)
    archive_attempt(run_dir)
    config = row.config
    info = registry.FRAMEWORKS[config["framework"]]
    record = {"run_id": row.run_id, "path": row.path, "factors": row.factors, "rep": row.rep,
              "order": row.order, "config": config, "status": "running",
              "start": _now(), **provenance.harness(), **provenance.tools()}
    write_json(run_dir / "config.json", config)
    write_json(run_dir / RECORD, record)
    try:
        with netem.network(config, run_dir) as net:
            scheduler, host_list = schedulers.detect(config["nodes"], config["procs_per_node"],
                                                     {**os.environ, **net.env})
            argv, env = launch.command(info.launcher, host_list, config, run_dir, scheduler)
            argv = net.enter(argv)
            record.update(scheduler=scheduler.name, hosts=[h.__dict__ for h in host_list],
                          command=argv)
            started = time.time()
            outcome = _watch(argv, {**os.environ, **net.env, **env}, run_dir,
                             derived_timeout(config))
            energy.write_run_energy(run_dir, [h.name for h in host_list], started,
                                    time.time())
    except Interrupted as stop:
        record.update(status="interrupted", end=_now(),
                      reason=f"stopped by {signal.Signals(stop.signum).name}; "
                             "the next workflow run starts it again")
        write_json(run_dir / RECORD, record)
        return 128 + stop.signum
    except (RuntimeError, OSError) as exc:
        outcome = {"exit_status": None, "reason": f"could not start: {exc}"}
    status = "ok" if outcome["exit_status"] == 0 and (run_dir / "metrics.json").exists() \
        else "failed"
    if status == "failed" and not outcome.get("reason"):
        outcome["reason"] = "exited 0 but wrote no metrics.json"
    record.update(status=status, end=_now(), ranks=_ranks(run_dir), **outcome)
    write_json(run_dir / RECORD, record)
    write_json(run_dir / DONE, {"status": status, "exit_status": outcome["exit_status"],
                                "reason": outcome.get("reason"), "run_id": row.run_id})
    return 0


def _watch(argv: list[str], env: dict, run_dir: Path, timeout: int) -> dict:
    """Run the launcher; kill its process tree on timeout or when this
    process is told to stop."""
    with open(run_dir / LOG, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=provenance.REPO, start_new_session=True)
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def stop(signum, _frame):
            _kill_tree(proc)
            raise Interrupted(signum)

        for s in previous:
            signal.signal(s, stop)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            return {"exit_status": proc.returncode,
                    "reason": f"timeout: still running after {timeout} s; killed"}
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    code = proc.returncode
    if code == 0:
        return {"exit_status": 0, "reason": None}
    if code < 0:
        return {"exit_status": code, "reason": f"killed by {signal.Signals(-code).name}"}
    return {"exit_status": code, "reason": f"exit status {code}: {_last_error(run_dir / LOG)}"}


def _kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop the launcher and every process under it. Launchers put ranks in
    sessions of their own (torchrun, Horovod's Gloo), so a process group is
    not enough: the tree is listed first, then SIGTERM (with SIGCONT, so a
    stopped rank can act on it), ``grace`` seconds, then SIGKILL for the rest."""
    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for p in tree:
            _send(p, sig)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for p in alive:
        _send(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace)
    proc.wait()


def _send(process: "psutil.Process", sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


# "[rank1]: KeyError: 0" (torchrun), "[0]<stderr>:TypeError: ..." (horovodrun),
# "[1,0]<stderr>:..." (mpirun), "ValueError: ...", "SystemExit: ..." and the like.
EXCEPTION_LINE = re.compile(r"^(\[[\w,]+\](<std\w+>)?:\s*)?([\w.]*(Error|Exception|Exit|Interrupt))\b:?")


def _last_error(log: Path) -> str:
    """The most telling line of a failed run's log: the first exception a
    rank raised (launchers report their own wrapper errors after it)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in lines:
        if EXCEPTION_LINE.match(line):
            return line[:400]
    return lines[-1][:400] if lines else "no output"


def _ranks(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.json"))]


def archive_attempt(run_dir: Path) -> None:
    """Move a previous attempt's files to attempts/<n>/: nothing is deleted."""
    leftovers = [run_dir / f for f in ATTEMPT_FILES if (run_dir / f).exists()]
    leftovers += [p for g in ATTEMPT_GLOBS for p in run_dir.glob(g)]
    if not leftovers:
        return
    attempts = run_dir / "attempts"
    attempts.mkdir(exist_ok=True)
    target = attempts / str(len(list(attempts.iterdir())) + 1)
    target.mkdir()
    for path in leftovers:
        shutil.move(str(path), target / path.name)


def failed_runs(rows: list[RunRow], results: Path) -> list[RunRow]:
    """Runs whose done marker says they failed: the workflow runs them again."""
    failed = []
    for row in rows:
        marker = results / row.path / DONE
        try:
            status = json.loads(marker.read_text()).get("status")
        except OSError:
            continue  # no marker: the workflow runs it anyway
        except ValueError:
            status = "unreadable"
        if status != "ok":
            failed.append(row)
    return failed


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
