"""Design expansion and validation: every problem named, never a traceback."""

import gzip
import os
import shutil
from pathlib import Path

import pytest

from conftest import FASHION, REPO, ddlc, write_design
from ddlcompare.plan import design
from ddlcompare.plan.design import DesignError


def base(**over):
    doc = {
        "factors": {
            "framework": ["torch-ddp", "horovod-torch"],
            "procs_per_node": [1, 2],
            "batch_size": [32, 64],
        },
        "replications": 3,
        "seed": 7,
    }
    doc.update(over)
    return doc


def test_full_factorial_with_replications():
    runs = design.parse(base()).runs()
    assert len(runs) == 2 * 2 * 2 * 3
    assert len({r.path for r in runs}) == len(runs)
    assert sorted(r.order for r in runs) == list(range(len(runs)))


def test_paths_are_self_describing():
    run = design.parse(base()).runs()[0]
    parts = run.path.split("/")
    assert parts[0] == "design" and parts[1].startswith("cfg~")
    assert [p.split("~")[0] for p in parts[2:]] == [
        "framework",
        "nodes",
        "procs_per_node",
        "batch_size",
        "dataset",
        "rep",
    ]
    assert f"batch_size~{run.config['batch_size']}" in run.path


def test_randomized_order_is_reproducible_and_differs_from_listing():
    a = [r.path for r in design.parse(base()).runs()]
    b = [r.path for r in design.parse(base()).runs()]
    listed = [r.path for r in design.parse(base(randomize=False)).runs()]
    assert a == b
    assert a != listed and sorted(a) == sorted(listed)


def test_exclude_and_zip():
    d = design.parse(
        base(
            exclude=[{"framework": "horovod-torch", "procs_per_node": 1}],
            zip=[["procs_per_node", "batch_size"]],
        )
    )
    cells = {
        (r.factors["framework"], r.factors["procs_per_node"], r.factors["batch_size"])
        for r in d.runs()
    }
    assert cells == {("torch-ddp", 1, 32), ("torch-ddp", 2, 64), ("horovod-torch", 2, 64)}


def test_fixed_settings_key_results_but_new_levels_reuse_runs():
    one = design.parse(base())
    more = design.parse(base(factors={**base()["factors"], "batch_size": [32, 64, 128]}))
    changed = design.parse(base(fixed={"epochs": 9}))
    assert {r.path for r in one.runs()} < {r.path for r in more.runs()}
    assert one.settings_hash != changed.settings_hash
    assert not {r.path for r in one.runs()} & {r.path for r in changed.runs()}


def test_settings_at_their_default_leave_the_hash_alone():
    # What a new setting does to existing designs: nothing.
    assert (
        design.parse(base()).settings_hash
        == design.parse(base(fixed={"tracer": "otf2", "momentum": 0.9})).settings_hash
    )


def test_target_accuracy_reanalyses_the_same_runs():
    one = design.parse(base())
    targeted = design.parse(base(fixed={"target_accuracy": 0.85}))
    assert {r.path for r in one.runs()} == {r.path for r in targeted.runs()}
    assert targeted.runs()[0].config["target_accuracy"] == 0.85


def test_config_records_per_process_and_global_batch():
    run = design.parse(base()).runs()[0]
    assert run.config["batch_size"] in (32, 64) and run.world_size == run.config["procs_per_node"]


def test_any_setting_can_be_a_factor():
    d = design.parse(base(factors={**base()["factors"], "learning_rate": [0.01, 0.1]}))
    assert len(d.runs()) == 48
    assert sum("/learning_rate~0.1/" in r.path for r in d.runs()) == 24


