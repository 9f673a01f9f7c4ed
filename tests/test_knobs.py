"""The frameworks' knobs: refused where a framework does not take them, and
read back from each framework's own API, trace or log in real small runs
(skipped, naming the build script, where the framework is not built)."""

import json
import re
from pathlib import Path

import pytest

from conftest import tiny_design
from ddlcompare.plan import design
from ddlcompare.plan import envs
from ddlcompare.run import runner
from frameworks import knobs

TIMELINES = Path(__file__).parent / "data" / "knobs"


def run_tiny(tmp_path, framework, procs=(2,), **fixed):
    row = design.parse(tiny_design([framework], procs, **fixed), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    return folder, record


def refusals(framework, **fixed):
    with pytest.raises(design.DesignError) as caught:
        design.parse(tiny_design([framework], **fixed), "tiny.yaml")
    return caught.value.problems


def test_a_knob_for_another_framework_is_refused_naming_the_field():
    (problem,) = refusals("torch-ddp", horovod_cycle_time_ms=5.0)
    assert problem.startswith("horovod_cycle_time_ms: 5.0 is set for framework torch-ddp")
    assert "horovod-torch" in problem and "remove it from fixed" in problem
    doc = tiny_design(["torch-ddp", "horovod-torch"])
    doc["factors"]["fusion_threshold_kib"] = [64]
    doc["fixed"]["ddp_gradient_as_bucket_view"] = True
    with pytest.raises(design.DesignError) as caught:
        design.parse(doc, "tiny.yaml")
    (problem,) = caught.value.problems
    assert "ddp_gradient_as_bucket_view: True is set for framework horovod-torch" in problem
    # a knob's own default (null, false) is no setting: every framework runs it
    design.parse(tiny_design(["torch-dp"], device="gpu", fusion_threshold_kib=None), "t.yaml")


def test_a_knob_the_framework_would_ignore_here_is_refused():
    (problem,) = refusals("horovod-torch", horovod_hierarchical_allreduce=True)
    assert "device: gpu and horovod_controller: mpi" in problem
    (problem,) = refusals("tf-mwms", mwms_implementation="nccl")
    assert problem.startswith("mwms_implementation: 'nccl' for framework tf-mwms")
    (problem,) = refusals("tf-mwms", fusion_threshold_kib=0)
    assert "bytes_per_pack of 0" in problem


def test_the_inter_op_pool_is_a_knob_of_the_tensorflow_family_only():
    """Every TensorFlow framework takes inter_op_threads (its family's loop
    applies it); another framework's design is refused naming them."""
    (problem,) = refusals("torch-ddp", inter_op_threads=1)
    assert problem.startswith("inter_op_threads: 1 is set for framework torch-ddp")
    takers = "horovod-keras, tarantella, tarantella-patched, tf-mirrored, tf-mwms)"
    assert takers in problem and "remove it from fixed" in problem
    design.parse(tiny_design(["tarantella-patched", "tf-mwms"], inter_op_threads=1), "t.yaml")


def test_one_inter_op_thread_is_refused_where_the_step_would_be_read_in_phases():
    (problem,) = refusals("tarantella", inter_op_threads=1, fit_step_phases=True)
    assert problem.startswith("inter_op_threads: 1 for framework tarantella: one inter-op")
    assert "set fit_step_phases: false" in problem
    design.parse(tiny_design(["tarantella"], inter_op_threads=2, fit_step_phases=True), "t.yaml")


def test_confirm_names_each_knob_not_in_effect():
    config = {"framework": "torch-ddp", "fusion_threshold_kib": 64}
    with pytest.raises(knobs.RunError, match="fusion_threshold_kib: asked 64, DDP's .* says 25600"):
        knobs.confirm(config, {"fusion_threshold_kib": 25600}, "DDP's logging data")
    assert knobs.confirm(config, {"fusion_threshold_kib": 64}, "x") == {"fusion_threshold_kib": 64}


def test_horovod_threshold_is_rounded_as_horovod_rounds_it():
    assert knobs.horovod_threshold_bytes(64, 1) == 65536
    assert knobs.horovod_threshold_bytes(1, 2) == 1024
    assert knobs.horovod_threshold_bytes(3, 4) == 4096


@pytest.mark.slow
def test_ddp_bucket_cap_and_gradient_view_take_effect(tmp_path):
    folder, record = run_tiny(
        tmp_path, "torch-ddp", fusion_threshold_kib=64, ddp_gradient_as_bucket_view=True
    )
    for rank in record["ranks"]:
        found = rank["knobs"]
        assert found["fusion_threshold_kib"] == 64 and found["ddp_gradient_as_bucket_view"]
        # the shared CNN's 1.7 MB of gradients in several buckets, not DDP's one
        assert len(found["ddp_bucket_bytes"]) >= 3
    assert record["config"]["fusion_threshold_kib"] == 64


@pytest.mark.slow
def test_ddp_records_its_defaults_when_no_knob_is_set(tmp_path):
    _, record = run_tiny(tmp_path, "torch-ddp")
    found = record["ranks"][0]["knobs"]
    assert found["fusion_threshold_kib"] == 25 * 1024
    assert found["ddp_gradient_as_bucket_view"] is False


@pytest.mark.slow
def test_horovod_fusion_threshold_and_cycle_time_take_effect(tmp_path):
    folder, record = run_tiny(
        tmp_path, "horovod-torch", fusion_threshold_kib=64, horovod_cycle_time_ms=5.0
    )
    found = record["ranks"][0]["knobs"]
    assert found["fusion_threshold_kib"] == 64 and found["horovod_cycle_time_ms"] == 5.0
    assert 0 < found["horovod_largest_fused_bytes"] <= 65536
    assert found["horovod_cycle_min_ms"] >= 4.5  # no gap under the 5 ms asked (default: 1)
    assert (folder / knobs.KNOBS_TIMELINE_FILE).exists()


def test_horovod_timeline_contradicting_a_knob_is_caught():
    """A real Horovod timeline of 2 ranks run with its defaults (128 MB, 1 ms):
    read as if 64 KiB and 5 ms had been asked, both are caught."""
    events = knobs.timeline_events((TIMELINES / "horovod-defaults.json").read_text())
    sizes = json.loads((TIMELINES / "cnn-gradient-bytes.json").read_text())
    config = {"framework": "horovod-torch", "fusion_threshold_kib": 64}
    config["horovod_cycle_time_ms"] = 5.0
    found = knobs.horovod_evidence(events, sizes, config, local_size=2)
    assert found["horovod_largest_fused_bytes"] > 65536
    assert "over 65536" in found["fusion_threshold_kib"]
    assert found["horovod_cycle_min_ms"] < 2
    with pytest.raises(knobs.RunError, match="horovod_cycle_time_ms: asked 5.0"):
        knobs.confirm(config, found, "Horovod's timeline")


def built(env: str, script: str):
    if not envs.python_for(env).exists():
        pytest.skip(f"the {env} environment is not built here: bash envs/{script}")


@pytest.mark.slow
def test_mwms_implementation_and_packing_take_effect(tmp_path):
    _, record = run_tiny(tmp_path, "tf-mwms", mwms_implementation="auto", fusion_threshold_kib=64)
    for rank in record["ranks"]:
        found = rank["knobs"]
        assert found["mwms_implementation"] == "auto" and found["fusion_threshold_kib"] == 64
        assert len(found["mwms_pack_bytes"]) >= 3


@pytest.mark.slow
def test_mwms_records_its_defaults(tmp_path):
    _, record = run_tiny(tmp_path, "tf-mwms")
    assert record["ranks"][0]["knobs"]["mwms_implementation"] == "ring"


@pytest.fixture(scope="module")
def two_tarantella_ranks_one_inter_op_thread_64_kib(tmp_path_factory) -> dict:
    """Two Tarantella ranks with one inter-op thread and a 64-KiB fusion
    threshold: one real run (its run.json) for the two tests of these knobs."""
    built("tarantella", "build-tarantella.sh")
    folder = tmp_path_factory.mktemp("tarantella-knobs")
    return run_tiny(folder, "tarantella", inter_op_threads=1, fusion_threshold_kib=64)[1]


@pytest.mark.slow
def test_tarantella_fusion_threshold_takes_effect(
    tmp_path, two_tarantella_ranks_one_inter_op_thread_64_kib
):
    for rank in two_tarantella_ranks_one_inter_op_thread_64_kib["ranks"]:
        assert rank["knobs"]["fusion_threshold_kib"] == 64
        assert rank["knobs"]["tarantella_config_fusion_kib"] == 64
    _, record = run_tiny(tmp_path, "tarantella")
    assert record["ranks"][0]["knobs"]["fusion_threshold_kib"] == 32  # Tarantella's own


@pytest.mark.slow
def test_one_inter_op_thread_takes_effect_in_a_tarantella_rank(tmp_path):
    """One Tarantella rank with one intra-op and one inter-op thread (a core
    free for GaspiCxx's progress thread on 2 cores) trains, in whole steps,
    and reads its pool back: 1 compute thread."""
    built("tarantella", "build-tarantella.sh")
    _, record = run_tiny(tmp_path, "tarantella", procs=(1,), inter_op_threads=1)
    (rank,) = record["ranks"]
    assert rank["knobs"]["inter_op_threads"] == 1 and rank["compute_threads"] == 1


@pytest.mark.slow
def test_two_tarantella_ranks_with_one_inter_op_thread_do_not_hang(
    two_tarantella_ranks_one_inter_op_thread_64_kib,
):
    """Tarantella's finish ops block the thread they run on until their
    bucket is reduced; with one inter-op thread a rank still trains, its
    gradients in several buckets (64 KiB: each finish runs after a barrier
    on all of the step's starts, so no finish waits for a start queued
    behind it)."""
    record = two_tarantella_ranks_one_inter_op_thread_64_kib
    assert [r["knobs"]["inter_op_threads"] for r in record["ranks"]] == [1, 1]


BANNER = """Hardware properties (for master process)
  Processes on node          : 2
  Total number of processes  : 2
  OpenMP threads per process : 2
  I/O threads per process (+offset) : 3 (+0)
"""


def test_lbann_cpu_settings_are_read_from_its_banner():
    """Its banner's lines, as print_lbann_configuration writes them, are
    read back and a disagreement fails the run naming the setting (without
    an LBANN build: bash envs/build-lbann.sh)."""
    from frameworks import lbann_family as lbann

    config = {"framework": "lbann", "threads": 2, "lbann_io_threads": 3}
    assert lbann.knobs_in_effect(BANNER, config) == {"threads": 2, "lbann_io_threads": 3}
    with pytest.raises(knobs.RunError, match="lbann_io_threads: asked 4, LBANN's banner says 3"):
        lbann.knobs_in_effect(BANNER, {**config, "lbann_io_threads": 4})
    with pytest.raises(knobs.RunError, match="threads: asked 1, LBANN's banner says 2"):
        lbann.knobs_in_effect(BANNER, {**config, "threads": 1})
    args = lbann.launch_args(
        {**config, "nodes": 1, "procs_per_node": 2, "run_id": "r"}, {lbann.RUN_ARGS: "{}"}
    )
    assert args["lbann_args"] == ["--print_affinity", "--num_io_threads=3"]


@pytest.mark.slow
def test_lbann_cpu_settings_take_effect_or_the_run_says_they_did_not(tmp_path):
    """LBANN reads its settings back in its banner. It caps the I/O threads
    at the cores no compute thread uses (one on a 2-core machine with 2
    ranks), so a count above that is not what ran: the run fails, naming
    the knob, the value asked and the value used."""
    built("lbann", "build-lbann.sh")
    _, record = run_tiny(tmp_path / "within", "lbann", threads=1, lbann_io_threads=1)
    assert record["ranks"][0]["knobs"] == {"threads": 1, "lbann_io_threads": 1}
    # 100: above the cap of any node with fewer than 200 cores, below LBANN's 128 RNG banks' other cap
    row = design.parse(tiny_design(["lbann"], lbann_io_threads=100), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path / "beyond") == 0
    done = json.loads((tmp_path / "beyond" / row.path / "done.json").read_text())
    assert done["status"] == "failed", done
    assert re.search(r"lbann_io_threads: asked 100, LBANN's banner says \d+\b", done["reason"]), (
        done
    )


def test_fusion_rule_is_a_quarter_of_the_gradients_but_for_ddp_on_one_node_and_tarantella_across():
    cnn = sum(json.loads((TIMELINES / "cnn-gradient-bytes.json").read_text()).values())
    for framework in ("horovod-torch", "torch-ddp"):
        assert knobs.fusion_rule_kib(cnn, framework, nodes=2, procs_per_node=1) == 512  # >= 1/4
    split = knobs.fusion_rule_kib(cnn, "tarantella", nodes=2, procs_per_node=1)
    assert split == 64  # >= 1/32: the first layer's gradients in a bucket of their own
    assert knobs.packs([40, 5120, 512, 1605632, 256, 73728, 128, 1152], split * 1024) == [
        1611304,
        73984,
        1280,
    ]
    for framework in ("horovod-torch", "tarantella"):
        assert knobs.fusion_rule_kib(cnn, framework, nodes=1, procs_per_node=2) == 512
    one_bucket = knobs.fusion_rule_kib(cnn, "torch-ddp", nodes=1, procs_per_node=2)
    assert one_bucket == 2048 and knobs.packs([cnn], one_bucket * 1024) == [cnn]
    assert knobs.packs([40, 5120, 512, 1605632, 256, 73728], 512 * 1024) == [1611304, 73984]
