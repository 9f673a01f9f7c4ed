import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from ddlcompare.plan import design, envs
from ddlcompare.run import machine_lock, runner
from frameworks import data
from front.cli import workflow_argv
from runfiles import variables

REPO = Path(__file__).resolve().parent.parent
# The suite's runs only check correctness: they hold the measuring lock
# shared (machine_lock.shared_mode), so the workers' trainings overlap one
# another, yet never a real measurement of another checkout. The tests of
# the lock itself measure as real runs do (measuring_alone).
os.environ[machine_lock.SHARED_ENV] = "1"
# Real traces too large to commit: the shared folder beside the checkout.
SHARED = Path(variables.get("DDLC_SHARED") or REPO.parent / "shared")
REAL_TRACES = SHARED / "fixtures" / "real-traces"


# The longest groups, longest first: each group's wall time in the suite
# (--test-times of the quiet run at d3717a7, three workers as ./ddlc test
# runs them on 2 cores; test_knobs and test_damaged have trained one run
# less since). Handed out first (LPT), so that the last group a worker
# takes is a short one and the other workers do not wait long for it; the
# other groups, none over 40 s, follow in file order.
LONGEST_GROUPS = [
    "schedulers",  # 1345 s
    "test_faults",  # 597 s
    "test_workflow",  # 377 s
    "test_untrusted",  # 343 s
    "test_knobs",  # 206 s
    "test_tf_adapters",  # 171 s
    "test_damaged",  # 162 s
    "test_compression",  # 138 s
    "test_report",  # 136 s
    "test_tarantella",  # 116 s
    "test_followup",  # 112 s
    "test_netem",  # 86 s
    "test_devices",  # 73 s
    "test_build_scripts",  # 71 s
    "test_adapters",  # 68 s
    "test_replication",  # 67 s
    "test_design",  # 66 s
    "test_tarantella_patched",  # 53 s
    "test_report_words",  # 53 s
    "test_traces_workflow",  # 51 s
    "test_isolation",  # 45 s
    "test_tf_gate",  # 42 s
]


def pytest_configure(config):
    """xdist hands the groups out by their count of tests, most first,
    unless told not to (its --loadscope-reorder is on by default): the
    longest groups, a few tests of minutes each, went out last, where one
    worker may run them alone. The items' order
    (pytest_collection_modifyitems) is the order they go out in."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """Groups for `--dist loadgroup` (./ddlc test runs a worker more than cores): a file's
    tests stay together, so its module fixtures train once; every test of a
    real scheduler shares one group, since they share the Slurm, OAR and
    cluster daemons. Training holds the host-wide measuring lock shared
    (ddlcompare/run/machine_lock.py): the workers' trainings overlap, and
    wait only for a real measurement. xdist hands
    the groups out in the order of the items: the longest first."""
    scheduled = {item.path for item in items if item.get_closest_marker("schedulers")}
    group = {}
    for item in items:
        group[item] = "schedulers" if item.path in scheduled else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group[item]))
    rank = {name: at for at, name in enumerate(LONGEST_GROUPS)}
    items.sort(key=lambda item: rank.get(group[item], len(rank)))  # stable: files stay whole


def pytest_addoption(parser):
    parser.addoption(
        "--test-times",
        metavar="FILE",
        help="append a line per test to FILE (tab-separated: test, group, worker, start, "
        "wall_s, cpu_s): its wall time from set-up to teardown, and the CPU time of its "
        "worker and of the processes the worker waited for (a scheduler's jobs and daemons "
        "are not among them). Where wall is far above CPU, the test waits.",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """--test-times: where the suite's time goes, per test, with what it
    spent of the CPU (a third worker helps where tests wait, not where they
    compute); the slowest-30 list gives neither the rest nor the CPU."""
    path = item.config.getoption("--test-times")
    if not path:
        yield
        return
    started, cpu = time.time(), _cpu_s()
    yield
    group = next((m.args[0] for m in item.iter_markers("xdist_group")), "")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    name = item.nodeid.removesuffix(f"@{group}")  # xdist's loadgroup names the group there
    line = f"{name}\t{group}\t{worker}\t{started:.1f}\t"
    line += f"{time.time() - started:.2f}\t{_cpu_s() - cpu:.2f}\n"
    with open(path, "a") as times:  # one short append a line: the workers' lines stay whole
        times.write(line)


def _cpu_s() -> float:
    me, waited = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime


# The test schedulers (envs/schedulers/: the test Slurm, the test OAR) and the
# cluster on one machine (./ddlc cluster) are one of each per machine: fixed
# ports, /etc/slurm/slurm.conf, /etc/oar and OAR's one database. A suite of
# another checkout waits for them (schedulers_alone).
SCHEDULERS_LOCK = Path("/tmp/ddl-compare.schedulers.lock")
SCHEDULERS = "the test schedulers (Slurm, OAR, the cluster on one machine)"


@contextlib.contextmanager
def held_alone(path: Path, what: str, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the lock file ``path`` alone while the block runs (flock: the
    kernel lets go when its holder dies). Another holder is waited for,
    and ``say`` hears once for whom: the pid and command the kernel names
    and what the holder wrote into the file (its checkout)."""
    fd = machine_lock.open_shared(path)  # a lock file, or refused
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip()
            held_by = " ".join(machine_lock.describe_holders(path).split())  # one line
            say(
                f"waiting for {what}: {path} is held by {held_by}"
                + (f"; {holder}" if holder else "")
            )
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            say(f"{what}: ours after {time.monotonic() - started:.0f} s of waiting")
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"pid {os.getpid()}: the tests of {REPO}{f' (worker {worker})' if worker else ''}"
            f", since {time.strftime('%H:%M:%S')}\n".encode(),
            0,
        )
        yield
    finally:
        os.close(fd)  # lets go of the lock