BAD = [
    ({"factors": {"framework": ["tensorflowz"]}}, "factors.framework: unknown value 'tensorflowz'"),
    ({"factors": {"framework": ["torch-ddp"], "colour": [1]}}, "factors.colour: unknown factor"),
    ({"factors": {"framework": []}}, "factors.framework: has no levels"),
    ({"factors": {"framework": ["torch-ddp", "torch-ddp"]}}, "listed twice"),
    (
        {"factors": {"framework": ["torch-ddp"], "nodes": ["two"]}},
        "factors.nodes: must be an integer",
    ),
    ({"factors": {"framework": ["torch-ddp"], "nodes": [0]}}, "factors.nodes: must be >= 1"),
    ({"factors": {"framework": ["torch-ddp"], "batch_size": [True]}}, "must be an integer"),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"epochs": "2"}},
        "fixed.epochs: must be an integer",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"epoch": 2}},
        "fixed.epoch: unknown setting",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "epochs": [1]}, "fixed": {"epochs": 2}},
        "also a factor",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "replications": 0},
        "replications: must be an integer >= 1",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "randomize": "yes"},
        "randomize: must be true or false",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "exclude": [{"framework": "horovod-torch"}]},
        "exclude[0].framework: 'horovod-torch' is not a level",
    ),
    (
        {
            "factors": {"framework": ["torch-ddp", "horovod-torch"], "nodes": [1, 2]},
            "zip": [["framework", "nodes"]],
            "exclude": [{"framework": "torch-ddp", "nodes": 2}],
        },
        "exclude[0]: matches no run",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "exclude": [{"framework": "torch-ddp"}]},
        "zero runs",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "nodes": [1, 2]}, "zip": [["nodes", "framework"]]},
        "zipped factors need the same number of levels",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "zip": [["nodes", "framework"]]},
        "nodes not among the factors",
    ),
    (  # a no-op group, where another factor was meant
        {"factors": {"framework": ["torch-ddp"], "nodes": [1, 2]}, "zip": [["nodes", "nodes"]]},
        "zip[0]: nodes is listed twice",
    ),
    ({"factors": {"framework": ["torch-ddp"]}, "extra": 1}, "unknown key 'extra'"),
    ({"factors": {"nodes": [1]}}, "factors.framework: missing"),
    ({}, "factors: missing"),
    ([1, 2], "must be a mapping"),
    (
        {"factors": {"framework": ["torch-ddp"], "dataset": ["imagenet"]}},
        "factors.dataset: unknown value 'imagenet'",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "data_dir": ["/x"]}},
        "factors.data_dir: cannot be a factor",
    ),
    ({"factors": {"framework": ["torch-ddp"], "device": ["tpu"]}}, "allowed: cpu, gpu"),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"lr_scaling": "cubic"}},
        "allowed: none, linear, sqrt",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "target_accuracy": [0.8, 0.9]}},
        "factors.target_accuracy: cannot be a factor",
    ),
    # Numbers that are not numbers, or too large for what reads them.
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"energy_interval_s": float("nan")}},
        "fixed.energy_interval_s: must be a finite number, got nan",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"energy_interval_s": float("inf")}},
        "fixed.energy_interval_s: must be a finite number, got inf",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "learning_rate": [float("nan")]}},
        "factors.learning_rate: must be a finite number",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"momentum": -float("inf")}},
        "fixed.momentum: must be a finite number",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"epochs": 10**30}},
        "fixed.epochs: must be <=",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"learning_rate": 1e300}},
        "fixed.learning_rate: must be <= 100",
    ),
    ({"factors": {"framework": ["torch-ddp"]}, "seed": 2**64}, "seed: must be at most 2147483647"),
    (
        {"factors": {"framework": ["torch-ddp"], "learning_rate": [1, 1.0]}},
        "factors.learning_rate: level 1.0 is listed twice",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "replications": 10**7},
        "10000000 runs, more than max_runs (10000)",
    ),
    (
        {
            "factors": {
                "framework": ["torch-ddp"],
                "batch_size": list(range(1, 200)),
                "epochs": list(range(1, 200)),
            }
        },
        "set max_runs: N",
    ),
    ({"factors": {"framework": ["torch-ddp"]}, "max_runs": 0}, "max_runs: must be an integer >= 1"),
    # What YAML reads differently from what the user meant.
    ({"name": False, "factors": {"framework": ["torch-ddp"]}}, "put it in quotes: name: 'no'"),
    ({"name": 2024, "factors": {"framework": ["torch-ddp"]}}, "put it in quotes: name: '2024'"),
    ({"factors": {"framework": ["torch-ddp"]}, "fixed": {"learning_rate": "1e-3"}}, "write 1.0e-3"),
    ({"factors": {"framework": ["torch-ddp"], "dataset": [False]}}, "put the value in quotes"),
    (
        {
            "factors": {"framework": ["torch-ddp"], "nodes": [1, 2], "batch_size": [32, 64]},
            "zip": [["nodes", ["batch_size"]]],
        },
        "zip[0]: lists factor names only",
    ),
    (
        {
            "factors": {"framework": ["torch-ddp"], "nodes": [1, 2], "batch_size": [32, 64]},
            "zip": [["nodes", {"batch_size": 1}]],
        },
        "zip[0]: lists factor names only",
    ),
    (
        {"factors": {"framework": ["torch-ddp"], "nodes": [[1, 2]]}},
        "factors.nodes: must be an integer",
    ),
    # Paths the file system would refuse.
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": "/tmp/" + "x" * 300}},
        "fixed.data_dir: has a folder name of 300 bytes",
    ),
    (
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": "~nosuchuser/data"}},
        "fixed.data_dir: '~nosuchuser': no such user here",
    ),
]


