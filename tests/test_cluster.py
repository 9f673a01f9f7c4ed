"""The cluster on one machine (./ddlc cluster, ddlcompare/run/cluster.py): nodes
in network and UTS namespaces of their own, a real Slurm across them. Every
installed multi-process framework trains on 2 nodes through the slurm
profile, its ranks really on different nodes; scheduler faults (a node
lost, a time limit, a cancel) leave the run recorded with Slurm's reason
and a rerun does only what is left. Also: the profiles by name, as the
card writes them, from the project root."""

import concurrent.futures
import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import REPO, workflow_limit, write_design
from ddlcompare.plan import envs
from ddlcompare.run import cluster, netem
from ddlcompare.run.schedulers import slurm
from frameworks import registry
from front import workflow_support as ws
from test_oar import OarUser, ended, oarstat, runs_below, slow_command, wait_for

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
DDLC = str(REPO / "ddlc")
# Every framework whose processes a launcher spreads over nodes.
SPREAD = [n for n, f in registry.FRAMEWORKS.items() if f.launcher != "one-process"]
INSTALLED = [
    n for n in SPREAD if envs.has_module(registry.FRAMEWORKS[n].env, registry.FRAMEWORKS[n].probe)
]


def one_per_launcher(turn: int) -> list[str]:
    """An installed framework for each launcher: what a scheduler adds is
    the host list each launcher turns into processes, so each scheduler
    takes every launcher once. Frameworks that share a launcher (Horovod
    on PyTorch and Keras; Tarantella and its patched build) take turns
    between the schedulers (turn 0, 1), so every installed framework
    crosses two nodes through a real scheduler in each run of the suite."""
    by_launcher: dict[str, list[str]] = {}
    for name in INSTALLED:
        by_launcher.setdefault(registry.FRAMEWORKS[name].launcher, []).append(name)
    return sorted(names[turn % len(names)] for names in by_launcher.values())


SLURM_FRAMEWORKS, OAR_FRAMEWORKS = one_per_launcher(0), one_per_launcher(1)


def test_the_two_schedulers_take_every_installed_framework_and_launcher():
    launchers = {registry.FRAMEWORKS[n].launcher for n in INSTALLED}
    for taken in (SLURM_FRAMEWORKS, OAR_FRAMEWORKS):
        assert {registry.FRAMEWORKS[n].launcher for n in taken} == launchers
    assert set(SLURM_FRAMEWORKS) | set(OAR_FRAMEWORKS) == set(INSTALLED)


TINY = {
    "epochs": 1,
    "max_steps": 4,
    "train_images": 2000,
    "test_images": 1000,
    "warmup_steps": 1,
    "timeout_s": 240,
}


def design(frameworks, nodes=2, **fixed) -> dict:
    return {
        "name": "cluster",
        "factors": {"framework": list(frameworks), "procs_per_node": [1], "batch_size": [32]},
        "replications": 1,
        "fixed": {**TINY, "nodes": nodes, **fixed},
    }