@pytest.fixture
def measuring_alone(monkeypatch) -> None:
    """This test's runs measure as real runs do: the machine alone."""
    monkeypatch.delenv(machine_lock.SHARED_ENV, raising=False)


@pytest.fixture(scope="module")
def schedulers_alone(request) -> Iterator[None]:
    """The test schedulers to this module's tests alone: from a fixture
    that starts them to its end (a module's own daemons, started and
    stopped inside it), another checkout's suite waits, and says so on the
    terminal."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(text: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n{text}", file=sys.stderr, flush=True)

    with held_alone(SCHEDULERS_LOCK, SCHEDULERS, say):
        yield


def _absent(path: Path) -> str:
    return f"needs the shared data {path} (../shared beside the checkout, or set DDLC_SHARED)"


def shared_trace(name: str) -> Path:
    """A real trace of the shared data; skips the test, saying where it was
    looked for and how to point at it, when it is not there."""
    path = REAL_TRACES / name
    if not path.exists():
        pytest.skip(_absent(path))
    return path


def needs_shared(*names: str) -> pytest.MarkDecorator:
    """A mark that skips a test, saying why, unless these real traces of the
    shared data (all of them, without names) are there."""
    missing = [p for p in [REAL_TRACES / n for n in names] or [REAL_TRACES] if not p.exists()]
    return pytest.mark.skipif(bool(missing), reason=_absent(missing[0]) if missing else "")


FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_design(folder: Path, doc: dict, name: str = "design.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def ddlc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "front.cli", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


# A design small enough to train in seconds: a few steps of real data,
# evaluated on 1,000 test images (the whole 10,000 took longer than the
# 12 steps; accuracy to within about 1.5 points is all a test asks of it).
TINY_FIXED = {
    "epochs": 2,
    "max_steps": 12,
    "train_images": 4000,
    "test_images": 1000,
    "warmup_steps": 2,
    "timeout_s": 120,
}


# Snakemake's option for the runs' jobs alone: no network probe (which
# measures alone on the machine), no model gate, phases, tables, figures or
# report. For tests that check the runs and nothing after them; the steps
# after them are what test_workflow, test_report and test_damaged check.
RUNS_ONLY = ("--until", "run")
# The runs, their phases and the tables (collect): for tests that check the
# tables and nothing after them (figures, timeline, report, probe, gate).
TABLES_ONLY = ("--until", "collect")


def snakemake_cmd(workdir: Path, *extra: str, limit: int = 1200) -> list[str]:
    """Snakemake on the local profile over ``workdir``'s design.yaml, bounded
    by ``limit`` seconds (a hang's bound, not a speed test: two checkouts'
    suites at once beside other work, load 10 to 16 on 2 cores, took test_workflow's
    first workflow past 600 s, 2026-11-28); ``extra``: more --config entries or options."""
    workflow = workflow_argv(workdir / "design.yaml", None, "-d", str(workdir))
    return ["timeout", "-k", "10", str(limit), *workflow, *extra]


def tiny_design(frameworks=("torch-ddp",), procs=(2,), **fixed) -> dict:
    return {
        "name": "tiny",
        "factors": {
            "framework": list(frameworks),
            "procs_per_node": list(procs),
            "batch_size": [32],
        },
        "replications": 1,
        "fixed": {**TINY_FIXED, **fixed},
    }


def trained(doc: dict, root: Path) -> Path:
    """The design's first run, trained through the runner under ``root``:
    its run folder (whatever its status; done.json says)."""
    row = design.parse(doc, "tiny.yaml").runs()[0]
    assert runner.execute(row, root) == 0
    return root / row.path


def final_losses(results: Path) -> dict[str, float]:
    """Each run's final training loss, by its folder under ``results``."""
    return {
        str(p.parent.relative_to(results)): json.loads(p.read_text())["final_train_loss"]
        for p in results.rglob("metrics.json")
    }