@pytest.mark.parametrize("doc,message", BAD, ids=[m for _, m in BAD])
def test_bad_design_is_named(doc, message):
    with pytest.raises(DesignError) as err:
        design.parse(doc, "d.yaml")
    assert any(message in p for p in err.value.problems), err.value.problems


def test_all_problems_reported_at_once():
    with pytest.raises(DesignError) as err:
        design.parse({"factors": {"framework": ["nope"], "nodes": [0]}, "replications": -1})
    assert len(err.value.problems) == 3


@pytest.mark.parametrize(
    "text,message",
    [
        ("factors: {framework: [torch-ddp]\n", "not valid YAML"),
        ("factors:\n  framework: [torch-ddp]\n\tnodes: [1]\n", "not valid YAML"),
    ],
)
def test_yaml_syntax_errors_give_line(tmp_path, text, message):
    path = tmp_path / "d.yaml"
    path.write_text(text)
    with pytest.raises(DesignError) as err:
        design.load(path)
    assert message in err.value.problems[0] and "line" in err.value.problems[0]


BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")
    )
    + "factors: {framework: *i}\n"
)

BAD_FILES = [
    (
        "factors: {framework: [torch-ddp]}\nfactors: {nodes: [1]}\n",
        "line 2: key 'factors' appears twice",
    ),
    (
        "factors:\n  framework: [torch-ddp]\n  framework: [horovod-torch]\n",
        "key 'framework' appears twice",
    ),
    (
        "factors: {framework: [torch-ddp], dataset: [2024-01-01]}\n",
        "factors.dataset[0]: '2024-01-01' is a date; put it in quotes",
    ),
    ("factors: {framework: [torch-ddp], dataset: !!set {a, b}}\n", "is a set"),
    ("factors: {framework: [torch-ddp], dataset: [!!binary aGVsbG8=]}\n", "is a binary value"),
    ("factors: {framework: [torch-ddp], dataset: [{? [a]: 1}]}\n", "a key must be a plain name"),
    ("name: no\nfactors: {framework: [torch-ddp]}\n", "name: 'no'"),
    ("factors: {framework: [torch-ddp]}\nfixed: {learning_rate: 1e-3}\n", "write 1.0e-3"),
    (
        "factors: {framework: [torch-ddp]}\nfixed: {learning_rate: .nan}\n",
        "must be a finite number",
    ),
    (
        "factors: {framework: [torch-ddp]}\nfixed: {energy_interval_s: .inf}\n",
        "must be a finite number",
    ),
    (BOMB, "expands to more than 100000 values"),
]


@pytest.mark.parametrize("text,message", BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_bad_design_file_is_named(tmp_path, text, message):
    path = tmp_path / "d.yaml"
    path.write_text(text)
    with pytest.raises(DesignError) as err:
        design.load(path)
    assert any(message in p for p in err.value.problems), err.value.problems
    assert all(len(p) <= design.MAX_PROBLEM_CHARS + 3 for p in err.value.problems)


def test_name_from_the_file_name_is_explained(tmp_path):
    path = tmp_path / "my design.yaml"
    path.write_text("factors: {framework: [torch-ddp]}\n")
    with pytest.raises(DesignError) as err:
        design.load(path)
    assert "name: not set, so it would be the file's name 'my design'" in err.value.problems[0]


def test_non_utf8_design(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_bytes(b"factors: {framework: [torch-ddp]}\nname: caf\xe9\n")
    with pytest.raises(DesignError) as err:
        design.load(path)
    assert "line 2: byte 0xe9 is not UTF-8" in err.value.problems[0]


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "empty-name"])
def test_design_that_is_not_a_file_is_refused_without_hanging(tmp_path, kind):
    path = {"fifo": tmp_path / "d.yaml", "zero": "/dev/zero", "dir": tmp_path, "empty-name": ""}[
        kind
    ]
    if kind == "fifo":
        os.mkfifo(path)
    out = ddlc("plan", "--design", str(path))  # ddlc's timeout catches a hang
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert {
        "fifo": "not a regular file",
        "zero": "not a regular file",
        "dir": "is a directory",
        "empty-name": "no design file given",
    }[kind] in out.stderr


