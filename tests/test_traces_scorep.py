"""tracer: scorep, end to end: which runs Score-P can trace and how (refused
at plan time otherwise), the commands and environments, the failures a run
records, and real training runs under a real Score-P where one is installed
(envs/build-scorep.sh builds it; those tests are skipped elsewhere)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import REAL_TRACES, ddlc, needs_shared, tiny_design, write_design
from ddlcompare.plan import design
from ddlcompare.plan import envs
from ddlcompare.run import launch, runner, tracers
from ddlcompare.run.schedulers import Host
from traces import convert, readers

BUILD = "envs/build-scorep.sh"


def config_of(framework: str, **fixed) -> dict:
    return (
        design.parse(tiny_design([framework], tracer="scorep", **fixed), "t.yaml").runs()[0].config
    )


def test_mpi_runs_trace_every_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("SCOREP_TOTAL_MEMORY", raising=False)
    config = config_of("horovod-torch", horovod_controller="mpi", horovod_timeline=True)
    argv, env = launch.command("horovodrun", [Host("localhost", 2)], config, tmp_path, "local")
    at = argv.index("-m", argv.index("--mpi"))
    assert argv[at : at + 5] == [
        "-m",
        "scorep",
        "--mpp=mpi",
        "--thread=pthread",
        "--noinstrumenter",
    ]
    assert argv[at + 5].endswith("frameworks/worker.py") and Path(argv[at + 5]).is_file()
    assert argv[-1] == str(tmp_path)
    assert Path(env["SCOREP_FILTERING_FILE"]).read_text().count("SCOREP_REGION_NAMES") == 2
    assert env["SCOREP_EXPERIMENT_DIRECTORY"] == str(tmp_path / "scorep")
    assert env["SCOREP_ENABLE_TRACING"] == "true"
    # room for a location per thread (TensorFlow starts dozens)
    assert env["SCOREP_TOTAL_MEMORY"] == tracers.TOTAL_MEMORY
    assert env["HOROVOD_TIMELINE"] == str(tmp_path / "horovod_timeline.json")
    assert Path(env["PYTHONPATH"], "frameworks", "worker.py").is_file()
    # where the converter looks for what these runs leave
    patterns = {p for r in readers.readers().values() for p in r.patterns}
    assert {"scorep/traces.otf2", "scorep/rank*/traces.otf2", "horovod_timeline.json"} <= patterns


@pytest.mark.parametrize(
    "framework,launcher,fixed",
    [
        ("torch-ddp", "torchrun", {}),
        ("tf-mwms", "tf-workers", {}),
        ("horovod-torch", "horovodrun", {"horovod_controller": "gloo"}),
    ],
)
def test_runs_without_mpi_start_each_rank_under_scorep(tmp_path, framework, launcher, fixed):
    """Launchers that start no MPI: each rank goes through the per-rank
    starter, which gives it its own experiment folder."""
    config = config_of(framework, **fixed)
    argv, env = launch.command(launcher, [Host("localhost", 2)], config, tmp_path, "local")
    at = argv.index("ddlcompare.run.tracers")
    assert argv[at - 1] == "-m" and argv[at + 1] == str(tmp_path)
    assert env["SCOREP_ENABLE_TRACING"] == "true" and "PYTHONPATH" in env
    assert tracers.expected_traces(config, tmp_path) == [
        tmp_path / "scorep" / f"rank{r}" / "traces.otf2" for r in (0, 1)
    ]


@pytest.mark.parametrize(
    "env,rank",
    [
        ({"RANK": "3", "LOCAL_RANK": "1"}, 3),
        ({"HOROVOD_RANK": "2"}, 2),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
                )
            },
            1,
        ),
    ],
)
def test_per_rank_starter_reads_the_launchers_rank(env, rank):
    assert tracers.rank_from_env(env) == rank


def test_per_rank_starter_without_a_rank_says_so():
    with pytest.raises(SystemExit, match="no rank in the environment"):
        tracers.rank_from_env({"OMPI_COMM_WORLD_RANK": "0"})


# What Score-P cannot trace: LBANN's C++ ranks, Tarantella's GPI-2 ranks,
# and the one-process frameworks (no rank for the per-rank starter).
SCOREP_REFUSED = ["lbann", "tarantella", "tarantella-patched", "tf-mirrored", "torch-dp"]


@pytest.mark.parametrize("framework", SCOREP_REFUSED)
def test_plan_refuses_what_scorep_cannot_trace(tmp_path, framework):
    path = write_design(tmp_path, tiny_design([framework], procs=(1,), tracer="scorep"))
    done = ddlc("plan", "--design", str(path), "--no-check")
    assert done.returncode != 0
    assert f"framework {framework} cannot run with tracer: scorep" in done.stderr
    assert "use tracer:" in done.stderr and "Traceback" not in done.stderr


def test_plan_accepts_every_other_framework(tmp_path):
    """Every framework the registry knows is refused above or accepted here."""
    from frameworks import registry

    frameworks = sorted(set(registry.FRAMEWORKS) - set(SCOREP_REFUSED))
    assert frameworks and set(SCOREP_REFUSED) <= set(registry.FRAMEWORKS)
    doc = tiny_design(frameworks, tracer="scorep")
    doc["factors"]["horovod_controller"] = ["mpi", "gloo"]
    path = write_design(tmp_path, doc)
    done = ddlc("plan", "--design", str(path), "--no-check")
    assert done.returncode == 0, done.stderr


def test_a_tools_fatal_line_is_the_reason_never_a_separator(tmp_path):
    # The shape of a real abort: Score-P's line, mpirun's framed notice after it.
    log = tmp_path / "train.log"
    log.write_text(
        "[1,0]<stderr>:[Score-P] src/measurement/tracing/SCOREP_Tracing_Events.c:121: "
        "Fatal: Bug 'timestamp < location->last_timestamp': Wrong timestamp order\n"
        "[1,0]<stderr>:RuntimeError: later noise\n"
        "--------------------------------------------------------------------------\n"
        "Primary job  terminated normally, but 1 process returned\n"
        "--------------------------------------------------------------------------\n"
    )
    assert "Fatal: Bug 'timestamp" in runner._last_error(log)
    log.write_text("something\n----------\n")
    assert runner._last_error(log) == "something"


def test_a_run_that_left_no_trace_says_which(tmp_path):
    config = config_of("torch-ddp")
    reason = tracers.missing_trace(config, tmp_path)
    assert reason == (
        "tracer: scorep was asked for, but the run left no scorep/rank0/traces.otf2 (and 1 more)"
    )
    for r in (0, 1):
        anchor = tmp_path / "scorep" / f"rank{r}" / "traces.otf2"
        anchor.parent.mkdir(parents=True)
        anchor.touch()
    assert tracers.missing_trace(config, tmp_path) is None


# --- with a real Score-P ------------------------------------------------------


def bindings_in(env: str) -> bool:
    return envs.has_module(env, "scorep")


def needs_scorep(env: str):
    return pytest.mark.skipif(
        tracers.scorep_bin() is None or not bindings_in(env),
        reason=f"Score-P and its Python bindings in the '{env}' environment are not installed "
        f"here: build them with {BUILD}",
    )


def run_all(tmp_path: Path, doc: dict) -> list[tuple[Path, dict]]:
    """Every run of a design, one after the other, as the workflow does."""
    out = []
    for row in design.parse(doc, "scorep.yaml").runs():
        assert runner.execute(row, tmp_path) == 0
        folder = tmp_path / row.path
        out.append((folder, json.loads((folder / "run.json").read_text())))
    return out


def otf2_print_counts(anchor: Path) -> tuple[int, int]:
    """(enters, leaves), counted by the otf2-print that came with Score-P
    (Debian's is older than the archives Score-P 8.4 writes)."""
    done = subprocess.run(
        [str(tracers.scorep_bin() / "otf2-print"), str(anchor)],
        capture_output=True,
        text=True,
        check=True,
    )
    return (
        len(re.findall(r"^ENTER ", done.stdout, re.M)),
        len(re.findall(r"^LEAVE ", done.stdout, re.M)),
    )


def converted(folder: Path) -> tuple[pd.DataFrame, list]:
    out = folder / "phases.parquet"
    assert convert.main([str(folder), "-o", str(out)]) == 0
    sources = json.loads(convert.metadata_of(out)[b"ddlcompare.sources"])
    return pd.read_parquet(out), [p for s in sources for p in s.get("problems", [])]


def check_clean_mpi_trace(folder: Path, record: dict) -> None:
    assert record["status"] == "ok", record.get("reason")
    assert record["scorep"] == tracers.SCOREP_VERSION
    anchor = folder / "scorep" / "traces.otf2"
    enters, leaves = otf2_print_counts(anchor)
    assert enters == leaves > 0
    df, problems = converted(folder)
    assert problems == []  # no overlap, nothing unclosed or unbalanced
    assert sorted(df["rank"].unique()) == [0, 1]
    # each rank's threads are that rank's locations: its training loop, and
    # Horovod's background thread with the MPI calls
    for rank in (0, 1):
        mine = df[df["rank"] == rank]
        assert mine["location"].nunique() >= 2
        assert {"user:init", "user:epoch", "user:step", "user:forward"} <= set(mine["region"])
    carrying = df[df["bytes"].notna() & (df["collective"] == "allreduce")]
    assert len(carrying) and carrying["region"].str.startswith("MPI_").all()
    assert not df.loc[df["region"].str.startswith("user:"), "bytes"].notna().any()


@pytest.mark.parametrize(
    "framework",
    [
        pytest.param("horovod-torch", marks=needs_scorep("torch")),
        pytest.param("horovod-keras", marks=needs_scorep("tensorflow")),
    ],
)
@pytest.mark.slow
def test_horovod_under_scorep_three_replications_in_a_row(tmp_path, framework):
    doc = tiny_design(
        [framework], tracer="scorep", horovod_controller="mpi", epochs=1, timeout_s=600
    )
    doc["replications"] = 3
    for folder, record in run_all(tmp_path, doc):
        check_clean_mpi_trace(folder, record)


@pytest.mark.parametrize(
    "framework,fixed",
    [
        pytest.param("torch-ddp", {}, marks=needs_scorep("torch")),
        pytest.param("tf-mwms", {}, marks=needs_scorep("tensorflow")),
        pytest.param("horovod-torch", {"horovod_controller": "gloo"}, marks=needs_scorep("torch")),
    ],
)
@pytest.mark.slow
def test_ranks_traced_without_mpi_make_one_table(tmp_path, framework, fixed):
    [(folder, record)] = run_all(
        tmp_path, tiny_design([framework], tracer="scorep", epochs=2, timeout_s=600, **fixed)
    )
    assert record["status"] == "ok", record.get("reason")
    assert sorted(p.name for p in (folder / "scorep").iterdir()) == ["rank0", "rank1"]
    df, problems = converted(folder)
    assert problems == []
    assert sorted(df["rank"].unique()) == [0, 1]
    # the trace alone, without the run's steps tables, says each step's epoch
    shutil.copytree(folder / "scorep", tmp_path / "alone" / "scorep")
    alone, _ = converted(tmp_path / "alone")
    for rank in (0, 1):
        mine = df[df["rank"] == rank]
        steps = pd.read_csv(folder / f"steps.rank{rank}.tsv", sep="\t")
        assert sorted(mine.loc[mine["phase"] == "step", "step"]) == list(steps["step"])
        assert {"init", "data_load", "forward", "backward", "optimizer"} <= set(mine["phase"])
        epochs = mine[mine["phase"] == "epoch"]
        assert list(epochs["region"]) == ["user:epoch"] * 2 and sorted(epochs["epoch"]) == [1, 2]
        traced = alone[(alone["rank"] == rank) & (alone["phase"] == "step")]
        assert traced.sort_values("step")["epoch"].tolist() == steps["epoch"].tolist()


@needs_scorep("torch")
@pytest.mark.slow
def test_a_run_whose_scorep_aborts_is_failed_with_its_line(tmp_path, monkeypatch):
    # A memory pool too small for the run's events: Score-P aborts the rank.
    monkeypatch.setenv("SCOREP_TOTAL_MEMORY", "200k")
    monkeypatch.setenv("SCOREP_PAGE_SIZE", "8k")
    [(folder, record)] = run_all(
        tmp_path, tiny_design(["torch-ddp"], tracer="scorep", epochs=1, timeout_s=600)
    )
    assert record["status"] == "failed"
    assert "[Score-P]" in record["reason"], record["reason"]


FIXTURE = REAL_TRACES / "scorep-8.4-horovod-torch-mpi-np2"


@needs_shared("scorep-8.4-horovod-torch-mpi-np2")
def test_a_runs_scorep_steps_take_their_epoch_from_its_steps_table(tmp_path):
    """Score-P's user regions carry no epoch; the run's steps tables do."""
    shutil.copytree(FIXTURE, tmp_path / "scorep")
    for rank in (0, 1):  # 20 steps a rank: epoch 1 then 2
        (tmp_path / f"steps.rank{rank}.tsv").write_text(
            "epoch\tstep\n" + "".join(f"{1 + s // 10}\t{s}\n" for s in range(20))
        )
    table, _, errors = convert.convert([tmp_path], convert.PhaseRules())
    df = table.to_pandas()
    assert errors == [] and sorted(df["rank"].unique()) == [0, 1]
    stepped = df[df["step"].notna()]
    assert len(stepped) and (stepped["epoch"] == 1 + stepped["step"] // 10).all()
    assert df.loc[df["step"].isna(), "epoch"].isna().all()


@pytest.mark.parametrize(
    "steps, said",
    [(b"\xff\xfe\tx\n", "cannot be read as a table"), (b"a\tb\n1\t2\n", "column epoch missing")],
)
def test_a_damaged_steps_table_beside_a_runs_scorep_trace_is_named(tmp_path, steps, said):
    """The run's steps table that gives Score-P's steps their epochs, cut
    or overwritten: ``ddlc import`` names that file and the way out, not
    the trace as input its reader does not expect."""
    shutil.copytree(
        Path(__file__).parent / "data/real-traces/scorep-8.4-python-torch-loop", tmp_path / "scorep"
    )
    (tmp_path / "steps.rank0.tsv").write_bytes(steps)
    done = ddlc(
        "import", str(tmp_path / "scorep" / "traces.otf2"), "-o", str(tmp_path / "o.parquet")
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"its run's steps.rank0.tsv: {said}" in done.stderr, done.stderr
    assert "ddlc check --rerun" in done.stderr and "please report" not in done.stderr


@needs_shared("scorep-8.4-horovod-torch-mpi-np2")
def test_per_rank_experiments_are_joined_on_their_ranks(tmp_path):
    """Two experiments, each in rank<r>/, become one table with ranks 3 and 5
    (whatever Score-P numbered their processes)."""
    for rank in (3, 5):
        shutil.copytree(FIXTURE, tmp_path / "scorep" / f"rank{rank}")
    table, sources, errors = convert.convert([tmp_path], convert.PhaseRules())
    df = table.to_pandas()
    assert errors == [] and [s["path"].split("/")[-2] for s in sources] == ["rank3", "rank5"]
    assert sorted(df["rank"].unique()) == [3, 5]
    assert (df["rank"] == 3).sum() == (df["rank"] == 5).sum() == len(df) // 2


def test_scorep_filter_keeps_exactly_our_phase_vocabulary():
    """One vocabulary: the filter's region names are the markers and the
    phases of runfiles/phases.py, no more (a removed phase lingers otherwise)."""
    from runfiles.phases import MARKERS, PHASES

    text = (Path(__file__).resolve().parent.parent / "frameworks" / "scorep_filter").read_text()
    (include,) = [
        line.split()[1:] for line in text.splitlines() if line.strip().startswith("INCLUDE")
    ]
    assert include[0] == "user:*"
    assert set(include[1:]) == set(MARKERS) | set(PHASES)