# A workflow's own time beyond its runs, on a loaded 2-core machine:
# Snakemake's start and DAG, the network probe's job, each job's submission
# and the scheduler's status polls (OAR's and Slurm's take turns with the
# runs for the same cores).
WORKFLOW_OVERHEAD_S = 300


def workflow_limit(design_file: Path) -> int:
    """How long a test lets a workflow of ``design_file`` take: its runs one
    after another (they take turns on the machine), each for as long as the
    harness gives it before calling it hung (runner.derived_timeout), and
    the workflow's own time. A loaded machine then slows the test without
    failing it; a run the harness itself would stop still does."""
    runs = design.load(design_file).runs()
    return WORKFLOW_OVERHEAD_S + sum(runner.derived_timeout(row.config) for row in runs)


def trained_here(doc: dict, results: Path) -> dict[str, float]:
    """Every run of the design trained through the runner, as a local
    workflow's jobs train them (without the workflow's gate, probes and
    report, which a comparison of losses does not need): final_losses."""
    for row in design.parse(doc, "tiny.yaml").runs():
        assert runner.execute(row, results) == 0, row.path
    return final_losses(results)


# What the scheduler tests (test_slurm, test_oar; one group) submit, or part
# of it: 1 epoch of 6 steps on 1 and 2 processes.
SCHEDULED = tiny_design(procs=(1, 2), epochs=1, max_steps=6)


@pytest.fixture(scope="session")
def trained_locally(tmp_path_factory) -> dict[str, float]:
    """SCHEDULED's runs trained here once for the session: the final losses
    a scheduler's runs of them must reproduce (trained_here)."""
    return trained_here(SCHEDULED, tmp_path_factory.mktemp("trained-locally"))


@pytest.fixture(scope="session")
def tiny_trained(tmp_path_factory) -> tuple[Path, "design.Design"]:
    """tiny_design()'s one real 2-rank torch-ddp run, trained once for the
    whole session: (results folder, plan). Read it, or copy it to damage it."""
    results = tmp_path_factory.mktemp("tiny-trained")
    plan = design.parse(tiny_design(), "tiny.yaml")
    assert runner.execute(plan.runs()[0], results) == 0
    return results, plan


def assert_learned(folder: Path):
    """The run ended ok, every epoch was measured and the loss went down
    (2 epochs, at least half the test set right): its epochs table."""
    import json

    import pandas as pd

    done = json.loads((folder / "done.json").read_text())
    if done["status"] != "ok":  # why, as the runner recorded it, then what the ranks said
        record = json.loads((folder / "run.json").read_text())
        runner_log = folder / "runner.log"
        said = runner_log.read_text()[-2000:] if runner_log.exists() else ""
        train_log = (folder / "train.log").read_text()[-3000:]
        raise AssertionError(f"{record.get('reason')}\n{said}\n{train_log}")
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert list(epochs["epoch"]) == [1, 2]
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    assert epochs["test_accuracy"].iloc[-1] > 0.5
    assert (epochs["images_per_s"] > 0).all()
    return epochs