def test_numbers_are_normalised_before_hashing():
    one = design.parse(base(fixed={"learning_rate": 1}))
    same = design.parse(base(fixed={"learning_rate": 1.0}))
    assert one.settings_hash == same.settings_hash


HOSTILE = ["a b", "x;rm -rf /", "$(touch /tmp/pwned)", "`id`", "a\nb", "'q'", "../../etc"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_rejected(value):
    with pytest.raises(DesignError) as err:
        design.parse({"factors": {"framework": ["torch-ddp"], "dataset": [value]}})
    assert "factors.dataset" in err.value.problems[0]


def test_cli_prints_problems_without_traceback(tmp_path):
    path = write_design(tmp_path, {"factors": {"framework": ["nope"], "nodes": [0]}})
    out = ddlc("plan", "--design", str(path))
    assert out.returncode == 2
    assert "factors.framework: unknown value 'nope'" in out.stderr
    assert "factors.nodes: must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_cli_missing_design_file(tmp_path):
    out = ddlc("plan", "--design", str(tmp_path / "none.yaml"))
    assert out.returncode == 2 and "file not found" in out.stderr and "Traceback" not in out.stderr


ENVS_FOR_SETUP = [
    (["torch-ddp", "horovod-torch"], "torch"),
    (["horovod-keras"], "torch tensorflow"),
    (["torch-ddp", "tf-mwms", "tf-mirrored"], "torch tensorflow"),
    # Tarantella's build takes minutes: set-up runs its script
    (["torch-ddp", "tarantella"], "torch tarantella"),
    # LBANN's takes hours: its own script, named at plan time when missing
    (["lbann"], "torch"),
]


@pytest.mark.parametrize("frameworks,needed", ENVS_FOR_SETUP)
def test_cli_envs_names_what_setup_builds_for_the_design(tmp_path, frameworks, needed):
    """./ddlc run sets up these (and no others) before it runs the design."""
    out = ddlc(
        "envs", "--design", str(write_design(tmp_path, base(factors={"framework": frameworks})))
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{needed}\n"


def test_shipped_design_compares_the_seed_frameworks_set_up_builds_in_minutes():
    """./ddlc run sets up .venv and Tarantella for
    design.yaml, which compares Horovod and Tarantella beside DDP (every
    framework of .venv that runs on its device); LBANN's build takes hours."""
    from frameworks import registry

    shipped = design.load(str(REPO / "design.yaml"))
    out = ddlc("envs", "--design", "design.yaml")
    assert out.stdout.split() == ["torch", "tarantella"], out.stderr
    runnable = {
        name
        for name, info in registry.FRAMEWORKS.items()
        if info.env == "torch" and shipped.fixed["device"] in info.devices
    }
    assert set(shipped.factors["framework"]) == runnable | {"tarantella"}


def test_cli_envs_of_a_bad_design_is_one_message(tmp_path):
    path = write_design(tmp_path, {"factors": {"framework": ["nope"]}})
    out = ddlc("envs", "--design", str(path))
    assert out.returncode == 2 and not out.stdout
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: factors.framework: unknown value 'nope' (allowed: ")


def test_cli_missing_dataset_names_path_and_fix(tmp_path):
    path = write_design(
        tmp_path,
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": str(tmp_path / "nodata")}},
    )
    out = ddlc("plan", "--design", str(path))
    assert out.returncode == 2
    assert str(tmp_path / "nodata" / "train-images-idx3-ubyte.gz") in out.stderr
    assert "apt-get install dataset-fashion-mnist" in out.stderr


def test_plan_prints_table_and_count(tmp_path):
    path = write_design(tmp_path, base())
    out = ddlc("plan", "--design", str(path))
    assert out.returncode == 0, out.stderr
    *table, count, progress = out.stdout.strip().splitlines()
    assert count.startswith("24 runs (8 cells x 3 replications)")
    assert progress.startswith("0 of 24 runs done, 24 to do: about ")
    assert len(table) == 24 + 1


# What the design alone says about its runs, said by the plan before any run.
PLAN_REFUSED = [
    (
        {"max_steps": 4, "warmup_steps": 10, "epochs": 2},
        "warmup_steps: 10, but runs with batch_size 32 take only 8 steps",
    ),
    ({"max_steps": 5, "warmup_steps": 5, "epochs": 1}, "raise max_steps or lower warmup_steps"),
    ({"device": "gpu"}, "device: gpu, but this machine has no NVIDIA GPU"),
]


@pytest.mark.parametrize("fixed,message", PLAN_REFUSED, ids=[m for _, m in PLAN_REFUSED])
def test_plan_refuses_runs_that_cannot_measure(tmp_path, fixed, message):
    if fixed.get("device") == "gpu" and list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this machine has a GPU")
    doc = {"factors": {"framework": ["torch-ddp"], "batch_size": [32]}, "fixed": fixed}
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_plan_refuses_more_processes_here_than_memory_holds(tmp_path):
    """procs_per_node: 100000 was a warning, and the local runner would have
    started them all; a count that fits is still planned."""
    from ddlcompare.run import plan_checks

    most = plan_checks._memory_mib() // plan_checks.PROCESS_MIB
    doc = {"factors": {"framework": ["torch-ddp"], "procs_per_node": [1, most + 1]}}
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert (
        f"procs_per_node {most + 1} x nodes 1: runs would start {most + 1} processes" in out.stderr
    )
    assert "lower procs_per_node or nodes" in out.stderr and out.stderr.count("\n") == 1
    doc["factors"]["procs_per_node"] = [1, most]
    assert ddlc("plan", "--design", str(write_design(tmp_path, doc))).returncode == 0


def test_plan_warns_of_runs_without_a_step_and_of_too_many_processes(tmp_path):
    doc = {
        "factors": {"framework": ["torch-ddp"], "batch_size": [32, 5000]},
        "fixed": {"train_images": 6000, "warmup_steps": 0, "threads": 4 * (os.cpu_count() or 1)},
    }
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert out.returncode == 0, out.stderr
    assert "batch_size 5000 x 1 processes exceeds the 6000 training images" not in out.stderr
    assert f"start {4 * (os.cpu_count() or 1)} processes x threads" in out.stderr
    doc["factors"]["batch_size"] = [32, 7000]
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert "warning:" in out.stderr and "batch_size 7000 x 1 processes exceeds" in out.stderr


def test_damaged_data_file_is_caught_at_plan_time(tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(FASHION, data_dir)
    victim = data_dir / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(gzip.compress(gzip.decompress(victim.read_bytes())[:-1] + b"\x07"))
    doc = {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": str(data_dir)}}
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{victim} fails its checksum" in out.stderr


# Look-alike and invisible characters in any name a design echoes: each is
# quoted, escaped and named, wherever the name stands.
LOOK_ALIKES = {
    "a trailing space": ("fixed ", "a space at the start or end"),
    "a Cyrillic letter": ("fr\u0430mework", "U+0430 CYRILLIC SMALL LETTER A"),
    "a zero-width space": ("epochs\u200b", "U+200B ZERO WIDTH SPACE"),
    "a non-ASCII hyphen": ("torch\u2010ddp", "U+2010 HYPHEN"),
}
PLACES = {
    "top-level key": lambda n: {"factors": {"framework": ["torch-ddp"]}, n: 1},
    "factor": lambda n: {"factors": {"framework": ["torch-ddp"], n: [1]}},
    "setting": lambda n: {"factors": {"framework": ["torch-ddp"]}, "fixed": {n: 1}},
    "level": lambda n: {"factors": {"framework": [n]}},
    "exclude": lambda n: {"factors": {"framework": ["torch-ddp"]}, "exclude": [{n: 1}]},
    "name": lambda n: {"name": n, "factors": {"framework": ["torch-ddp"]}},
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("what", LOOK_ALIKES)
def test_an_odd_character_is_quoted_escaped_and_named(place, what):
    name, note = LOOK_ALIKES[what]
    with pytest.raises(DesignError) as err:
        design.parse(PLACES[place](name), "d.yaml")
    message = "\n".join(err.value.problems)
    assert ascii(name) in message and note in message, message


@pytest.mark.parametrize(
    "name", ["ok\n", "ok\r\n", "a\tb", "x\x00"], ids=["newline", "crlf", "tab", "nul"]
)
def test_a_control_character_in_any_text_is_refused(name):
    for doc in (
        {"name": name, "factors": {"framework": ["torch-ddp"]}},
        {"factors": {"framework": ["torch-ddp"], "dataset": [name]}},
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": f"/tmp/{name}"}},
    ):
        with pytest.raises(DesignError):
            design.parse(doc, "d.yaml")


@pytest.mark.parametrize(
    "factor,levels,rule",
    [
        ("procs_per_node", [1, 2], True),  # True == 1 in Python
        ("procs_per_node", [1, 2], "1"),
        ("procs_per_node", [1, 2], 1.0),
        ("horovod_timeline", [True, False], 1),
        ("learning_rate", [0.5, 1.0], "0.5"),
    ],
)
def test_exclude_levels_are_checked_as_the_factors_levels(factor, levels, rule):
    doc = {"factors": {"framework": ["torch-ddp"], factor: levels}, "exclude": [{factor: rule}]}
    with pytest.raises(DesignError) as err:
        design.parse(doc, "d.yaml")
    assert any(p.startswith(f"exclude[0].{factor}: must be") for p in err.value.problems)


def test_exclude_levels_are_spelt_as_the_factors():
    doc = {
        "factors": {"framework": ["torch-ddp"], "learning_rate": [1, 2]},
        "exclude": [{"learning_rate": 1}],
    }
    assert [r.config["learning_rate"] for r in design.parse(doc).runs()] == [2.0]


@pytest.mark.parametrize("zero", [-0.0, -0, "-0.0"])
def test_negative_zero_is_zero(zero):
    factors = {"framework": ["torch-ddp"], "net_delay_ms": [0.0]}
    if zero == "-0.0":  # as a second level: one level listed twice
        with pytest.raises(DesignError, match="listed twice"):
            design.parse({"factors": {**factors, "net_delay_ms": [0.0, -0.0]}})
        return
    fixed = design.parse({"factors": {"framework": ["torch-ddp"]}, "fixed": {"net_delay_ms": zero}})
    assert json_text(fixed.fixed["net_delay_ms"]) == "0.0"
    level = design.parse({"factors": {**factors, "net_delay_ms": [zero]}}).runs()[0]
    assert "-0" not in level.path


def json_text(value):
    import json

    return json.dumps(value)


@pytest.mark.parametrize("level", ["3", "0.5", " 2 "])
def test_a_quoted_number_is_told_to_lose_its_quotes(level):
    doc = {"factors": {"framework": ["torch-ddp"], "learning_rate": [level]}}
    with pytest.raises(DesignError) as err:
        design.parse(doc)
    assert "without quotes" in err.value.problems[0] and "exponent" not in err.value.problems[0]


@pytest.mark.parametrize(
    "over",
    [
        {"max_runs": 10**9, "replications": 10**8},
        {"max_runs": design.MAX_PLANNABLE + 1},
        {
            "max_runs": design.MAX_PLANNABLE,
            "factors": {
                "framework": ["torch-ddp"],
                "batch_size": list(range(1, 101)),
                "epochs": list(range(1, 101)),
                "warmup_steps": list(range(100)),
                "eval_every": list(range(1, 101)),
            },
        },
        {"max_runs": design.MAX_PLANNABLE, "replications": 10**8},
    ],
    ids=[
        "huge max_runs and replications",
        "max_runs above the cap",
        "four factors",
        "replications",
    ],
)
def test_an_enormous_plan_is_refused_at_once(over):
    import time

    start = time.monotonic()
    with pytest.raises(DesignError) as err:
        design.parse({**base(), **over})
    assert time.monotonic() - start < 2
    assert any("max_runs" in p for p in err.value.problems)


@pytest.mark.parametrize("opener,closer", [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_a_deeply_nested_file_is_refused_in_one_line(tmp_path, opener, closer):
    path = tmp_path / "deep.yaml"
    depth = 20_000 if closer else 200
    if closer:
        path.write_text(opener * depth + "1" + closer * depth)
    else:
        path.write_text("".join("  " * i + "-\n" for i in range(depth)))
    with pytest.raises(DesignError) as err:
        design.load(path)
    assert err.value.problems == [
        f"line {err.value.problems[0].split()[1].rstrip(':')}: lists or mappings nested more "
        f"than {50} deep; a design needs a few levels: is this the right file?"
    ]


@pytest.mark.parametrize("where", ["missing/lock", "file/lock", "folder"])
def test_a_measuring_lock_that_cannot_be_opened_is_named_at_plan_time(tmp_path, where):
    import subprocess
    import sys

    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    lock = tmp_path / where
    doc = {"factors": {"framework": ["torch-ddp"]}}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "front.cli",
            "plan",
            "--design",
            str(write_design(tmp_path, doc)),
        ],
        env={**os.environ, "DDLC_MEASURE_LOCK": str(lock)},
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"DDLC_MEASURE_LOCK={lock}: cannot be opened (" in out.stderr