@pytest.mark.parametrize("name", ["grid5000", "slurm", "local"])
def test_profiles_by_bare_name_from_the_project_root(name, tmp_path):
    """`snakemake --profile grid5000`, as the card writes it: Snakemake
    looks a bare name up in the working directory first (the project root
    holds a link to each of profiles/)."""
    write_design(tmp_path, design(["torch-ddp"], nodes=1))
    out = subprocess.run(
        [SNAKEMAKE, "--profile", name, "--dry-run", "-d", str(tmp_path), "--config",
         f"design={tmp_path / 'design.yaml'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"Using profile {name} " in out.stdout + out.stderr
    executor = yaml.safe_load((REPO / name / "config.yaml").read_text()).get("executor")
    assert executor == {"grid5000": "oar", "slurm": "slurm", "local": None}[name]


def test_ddlc_help_lists_every_command_and_run_help_sets_nothing_up(tmp_path):
    out = subprocess.run([DDLC, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in (
        "./ddlc run",
        "./ddlc test",
        "./ddlc setup",
        "./ddlc cluster",
        "plan",
        "report",
    ):
        assert command in out.stdout, command
    # No environment at all: help still answers, and nothing is built.
    env = {**os.environ, "DDLC_VENV": str(tmp_path / "none")}
    for argv in ([DDLC, "run", "--help"], [DDLC, "test", "-h"]):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        assert out.returncode == 0 and "setup:" not in out.stderr, out.stderr
        assert "./ddlc" in out.stdout
    assert not (tmp_path / "none").exists()


# ---- the cluster --------------------------------------------------------------------


def test_cluster_help_is_its_own_and_arguments_are_checked_against_the_machine():
    out = subprocess.run([DDLC, "cluster", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--rate-mbit" in out.stdout and "OAR" in out.stdout
    assert "default 3" in out.stdout, out.stdout
    too_many = 1 + max(3, cluster.OVERCOMMIT * (os.cpu_count() or 1) // cluster.CPUS_PER_NODE)
    for nodes, rate, said in [
        (too_many, 1000, f"--nodes {too_many}: each node claims"),
        (1, 1000, "--nodes 1: a cluster needs at least 2 nodes"),
        (3, 0, "--rate-mbit 0: give a link rate from 1"),
        (3, -1, "--rate-mbit -1: give a link rate from 1"),
    ]:
        with pytest.raises(cluster.ClusterError, match=said):
            cluster.check_size(nodes, rate)
    cluster.check_size(2, 1000)


def _namespaces_allowed() -> str | None:
    if os.geteuid() != 0:
        return "the cluster on one machine needs root (network namespaces, daemons)"
    if not Path("/usr/bin/apt-get").exists():
        return "the cluster installs Debian's Slurm: apt-get not found"
    if found := netem.problems("local"):
        return "; ".join(found)
    try_ns = subprocess.run(["ip", "netns", "add", "ddlc-probe-ns"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "ddlc-probe-ns"], capture_output=True)
    if try_ns.returncode != 0:
        return f"network namespaces are not allowed here: {try_ns.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def slurm_cluster(schedulers_alone):
    if why := _namespaces_allowed():
        pytest.skip(why)
    if cluster.live_record():  # one left by a killed session: up clears it
        pytest.skip(f"a cluster is already up ({cluster.RECORD}); the tests start their own")
    started = time.monotonic()
    up = subprocess.run([DDLC, "cluster", "up"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    print(f"cluster up in {time.monotonic() - started:.1f} s")
    record = cluster.status()
    env = {
        **cluster.client_env(),
        "PYTHONPATH": str(REPO),
        "DDLC_VENV": str(Path(sys.executable).parents[1]),
    }
    yield record, env
    down = subprocess.run([DDLC, "cluster", "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "left on this machine: " in down.stderr and "ddlcoar" in down.stderr, down.stderr
    assert not [n for n in netem.namespaces() if n.startswith(f"{netem.PREFIX}{cluster.TAG}-")]
    assert cluster.HOSTS_BEGIN not in Path("/etc/hosts").read_text()
    # Every process it started, the daemons' children too, by the cluster's mark.
    assert not cluster._marked(record["mark"]), [
        p.cmdline() for p in cluster._marked(record["mark"])
    ]


def slurm_argv(workdir: Path, *extra: str, limit: int) -> list[str]:
    """`snakemake --profile slurm` from the project root, as the card writes
    it; squeue for status (the cluster keeps no accounting), polled often."""
    return [
        "timeout", "-k", "30", str(limit), SNAKEMAKE, "--profile", "slurm",
        "-d", str(workdir), "--config", f"design={workdir / 'design.yaml'}",
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
        "--seconds-between-status-checks", "2", "--latency-wait", "5", *extra,
    ]  # fmt: skip


def slurm_snakemake(workdir: Path, env: dict, *extra: str):
    argv = slurm_argv(workdir, *extra, limit=workflow_limit(workdir / "design.yaml"))
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)


def records(workdir: Path) -> dict[str, dict]:
    found = [json.loads(p.read_text()) for p in (workdir / "results").rglob("run.json")]
    return {r["config"]["framework"]: r for r in found}


def each_on_its_own_node(workdir: Path, scheduler: str, frameworks: list[str], out) -> None:
    """Each of the frameworks ran ok, its ranks on 2 different nodes."""
    found = records(workdir)
    assert sorted(found) == sorted(frameworks), out.stderr[-3000:]
    for name, record in found.items():
        assert record["status"] == "ok", (name, record.get("reason"), out.stderr[-2000:])
        assert record["scheduler"] == scheduler
        hosts = [h["name"] for h in record["hosts"]]
        ranks = sorted(r["hostname"] for r in record["ranks"])
        assert len(set(hosts)) == 2 and ranks == sorted(hosts), (name, hosts, ranks)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_second_up_is_refused(slurm_cluster):
    out = subprocess.run([DDLC, "cluster", "up"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "already up" in out.stderr
    status = subprocess.run([DDLC, "cluster", "status"], capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout.count("idle") == 3, status.stdout
    # Both schedulers, the user and command to submit with, every daemon alive.
    assert status.stdout.count(" Alive") == 3 and "OAR: as ddlcoar" in status.stdout, status.stdout
    assert "--profile slurm --slurm-status-command squeue" in status.stdout
    daemons = slurm_cluster[0]["daemons"]
    assert {"slurmctld", "munged", "oar-server"} <= set(daemons) and all(daemons.values())
    assert f"daemons: {len(daemons)} of {len(daemons)} running" in status.stdout
    # The test OAR (one per machine, as the cluster's) refuses while the cluster's runs.
    oar = subprocess.run(
        [str(cluster.OAR_SCRIPT), "start"], capture_output=True, text=True, timeout=120
    )
    assert oar.returncode != 0 and "already listens on port 6666" in oar.stderr, oar.stderr
    assert "./ddlc cluster down" in oar.stderr


def test_nodes_have_their_own_names_addresses_and_a_shaped_link(slurm_cluster):
    record, env = slurm_cluster
    out = subprocess.run(
        ["srun", "-N3", "-n3", "--mem=50", "sh", "-c",
         'echo "$(hostname) $(ip -4 -o addr show ddlc0 | cut -d" " -f7)"; tc qdisc show dev ddlc0'],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = sorted(line.split() for line in out.stdout.splitlines() if "/" in line)
    expected = sorted([n["hostname"], f"{n['address']}/24"] for n in record["nodes"])
    assert seen == expected
    assert out.stdout.count("qdisc tbf") == 3 and "rate 1Gbit" in out.stdout


@pytest.mark.slow
@pytest.mark.schedulers
def test_every_launcher_trains_across_two_nodes_through_slurm(slurm_cluster, tmp_path):
    _, env = slurm_cluster
    write_design(tmp_path, design(SLURM_FRAMEWORKS))
    started = time.monotonic()
    out = slurm_snakemake(tmp_path, env)
    print(f"{SLURM_FRAMEWORKS} on 2 nodes: {time.monotonic() - started:.1f} s")
    each_on_its_own_node(tmp_path, "slurm", SLURM_FRAMEWORKS, out)
    if "lbann" in SLURM_FRAMEWORKS:
        lbanns_own_srun(tmp_path)


# Snakemake quotes a job's command-line values with repr(): a name holding a
# single quote is put in double quotes (where $(...) and `...` run), and one
# holding both quotes in single quotes with \' (which ends them). Through a
# real Slurm, a working folder named so had its $(touch ...) run in the job:
# the workflow refuses such a folder before any job, on every profile.
HOSTILE_FOLDERS = [
    "$(touch dollar)`touch tick`",
    "it's $(touch dollar)`touch tick`",
    """a'b"$(touch dollar)`touch tick`""",
]


def refused_and_ran_nothing(out, workdir: Path, *places: Path) -> None:
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in said, said[-3000:]
    assert "the working folder (-d)" in said and "is not allowed in a path" in said, said[-3000:]
    ran = [p / n for p in (workdir, *places) for n in ("dollar", "tick") if (p / n).exists()]
    assert not ran and not (workdir / "results").exists(), ran


@pytest.mark.slow
@pytest.mark.schedulers
@pytest.mark.parametrize("name", HOSTILE_FOLDERS)
def test_a_folder_named_like_commands_is_refused_before_slurm_runs_anything(
    slurm_cluster, tmp_path, name
):
    _, env = slurm_cluster
    workdir = tmp_path / name
    workdir.mkdir()
    write_design(workdir, design(["torch-ddp"], nodes=1))
    argv = slurm_argv(workdir, limit=workflow_limit(workdir / "design.yaml"))
    argv[argv.index("--config") + 1] = "design=design.yaml"  # a path the harness takes
    # from the project root, where the profile's bare name is found
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    refused_and_ran_nothing(out, workdir, tmp_path, REPO, Path.home())
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env)
    assert not (workdir / ".snakemake" / "slurm_logs").exists() and not queue.stdout.strip()


def lbanns_own_srun(workdir: Path) -> None:
    """LBANN launches its ranks itself, with srun inside the job: they form
    one MPI world (without srun's MPI plugin, Open MPI refuses to start
    here; other MPIs may start worlds of one) and each times its steps."""
    folder = next(p.parent for p in (workdir / "results").rglob("run.json") if "lbann" in str(p))
    assert "srun --overlap --mpi=pmix" in (folder / "lbann" / "batch.sh").read_text()
    assert "Total number of processes  : 2" in (folder / "lbann" / "out.log").read_text()
    for rank in (0, 1):
        steps = (folder / f"steps.rank{rank}.tsv").read_text().splitlines()
        assert len(steps) - 1 == TINY["max_steps"], steps  # a header, then a row a step


# ---- OAR on the same nodes ------------------------------------------------------------


@pytest.fixture(scope="module")
def oar_cluster(slurm_cluster):
    """The cluster's OAR, and its unprivileged user (OAR refuses root's jobs)
    able to reach this checkout and every environment's Python."""
    script = str(cluster.OAR_SCRIPT)
    env = cluster.oar_env(slurm_cluster[0]["nodes"])
    pythons = [envs.python_for(e) for e in {registry.FRAMEWORKS[n].env for n in INSTALLED}]
    granted = subprocess.run(
        [script, "grant", *map(str, pythons), str(REPO / "profiles" / "grid5000" / "job-end")],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    name = subprocess.run([script, "user"], env=env, capture_output=True, text=True).stdout.strip()
    user = OarUser(name)
    for env_name in {registry.FRAMEWORKS[n].env for n in INSTALLED} - {"torch"}:
        # Found in root's ~/.cache by default: named for a user whose home is elsewhere.
        user.env[envs.variable(env_name)] = str(envs.env_dir(env_name))
    yield user
    shutil.rmtree(user.home / "ddlc-tests", ignore_errors=True)


def oar_argv(workdir: Path, *extra: str, limit: int) -> list[str]:
    """`snakemake --profile grid5000` from the project root, as the submitting
    user. By path: with -d, a profile found by its bare name in the working
    directory gives its scripts relative to it (docs/clusters.md)."""
    return [
        "timeout", "-k", "30", str(limit), str(Path(sys.executable).parent / "python"),
        "-m", "snakemake", "--profile", str(REPO / "grid5000"), "-d", str(workdir),
        "--config", f"design={workdir / 'design.yaml'}", "--seconds-between-status-checks", "1",
        "--max-status-checks-per-second", "10", "--latency-wait", "5", *extra,
    ]  # fmt: skip


def oar_snakemake(user, workdir: Path, *extra: str):
    limit = workflow_limit(workdir / "design.yaml")
    return user.run(oar_argv(workdir, *extra, limit=limit), REPO, timeout=limit + 60)


@pytest.mark.slow
@pytest.mark.schedulers
def test_every_launcher_trains_across_two_nodes_through_oar(oar_cluster):
    workdir = oar_cluster.workdir("frameworks")
    write_design(workdir, design(OAR_FRAMEWORKS))
    started = time.monotonic()
    out = oar_snakemake(oar_cluster, workdir)
    print(f"{OAR_FRAMEWORKS} on 2 OAR nodes: {time.monotonic() - started:.1f} s")
    each_on_its_own_node(workdir, "oar", OAR_FRAMEWORKS, out)


@pytest.mark.slow
@pytest.mark.schedulers
@pytest.mark.parametrize("name", HOSTILE_FOLDERS)
def test_a_folder_named_like_commands_is_refused_before_oar_runs_anything(oar_cluster, name):
    parent = oar_cluster.workdir("hostile-name")
    workdir = parent / name
    workdir.mkdir()
    shutil.chown(workdir, oar_cluster.name)
    write_design(workdir, design(["torch-ddp"], nodes=1))
    argv = oar_argv(workdir, limit=workflow_limit(workdir / "design.yaml"))
    argv[argv.index("--config") + 1] = "design=design.yaml"
    out = oar_cluster.run(argv, REPO, timeout=120)
    refused_and_ran_nothing(out, workdir, parent, REPO, oar_cluster.home, Path.home())
    assert not (workdir / ".snakemake" / "oar_logs").exists()


@pytest.mark.slow
@pytest.mark.schedulers
def test_the_plugin_passes_snakemakes_own_executor_tests_on_the_clusters_oar(oar_cluster):
    """Snakemake's test base for executor plugins (TestWorkflowsBase: its
    simple and group workflows), as the plugin's own tests run it, by OAR's
    user on the cluster's nodes."""
    plugin = REPO / "plugins" / "snakemake-executor-plugin-oar"
    workdir = oar_cluster.workdir("plugin-tests")
    # This checkout's plugin, in the tests and in their jobs (the plugin passes PYTHONPATH).
    argv = [
        "env", f"PYTHONPATH={plugin}:{REPO}", sys.executable, "-m", "pytest", str(plugin / "tests"),
        "-p", "no:cacheprovider", "--basetemp", str(workdir / "tmp"), "-v",
    ]  # fmt: skip
    out = oar_cluster.run(argv, plugin, timeout=300)  # a minute or two: seven tiny jobs
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-4000:]
    for test in ("test_simple_workflow", "test_group_workflow"):
        assert f"::TestWorkflows::{test} PASSED" in said, said[-4000:]
    # Their jobs went through OAR, as its user, on the cluster's nodes.
    logs = list((workdir / "tmp").rglob(".snakemake/oar_logs/**/*.out"))
    assert logs, said[-2000:]
    for job_id in {p.stem for p in logs}:
        job = oarstat(oar_cluster, job_id, workdir)
        assert job["owner"] == oar_cluster.name and job["state"] == "Terminated", job
        assert job["exit_code"] == 0 and job["assigned_network_address"], job


# What each user's campaign opens of the machine's shared files: the
# measuring lock and its turnstile, and the folder where trainings register.
SHARED_FILES = """
import os, sys
from pathlib import Path
from ddlcompare.run import machine_lock as m
os.close(m.open_shared(m.turnstile(m.lock_path())))
with m.training(Path(sys.argv[1]), os.getsid(0), Path(".")):
    pass
"""


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_second_user_plans_and_registers_after_the_first_on_a_shared_frontend(oar_cluster):
    """A frontend several users share: the first (root, umask 077) plans a
    campaign and registers a training, creating the measuring lock, its
    turnstile and the trainings' folder; OAR's user does the same after it."""
    shared = Path(tempfile.mkdtemp(prefix="ddlc-frontend-", dir="/tmp"))
    shared.chmod(0o1777)
    machine = {
        "DDLC_MEASURE_LOCK": str(shared / "measure.lock"),
        "DDLC_ATTEMPTS": str(shared / "a"),
    }
    try:
        for user in ("root", oar_cluster.name):
            workdir = oar_cluster.workdir(f"frontend-{user}")
            write_design(workdir, design(["torch-ddp"], nodes=1))
            shutil.chown(workdir / "design.yaml", oar_cluster.name)
            argv = [
                "env", *(f"{k}={v}" for k, v in machine.items()), "sh", "-c",
                'umask 077 && "$0" -m front.cli plan --design "$1" && "$0" -c "$2" "$3"',
                sys.executable, str(workdir / "design.yaml"), SHARED_FILES, str(workdir),
            ]  # fmt: skip
            if user == "root":
                done = subprocess.run(
                    argv, cwd=REPO, env={**oar_cluster.env, "HOME": os.environ["HOME"]},
                    capture_output=True, text=True, timeout=300,
                )  # fmt: skip
            else:
                done = oar_cluster.run(argv, REPO, timeout=300)
            assert done.returncode == 0, (user, done.stderr[-3000:])
            assert "Permission denied" not in done.stderr, (user, done.stderr[-3000:])
        for path in (shared / "measure.lock", shared / "measure.lock.turn"):
            assert path.owner() == "root" and stat.S_IMODE(path.stat().st_mode) == 0o666, path
        assert stat.S_IMODE((shared / "a").stat().st_mode) == 0o1777
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---- scheduler faults (Slurm) -----------------------------------------------------------


def fault_design(workdir: Path, epochs=(1, 500)) -> None:
    """A run of 1 epoch on 1 node that finishes, and one of 500 on 2 nodes to
    be stopped: on the 3 nodes both fit at once, so the short one finishes
    whichever of the two Slurm starts first (two 2-node jobs ran one after
    the other, and when the long one went first it ended before the test
    could stop it)."""
    doc = design(["torch-ddp"], timeout_s=3600, test_images=None)  # the whole test set: long
    del doc["fixed"]["epochs"], doc["fixed"]["nodes"]
    doc["factors"]["epochs"] = list(epochs)
    doc["factors"]["nodes"] = [1, 2][-len(epochs) :]
    if len(epochs) > 1:
        doc["zip"] = [["epochs", "nodes"]]
    write_design(workdir, doc)


class SlurmWay:
    """The slurm profile as the fault tests drive it: as root, squeue for status."""

    def __init__(self, env: dict):
        self.env = env
        self.argv = slurm_argv

    def start(self, argv: list[str], log) -> subprocess.Popen:
        return subprocess.Popen(argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=REPO)

    def jobs(self) -> str:
        return self.run(["squeue", "-l"]).stdout

    @staticmethod
    def long_job(workdir: Path) -> str | None:
        logs = (workdir / ".snakemake" / "slurm_logs" / "rule_run").glob("*epochs~500*/*.log")
        return next((p.stem for p in logs), None)  # the plugin names a log by its job id

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--user", "root"], env=self.env)


class OarWay:
    """The grid5000 profile as the fault tests drive it: as OAR's user."""

    def __init__(self, user):
        self.user = user
        self.argv = oar_argv

    def start(self, argv: list[str], log) -> subprocess.Popen:
        return self.user.start(argv, REPO, log)

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return self.user.run(argv, REPO)

    @staticmethod
    def long_job(workdir: Path) -> str | None:
        logs = (workdir / ".snakemake" / "oar_logs" / "rule_run").glob("*epochs-500*/*.out")
        return next((p.stem for p in logs), None)  # the plugin names a log by its job id

    def jobs(self) -> str:
        return self.user.run(["oarstat", "-u", self.user.name, "-f"], REPO).stdout

    def cancel_all(self) -> None:
        out = self.user.run(["oarstat", "-u", self.user.name, "-J"], REPO)
        if jobs := list(json.loads(out.stdout or "{}")):
            self.user.run(["oardel", *jobs], REPO)


def by_epochs(workdir: Path) -> dict[int, dict]:
    found = [json.loads(p.read_text()) for p in (workdir / "results").rglob("run.json")]
    return {r["config"]["epochs"]: r for r in found}


def long_run_training(workdir: Path, way, short_too: bool = True) -> str:
    """The long run's job id, once the short run is done and the long one
    trains (its epochs table has begun)."""

    def training():
        done = [str(p) for p in (workdir / "results").rglob("done.json")]
        assert not [p for p in done if "epochs~500" in p], (
            "the long run ended before it was stopped"
        )
        steps = [p for p in (workdir / "results").rglob("epochs.tsv") if "epochs~500" in str(p)]
        return len(done) == int(short_too) and steps

    wait_for("the long run training", training)
    return wait_for("the long run's job id", lambda: way.long_job(workdir), 30)


@contextlib.contextmanager
def in_background(way, workdir: Path):
    """Workflows started in the background; whatever happens, they and their
    jobs end with the test."""
    started = []

    def start(*extra):
        log = open(workdir / "snakemake.log", "w")
        started.append(way.start(way.argv(workdir, *extra, limit=600), log))
        return started[-1]

    yield start
    # The jobs first (the test cluster's own): a workflow whose jobs are gone
    # ends by itself, where one stopped first waits on them (30 s and more).
    way.cancel_all()
    for proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.fixture
def workflow(slurm_cluster, tmp_path):
    with in_background(SlurmWay(slurm_cluster[1]), tmp_path) as start:
        yield start


def workflow_failed(proc: subprocess.Popen, workdir: Path, way, limit: float = 300) -> None:
    """Snakemake ends, failed; if it does not, what it and the scheduler
    were doing (a fault test's hang is otherwise silent)."""
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        log = (workdir / "snakemake.log").read_text(errors="replace")
        pytest.fail(
            f"the workflow did not end in {limit} s.\n--- its log (tail):\n{log[-4000:]}"
            f"\n--- the scheduler's jobs:\n{way.jobs()[-4000:]}"
        )
    assert code != 0, "the workflow ended well after a fault"


def stopped_with(workdir: Path, proc: subprocess.Popen, said: str, way) -> dict:
    """Snakemake ends failed; the long run is recorded interrupted, in the scheduler's words."""
    workflow_failed(proc, workdir, way)
    record = wait_for(
        "the long run's record",
        lambda: by_epochs(workdir)[500]["status"] != "running" and by_epochs(workdir)[500],
    )
    assert record["status"] == "interrupted", record
    assert said in record["reason"], record["reason"]
    # As complete under OAR's SIGKILL as under Slurm's SIGTERM.
    assert record["scheduler"] and record["hosts"] and record["command"], record
    print(f"recorded: {record['reason']}")
    return record


def only_the_stopped_run_is_left(workdir: Path, way) -> None:
    """Nothing finished is lost: a rerun (dry) does the long run alone."""
    out = way.run(way.argv(workdir, "--dry-run", limit=120))
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stdout + out.stderr  # the job stats: one run left
    jobs = {tuple(line.split()) for line in said.splitlines() if line.startswith("run ")}
    # One the scheduler failed lost its outputs to Snakemake. One the harness
    # recorded failed (its job succeeded) keeps its done marker until the
    # real invocation moves it to attempts/ (a dry run moves nothing): the
    # plan counts it all the same.
    assert jobs == {("run", "1")}, said[-2000:]
    assert by_epochs(workdir)[1]["status"] == "ok"
    markers = [json.loads(p.read_text()) for p in (workdir / "results").rglob("done.json")]
    assert [m["status"] for m in markers if m["status"] == "ok"] == ["ok"]


def bring_back(lost: str, env: dict) -> None:
    """The lost node's daemons again, and both schedulers take it back: the
    tests after this one use the same cluster."""
    oar = (cluster.STATE / "oar").exists()
    if oar:  # OAR has found the node lost (finaud, a job's end): revived, it stays
        wait_for(f"{lost} lost in OAR", lambda: oar_states(lost) & {"Suspected", "Dead"}, 60)
    cluster.restore_node(lost)
    wait_for("the node back in Slurm", lambda: "down" not in cluster._sinfo(env), 60)
    if oar:  # OAR's probe job ran; the node is its again
        wait_for(f"{lost} Alive in OAR", lambda: oar_states(lost) == {"Alive"}, 60)


def oar_states(node: str) -> set[str]:
    out = subprocess.run(["oarnodes", "-s", node], capture_output=True, text=True)
    return {word for word in out.stdout.split() if word.isalpha() and word != node}


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_job_cancelled_by_slurm_is_recorded_and_rerun_alone(slurm_cluster, workflow, tmp_path):
    _, env = slurm_cluster
    fault_design(tmp_path)
    proc = workflow()
    job = long_run_training(tmp_path, SlurmWay)
    subprocess.run(["scancel", job], env=env, check=True)
    stopped_with(tmp_path, proc, f"Slurm job {job}: CANCELLED", SlurmWay(env))
    only_the_stopped_run_is_left(tmp_path, SlurmWay(env))


SLURM_SLEEP = "sleep 291"  # a command no other test runs, found by its command line


def slurm_job_command(command: str) -> tuple[str, psutil.Process] | None:
    """A Slurm job's ``command`` once its shell runs it: (job id, process)."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.info["cmdline"] == command.split():
                if job := process.environ().get("SLURM_JOB_ID"):
                    return job, process
    return None


def test_the_slurm_plugins_patch_applies_once_to_the_pinned_plugin(tmp_path):
    """envs/patches/slurm-plugin's anchor is in the plugin envs/torch.txt pins
    (set-up applies it at every run): applied twice to a copy, its hook is
    there once and the plugin still imports."""
    installed = Path(importlib.util.find_spec("snakemake_executor_plugin_slurm").origin).parent
    copy = tmp_path / installed.name
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec = REPO / "envs" / "patches" / "slurm-plugin" / "cancel.json"
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, str(REPO / "envs" / "patches" / "apply.py"), str(spec), str(copy)],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
    assert (copy / "__init__.py").read_text().count("cancel_workflow_jobs(self.run_uuid") == 1
    imported = subprocess.run(
        [sys.executable, "-c", f"import {installed.name}.ddlc_cancel, {installed.name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_workflow_interrupted_during_a_status_check_cancels_its_slurm_jobs(
    slurm_cluster, tmp_path
):
    """Ctrl-C while the Slurm plugin checks its jobs' status: Snakemake's
    list of active jobs is empty for that while, and the upstream plugin
    cancelled nothing (the job ran on to its time limit). Our patch
    (envs/patches/slurm-plugin) cancels the workflow's jobs by their name:
    Slurm records the job cancelled and its command is killed."""
    _, env = slurm_cluster
    (tmp_path / "bin").mkdir()
    real = shutil.which("squeue", path=env["PATH"])
    assert real, env["PATH"]
    squeue = slow_command(real, tmp_path / "bin")
    env = {**env, "PATH": f"{tmp_path / 'bin'}:{env['PATH']}"}
    (tmp_path / "Snakefile").write_text(
        f'rule long:\n    output: "x"\n    shell: "{SLURM_SLEEP}"\n'
    )
    argv = [
        "timeout", "-k", "30", "600", SNAKEMAKE, "--profile", "slurm",
        "-s", str(tmp_path / "Snakefile"), "-d", str(tmp_path),
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
        "--seconds-between-status-checks", "2",
    ]  # fmt: skip
    log_path = tmp_path / "snakemake.log"
    log = open(log_path, "w")
    # timeout gives Snakemake a process group of its own (the test's own
    # Ctrl-C does not reach it) and SIGINT's default action, whatever the
    # test inherited (a shell's background job ignores it).
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    job = None
    try:

        def under_way(check):
            assert proc.poll() is None, log_path.read_text()[-3000:]
            return check()

        job, command = wait_for(
            f"the job's {SLURM_SLEEP}",
            lambda: under_way(lambda: slurm_job_command(SLURM_SLEEP)),
            120,
        )
        wait_for("a status check", lambda: under_way(lambda: runs_below(proc, squeue)), 60)
        [snakemake] = [
            c for c in psutil.Process(proc.pid).children() if SNAKEMAKE in c.cmdline()
        ]  # fmt: skip
        snakemake.send_signal(signal.SIGINT)  # Ctrl-C, to Snakemake itself
        proc.wait(timeout=120)
        said = {}

        def cancelled() -> bool:
            out = subprocess.run(
                ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True
            )
            said["job"] = out.stdout.strip() or out.stderr.strip()
            return "JobState=CANCELLED" in said["job"]

        try:
            wait_for(f"Slurm cancelling job {job}", cancelled, 60)
        except AssertionError as error:  # what Slurm and the workflow said
            raise AssertionError(
                f"{error} (is envs/patches/slurm-plugin applied? set-up applies it); "
                f"{said.get('job')}; {log_path.read_text()[-3000:]}"
            ) from None
        wait_for(f"job {job}'s {SLURM_SLEEP} killed", lambda: ended(command), 30)
    finally:  # whatever failed, nothing of it outlives the test
        if job:
            subprocess.run(["scancel", job], env=env)
        with contextlib.suppress(psutil.Error):
            for process in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                process.kill()
        proc.wait(timeout=60)
        log.close()


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_node_lost_mid_job_is_recorded_and_slurm_runs_it_again(slurm_cluster, workflow, tmp_path):
    """Slurm requeues a batch job whose node failed (JobRequeue=1, its
    default): the attempt is recorded interrupted in Slurm's words, and
    Slurm queues the run again; the finished run is not touched."""
    _, env = slurm_cluster
    fault_design(tmp_path)
    workflow()
    job = long_run_training(tmp_path, SlurmWay)

    def job_nodes():
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T %N"], capture_output=True, text=True, env=env
        ).stdout.split()
        return (out[0], slurm.expand(out[1]) if len(out) == 2 else []) if out else ("", [])

    lost = job_nodes()[1][1]  # the second node: the runner lives on the first
    cluster.lose_node(lost)
    try:

        def interrupted():
            found = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("run.json")]
            stopped = [
                r for r in found if r["config"]["epochs"] == 500 and r["status"] == "interrupted"
            ]
            return stopped and stopped[0]

        record = wait_for("the attempt recorded", interrupted, 120)
        said = record["reason"]  # Slurm's words, the lost node named
        assert f"Slurm job {job}: NODE_FAIL; node down: {lost} (Not responding)" in said, said
        # Queued again by Slurm itself (a requeued job waits a moment before it starts).
        wait_for("the job queued again", lambda: job_nodes()[0] in ("PENDING", "RUNNING"), 60)
        assert by_epochs(tmp_path)[1]["status"] == "ok"
        assert len(list((tmp_path / "results").rglob("done.json"))) == 1
    finally:
        bring_back(lost, env)


class HeldPastTheirLimits:
    """A job of each scheduler whose machine is held by a measurement (a
    lock of their own) past its whole limit of 1 minute, while a second job
    is planned on the OAR job's node right after it: each job waits in its
    shell prefix (the Snakefile's), adds the wait to its limit as it goes,
    and runs its command once the machine is free, instead of its scheduler
    ending it in the wait. The hold runs in the background (a minute and
    more of pure waiting), beside the Slurm time-limit test's own wait."""

    HOLD_S = 100  # past the limit, Slurm's check of it (every 30 s) and KillWait (5 s)

    def __init__(self, env: dict, user, node: str):
        self.env, self.user, self.node = env, user, node
        self.workdir = user.workdir("wait")
        self.lock = self.workdir / "measure.lock"
        self.lock.touch()
        shutil.chown(self.lock, user.name)
        self.measurement = open(self.lock)
        fcntl.flock(self.measurement, fcntl.LOCK_EX)
        self.slurm_job, self.oar_job = self.sbatch(), self.oarsub()
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.held = self.pool.submit(self.hold)

    def script(self, name: str) -> Path:
        """A job's script: the workflow's prefix, then a command that leaves a mark."""
        command = ws.job_prefix(self.workdir / f"{name}.jobs.log")
        command += f"echo ran > {self.workdir / f'{name}.ran'}"
        script = self.workdir / f"{name}.sh"
        script.write_text(
            f"#!/bin/sh\nexport DDLC_MEASURE_LOCK={self.lock}\n"
            f"exec bash -c {shlex.quote(command)}\n"
        )
        script.chmod(0o755)
        shutil.chown(script, self.user.name)
        return script

    def sbatch(self) -> str:
        out = self.workdir / "slurm.%j.out"
        argv = ["sbatch", "--parsable", "--time=1", "--mem=50", "-o", str(out)]
        done = subprocess.run(
            [*argv, str(self.script("slurm"))], env=self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def oarsub(self) -> str:
        def submit(*argv: str) -> str:  # oarsub takes the job's folder from $PWD
            done = subprocess.run(
                self.user.as_user(["oarsub", "-p", f"host='{self.node}'", "-l",
                                   "host=1,walltime=0:01:00", *argv]),
                cwd=self.workdir, env={**self.user.env, "PWD": str(self.workdir)},
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            return next(w.split("=")[1] for w in done.stdout.split() if w.startswith("OAR_JOB_ID="))

        job = submit("-O", "oar.%jobid%.out", "-E", "oar.%jobid%.err", str(self.script("oar")))
        submit("true")  # planned on the node right after the first
        return job

    def slurm_state(self) -> str:
        argv = ["scontrol", "show", "job", "-o", self.slurm_job]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout

    def hold(self) -> None:
        """The measurement: held from both jobs' start (not their submission:
        a job queued behind another test's would otherwise wait less than its
        limit) for HOLD_S, then let go."""
        try:
            wait_for("the Slurm job running", lambda: "JobState=RUNNING " in self.slurm_state())
            wait_for(
                "the OAR job running",
                lambda: oarstat(self.user, self.oar_job, self.workdir)["state"] == "Running",
            )
            time.sleep(self.HOLD_S)
        finally:
            self.measurement.close()  # lets go of the lock

    def released(self) -> None:
        self.held.result(timeout=self.HOLD_S + 400)

    def close(self) -> None:
        self.measurement.close()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def held_past_their_limits(slurm_cluster, oar_cluster):
    node = slurm_cluster[0]["nodes"][0]["hostname"]
    held = HeldPastTheirLimits(slurm_cluster[1], oar_cluster, node)
    yield held
    held.close()


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_job_past_its_slurm_time_limit_is_recorded_and_rerun_alone(
    slurm_cluster, tmp_path, held_past_their_limits
):
    """Slurm ends a run's job at its time limit (1 minute, the least):
    SIGTERM, recorded in Slurm's words, and left for the next invocation.
    The run measures on a machine lock and registry of its own: on the
    host's, it waited for the other worker's trainings (a wait its job adds
    to its limit, a minute at a time: share_machine.sh, tested by
    test_a_job_waiting_for_the_machine_...), and its minute and more of
    measuring held all of theirs back. It asks for held_past_their_limits
    only to start that test's minute and more of waiting beside its own."""
    alone = {
        "DDLC_MEASURE_LOCK": str(tmp_path / "measure.lock"),
        "DDLC_ATTEMPTS": str(tmp_path / "a"),
    }
    way = SlurmWay({**slurm_cluster[1], **alone})
    fault_design(tmp_path, epochs=(500,))
    with in_background(way, tmp_path) as start:
        proc = start("--set-resources", "run:runtime=1")
        job = long_run_training(tmp_path, way, short_too=False)
        stopped_with(tmp_path, proc, f"Slurm job {job}: TIMEOUT", way)
    assert not list((tmp_path / "results").rglob("done.json"))  # the next invocation reruns it
    # The job took its own lock and registered there (sbatch passed them on).
    assert Path(alone["DDLC_MEASURE_LOCK"]).is_file() and Path(alone["DDLC_ATTEMPTS"]).is_dir()


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_job_waiting_for_the_machine_adds_the_wait_to_its_slurm_time_limit(
    held_past_their_limits,
):
    held = held_past_their_limits
    held.released()

    def ended() -> str:
        out = held.slurm_state()
        done = any(f"JobState={s} " in out for s in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"))
        return out if done else ""

    said = wait_for("the job's end", ended, 60)
    log = next(held.workdir.glob("slurm.*.out")).read_text()
    assert (held.workdir / "slurm.ran").exists(), (said, log)
    assert "JobState=COMPLETED" in said and "TimeLimit=00:01:00" not in said, said
    assert "waiting for the machine" in log and "warning" not in log, log


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_job_waiting_for_the_machine_adds_the_wait_to_its_oar_walltime(held_past_their_limits):
    """As under Slurm, with the second job planned on the node right after
    the first: the first adds its wait to its walltime ahead of the second
    (oarwalltime --delay-next-jobs; the second would wait for the machine
    too)."""
    held = held_past_their_limits
    held.released()

    def ended() -> dict:
        job = oarstat(held.user, held.oar_job, held.workdir)
        return job if job["state"] in ("Terminated", "Error") else {}

    job = wait_for("the first job's end", ended, 90)
    err = (held.workdir / f"oar.{held.oar_job}.err").read_text()
    assert (held.workdir / "oar.ran").exists(), (job, err)
    assert job["state"] == "Terminated", (job, err)
    assert "waiting for the machine" in err and "warning" not in err, err


# ---- scheduler faults (OAR) ---------------------------------------------------------------
# OAR ends a job by SIGKILL to its processes: the runner cannot record it, and
# the profile's job end command does, from OAR's words that the plugin gives
# (its state, lost nodes and events; ddlcompare/run/schedulers/oar.py).


@pytest.fixture
def oar_faults(oar_cluster):
    """A workdir of OAR's user and a workflow started there in the background."""
    way, workdir = OarWay(oar_cluster), oar_cluster.workdir("faults")
    with in_background(way, workdir) as start:
        yield way, workdir, start


def oar_ended(user, job: str) -> dict | None:
    found = oarstat(user, job, REPO)
    return found if found["state"] in ("Terminated", "Error") else None


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_job_deleted_by_oardel_is_recorded_and_rerun_alone(oar_faults):
    way, workdir, start = oar_faults
    fault_design(workdir)
    proc = start()
    job = long_run_training(workdir, way)
    way.user.run(["oardel", job], REPO)
    record = stopped_with(workdir, proc, f"OAR job {job}: Error", way)
    assert f"FRAG_JOB_REQUEST (User {way.user.name} requested" in record["reason"], record
    only_the_stopped_run_is_left(workdir, way)


@pytest.mark.slow
@pytest.mark.schedulers
@pytest.mark.parametrize("which", ["the runner's", "the other"])
def test_a_node_lost_mid_job_is_recorded_by_oar_and_rerun_alone(slurm_cluster, oar_faults, which):
    """The runner's node (OAR's oarexec's too) lost: OAR marks it Suspected
    (finaud) and would keep the job until its walltime; the plugin deletes
    the job and the job end command records the run interrupted. The other
    node lost: the run fails as its ranks die, and the job end command adds
    OAR's words (the node it suspects once the job has ended)."""
    way, workdir, start = oar_faults
    fault_design(workdir)
    proc = start()
    job = long_run_training(workdir, way)
    owner = next(p for p in (workdir / "results").rglob("owner.json") if "epochs~500" in str(p))
    runner = json.loads(owner.read_text())["host"]
    nodes = oarstat(way.user, job, REPO)["assigned_network_address"]
    lost = runner if which == "the runner's" else next(n for n in nodes if n != runner)
    cluster.lose_node(lost)
    try:
        workflow_failed(proc, workdir, way)
        ended = wait_for("OAR ends the job", lambda: oar_ended(way.user, job), 120)
        record = by_epochs(workdir)[500]
        print(f"recorded: {record['status']}: {record['reason']}")
        assert f"OAR job {job}: " in record["reason"] and lost in record["reason"], record
        if which == "the runner's":
            assert record["status"] == "interrupted" and not owner.exists(), record
            assert "EXTERMINATE_JOB" in {e["type"] for e in ended["events"]}, ended["events"]
        only_the_stopped_run_is_left(workdir, way)
    finally:
        bring_back(lost, slurm_cluster[1])


# OAR's walltime kill: tests/test_oar.py (the same path, on OAR's own node).