def make_cifar(folder, per_batch=20, seed=0):
    """CIFAR-10 in its official format: pickled dicts of bytes keys,
    uint8 data rows of 3072 (R, G, B planes), labels as a list."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)],
        }
        blob = pickle.dumps(batch, protocol=2)
        (folder / name).write_bytes(blob)
        sums[name] = "md5:" + hashlib.md5(blob).hexdigest()
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"airplane"] * 10}))
    return sums


def generated_cifar(folder, per_batch=1000, seed=0):
    """Generated CIFAR-10 files with the manifest that lets runs use them
    (frameworks/data.py, GENERATED_MANIFEST)."""
    import json

    sums = make_cifar(folder, per_batch, seed)
    (folder / data.GENERATED_MANIFEST).write_text(
        json.dumps({"generated_by": "tests/conftest.py generated_cifar", "files": sums})
    )
    return folder


def journal_lines(journal: Path) -> list[tuple[float, float, str]]:
    """The workflow's jobs journal (workflows/share_machine.sh): each job's
    held interval (unix seconds) and command."""
    rows = []
    for line in journal.read_text().splitlines():
        start, end, command = line.split(" ", 2)
        rows.append((float(start), float(end), command))
    return rows


def measured_windows(results: Path) -> list[tuple[float, float, str]]:
    """Every measured window a workflow recorded: each run's and each
    probe's machine_held, with what names its own job."""
    windows = []
    for path in results.rglob("run.json"):
        if "attempts" not in path.parts:
            doc = json.loads(path.read_text())
            windows.append((*doc["machine_held"], doc["path"]))
    for path in results.rglob("probe-*.json"):
        windows.append((*json.loads(path.read_text())["machine_held"], path.name))
    return windows


def assert_alone_while_measuring(workdir: Path, log: str) -> None:
    """No workflow job ran inside another job's measured window (the jobs'
    journal against the runs' and probes' machine_held), and every job
    Snakemake ran is in the journal."""
    results = workdir / "results"
    [journal] = results.rglob("logs/jobs.log")
    jobs = journal_lines(journal)
    ran = log.count("\nrule ") + log.count("\nlocalrule ") - log.count("\nlocalrule all:")
    assert len(jobs) == ran, log[-3000:]
    windows = measured_windows(results)
    assert windows
    for w_start, w_end, owner in windows:
        for start, end, command in jobs:
            if owner not in command:
                assert end <= w_start or start >= w_end, (owner, command)


def step_phase_rows(run_id: str, rank: int, step: int, start_ns: int, timed) -> list[dict]:
    """One step's rows of the step phase table as a steps file gives them
    (epoch 1): each (phase, ns) of ``timed`` after the one before, from
    ``start_ns``."""
    rows = []
    for phase, dur_ns in timed:
        rows.append(
            {
                "run_id": run_id,
                "rank": rank,
                "epoch": 1,
                "step": step,
                "phase": phase,
                "start_ns": start_ns,
                "end_ns": start_ns + dur_ns,
                "dur_ns": dur_ns,
                "source": "steps",
            }
        )
        start_ns += dur_ns
    return rows


def one_rank_part(intervals: list[tuple], collectives: list[tuple]) -> dict:
    """The part of frameworks/otf2_writer.write_archive of a one-rank run
    with one step (epoch 1, step 0, from 10 to 80 ns; clock offset 5 ns)."""
    return {
        "rank": 0,
        "world": 1,
        "hostname": "h0",
        "run_id": "r",
        "offset_ns": 5,
        "intervals": intervals,
        "steps": [(1, 0, 10, 80)],
        "collectives": collectives,
    }


def needs_environment(env: str, probe: str, built: bool = True) -> pytest.MarkDecorator:
    """Skip where an environment is not built (``probe`` does not import in
    it, or ``built`` is False), naming its folder and how to build it."""
    return pytest.mark.skipif(
        not (built and envs.has_module(env, probe)),
        reason=f"the {env} environment is not built ({envs.env_dir(env)}): "
        + envs.how_to_build(env),
    )


def mpirun_per_node(hosts: str, agent: str) -> list[str]:
    """How a launcher's command line starts where mpirun runs one process
    per node (``hosts``: comma-separated), reaching the nodes through the
    scheduler's remote shell ``agent``."""
    return ["mpirun", "--host", hosts, "--npernode", "1", "--mca", "plm_rsh_agent", agent]


def srun_per_node(nodes: list[str]) -> list[str]:
    """How a launcher's command line goes on under Slurm: srun runs one
    process per node, in the job's allocation."""
    n = len(nodes)
    return [
        "srun",
        "--overlap",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
    ]


@contextlib.contextmanager
def scheduler_up(script: Path, name: str) -> Iterator[None]:
    """A test scheduler of envs/schedulers/ (``script``) started, and
    stopped at the end: it needs root on Debian, else the test skips."""
    if os.geteuid() != 0 or not Path("/usr/bin/apt-get").exists():
        pytest.skip(f"the test {name} needs root on Debian ({script.relative_to(REPO)})")
    started = time.monotonic()
    up = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    print(f"{name} up in {time.monotonic() - started:.1f} s")
    try:
        yield
    finally:
        subprocess.run([str(script), "stop"], timeout=120)
