"""LBANN's side that runs without LBANN (real LBANN: tests/test_lbann.py,
skipped where it is not built): its output parser on lines in LBANN's exact
format (src/callbacks/print_statistics.cpp and timer.cpp) and the version and
times read from them, the launch arguments per scheduler, the data files its
readers take, the readers and the layer graph, its timeline turned into
step rows and into the run's OTF2 trace, and the world-size check."""

import math

import pandas as pd
import pytest

from frameworks import common, data, lbann_family as lbann, models
from runfiles import names

# As LBANN v0.104 prints them (the timer's median appeared in later versions;
# the line without it is the older format, still parsed).
OUTPUT = """\
--------------------------------------------------------------------------------
[0] Epoch : stats formated [tr/v/te] iter/epoch = [468/79/79]
            global MB = [ 128/ 128/ 128] global last MB = [  96  /  16  /  16  ]
             local MB = [  64/  64/  64]  local last MB = [  48+0/   8+0/   8+0]
--------------------------------------------------------------------------------
model0 (instance 0) training epoch 0 objective function : 0.612845
model0 (instance 0) training epoch 0 accuracy : 78.0983%
model0 (instance 0) training epoch 0 run time : 12.0417s
model0 (instance 0) training epoch 0 mini-batch time statistics : 0.0254837s mean, 0.0247771s median, 0.104312s max, 0.0226151s min, 0.00439113s stdev
model0 (instance 0) validation objective function : 0.456312
model0 (instance 0) validation accuracy : 83.63%
model0 (instance 0) validation run time : 0.814406s
model0 (instance 0) validation mini-batch time statistics : 0.0102218s mean, 0.0101209s median, 0.0138004s max, 0.00309514s min, 0.00104176s stdev
model0 (instance 0) training epoch 1 objective function : 0.380417
model0 (instance 0) training epoch 1 accuracy : 86.3117%
model0 (instance 0) training epoch 1 run time : 11.5093s
model0 (instance 0) training epoch 1 mini-batch time statistics : 0.0245911s mean, 0.0239965s max, 0.0221036s min, N/A stdev
model0 (instance 0) validation objective function : 0.37254
model0 (instance 0) validation accuracy : 86.72%
model0 (instance 0) validation run time : 0.80221s
model0 (instance 0) validation mini-batch time statistics : 0.0100873s mean, 0.0100255s median, 0.0121934s max, 0.00302124s min, 0.000871524s stdev
model0 (instance 1) training epoch 1 objective function : 9.9
model0 (global average) validation accuracy : 86.72%
model0 (instance 0) test objective function : 0.370091
model0 (instance 0) test accuracy : 86.81%
model0 (instance 0) test run time : 0.79712s
model0 (instance 0) test mini-batch time statistics : 0.0100514s mean, 0.00999892s median, 0.0118141s max, 0.00301054s min, 0.000838113s stdev
"""

# The pre-v0.100 format, as LBANN's own README for LeNet showed it.
OLD_OUTPUT = """\
Model 0 training epoch 4 objective function : 0.0471567
Model 0 training epoch 4 categorical accuracy : 99.6241%
Model 0 training epoch 4 run time : 7.64182s
Model 0 training epoch 4 mini-batch time statistics : 0.00901458s mean, 0.0212693s max, 0.0078979s min, 0.000458463s stdev
Model 0 validation objective function : 0.0670221
Model 0 validation categorical accuracy : 98.9%
"""


def test_parser_turns_lbann_output_into_epochs():
    parsed = lbann.parse_output(OUTPUT)
    assert [e["epoch"] for e in parsed] == [1, 2]  # LBANN counts from 0
    first, last = parsed
    assert first["train_loss"] == 0.612845
    assert first["train_accuracy"] == pytest.approx(0.780983)
    assert first["train_run_time_s"] == 12.0417
    assert first["train_batch_median_s"] == 0.0247771
    assert first["test_loss"] == 0.456312 and first["test_accuracy"] == pytest.approx(0.8363)
    assert last["train_loss"] == 0.380417  # instance 1 and global lines are not instance 0's
    assert math.isnan(last["train_batch_median_s"]) and math.isnan(last["train_batch_stdev_s"])
    assert last["test_loss"] == 0.370091  # the final test's scores replace the last validation's
    assert last["test_run_time_s"] == 0.80221  # its time does not: it ran after training
    assert last["test_accuracy"] == pytest.approx(0.8681)


def test_parser_reads_the_older_format():
    (entry,) = lbann.parse_output(OLD_OUTPUT)
    assert entry["epoch"] == 5 and entry["train_accuracy"] == pytest.approx(0.996241)
    assert entry["test_accuracy"] == pytest.approx(0.989)
    assert entry["train_batch_mean_s"] == 0.00901458


def test_parsed_output_becomes_the_common_tables(tmp_path):
    parsed = lbann.parse_output(OUTPUT)
    rows = lbann.epoch_rows(parsed, images_per_epoch=468 * 128, launch_s=3.0)
    common.write_epochs(tmp_path, rows)
    lbann.write_batch_times(tmp_path, parsed)
    epochs = pd.read_csv(tmp_path / "epochs.tsv", sep="\t")
    assert list(epochs.columns) == list(names.EPOCH_COLUMNS)
    assert epochs["images_per_s"][0] == pytest.approx(468 * 128 / 12.0417, rel=1e-5)
    assert epochs["wall_s"][0] == pytest.approx(12.0417 + 0.814406, abs=1e-4)
    assert epochs["test_accuracy"].tolist() == pytest.approx([0.8363, 0.8681])
    assert epochs["elapsed_s"][0] == pytest.approx(3.0 + 12.0417 + 0.814406, abs=1e-4)
    assert epochs["elapsed_s"][1] == pytest.approx(
        epochs["elapsed_s"][0] + epochs["wall_s"][1], abs=1e-3
    )
    times = pd.read_csv(tmp_path / "lbann_batch_times.tsv", sep="\t")
    assert list(times.columns) == list(lbann.BATCH_COLUMNS)
    assert times[["epoch", "mode"]].values.tolist() == [
        [1, "train"],
        [1, "test"],
        [2, "train"],
        [2, "test"],
    ]
    metrics = common.summary(rows, 2, 128, 0.04, 468, 1.0, common.RunClock())
    assert metrics["final_test_accuracy"] == pytest.approx(0.8681)


def test_launch_arguments_per_scheduler(monkeypatch):
    """The scheduler says where lbann.run launches; the lbann-driver launcher
    hands that to the driver (as JSON), which adds the run's own arguments."""
    import json
    import os

    from ddlcompare.run import schedulers
    from ddlcompare.run.launchers.lbann_driver import LBANN_RUN_ARGS

    config = {"nodes": 2, "procs_per_node": 4, "run_id": "r1"}
    assert LBANN_RUN_ARGS == lbann.RUN_ARGS

    def args(scheduler):
        handed = json.dumps(schedulers.get(scheduler).lbann_run_args(os.environ))
        return lbann.launch_args(config, {LBANN_RUN_ARGS: handed})

    monkeypatch.delenv("DDLC_SRUN_MPI", raising=False)
    assert args("slurm") == {
        "nodes": 2,
        "procs_per_node": 4,
        "job_name": "ddlc-r1",
        "scheduler": "slurm",
        "launcher_args": ["--overlap", "--mpi=pmix"],  # inside the job; ranks share one world
        "lbann_args": ["--print_affinity"],  # each rank names its host: rank records
    }
    monkeypatch.setenv("DDLC_SRUN_MPI", "")  # slurm.conf's MpiDefault
    assert args("slurm")["launcher_args"] == ["--overlap"]
    monkeypatch.setenv("OAR_NODEFILE", "/var/lib/oar/123")
    oar = args("oar")
    assert oar["scheduler"] == "openmpi"
    assert oar["launcher_args"] == [
        "--bind-to",
        "none",
        "--hostfile",
        "/var/lib/oar/123",
        "--mca",
        "plm_rsh_agent",
        "oarsh",
    ]
    local = args("local")
    assert local["scheduler"] == "openmpi" and "--oversubscribe" in local["launcher_args"]
    # the emulated network's nodes: its namespaces, through the ssh shim
    from ddlcompare.run import netem

    hosts = [schedulers.Host("10.77.0.1", 1), schedulers.Host("10.77.0.2", 1)]
    handed = json.dumps(schedulers.get("netns").lbann_run_args(os.environ, hosts))
    netns = lbann.launch_args(config, {LBANN_RUN_ARGS: handed})["launcher_args"]
    assert "--oversubscribe" in netns and netns[netns.index("--host") + 1] == "10.77.0.1,10.77.0.2"
    assert netns[netns.index("plm_rsh_agent") + 1] == str(netem.NETNS_SSH)


def test_layer_graph_is_the_spec(tmp_path):
    for info in data.DATASETS.values():
        graph = lbann.layer_graph(models.CNN, info)
        assert [n["layer"] for n in graph] == [
            "Convolution",
            "Relu",
            "Pooling",
            "Convolution",
            "Relu",
            "Pooling",
            "FullyConnected",
            "Relu",
            "FullyConnected",
        ]
        assert graph[0]["padding"] == 1 and graph[0]["weights"] == ["he_uniform", "zeros"]
        assert graph[-1]["weights"] == ["glorot_uniform", "zeros"]
        rows = lbann.graph_rows(graph, info.shape)
        spec = [
            r
            for r in models.layer_shapes(models.CNN, info.shape, info.classes)
            if r["type"] != "flatten"
        ]
        assert rows == spec


def test_data_files_are_the_same_bytes(tmp_path):
    info = data.FASHION_MNIST
    rng = __import__("numpy").random.default_rng(0)
    x = rng.integers(0, 256, (5, 1, 28, 28), dtype="uint8")
    y = rng.integers(0, 10, 5)
    dataset = data.Dataset(info, x, y, x[:2], y[:2])
    lbann.write_data_files(dataset, tmp_path)
    images = data._parse_idx((tmp_path / "train-images-idx3-ubyte").read_bytes(), "images")
    labels = data._parse_idx((tmp_path / "t10k-labels-idx1-ubyte").read_bytes(), "labels")
    assert (images == x[:, 0]).all() and (labels == y[:2]).all()


def test_cifar_binary_batches(tmp_path):
    import numpy as np

    x = np.arange(2 * 3 * 32 * 32, dtype=np.uint32).astype(np.uint8).reshape(2, 3, 32, 32)
    y = np.array([7, 2])
    lbann.write_cifar_bin(tmp_path / "b.bin", x, y)
    raw = (tmp_path / "b.bin").read_bytes()
    assert len(raw) == 2 * 3073
    assert raw[0] == 7 and raw[1:1025] == x[0, 0].tobytes()  # label, then the red plane
    assert raw[3073] == 2 and raw[3074 + 2048 : 3074 + 3072] == x[1, 2].tobytes()


def test_cifar_files_have_the_size_lbanns_reader_reads(tmp_path):
    """LBANN's cifar10 reader reads exactly 10,000 images per file: a
    smaller (generated) set fills them in order, its own images first."""
    import numpy as np

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (30, 3, 32, 32), dtype="uint8")
    y = rng.integers(0, 10, 30)
    dataset = data.Dataset(data.CIFAR10, x, y, x[:7], y[:7])
    lbann.write_data_files(dataset, tmp_path)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        assert (tmp_path / name).stat().st_size == lbann.CIFAR_FILE_IMAGES * 3073
    test = (tmp_path / "test_batch.bin").read_bytes()
    first = [test[i * 3073] for i in range(9)]
    assert first == [*y[:7], y[0], y[1]]  # the 7 test images, then again from the start
    assert test[1:3073] == lbann.transposed(x[:1]).tobytes()
    # another set of the same name gets files of its own
    other = data.Dataset(data.CIFAR10, x[::-1].copy(), y, x[:7], y[:7])
    assert lbann.data_folder(other) != lbann.data_folder(dataset)
    assert lbann.data_folder(dataset) == lbann.data_folder(dataset)


def test_readers_train_validate_on_test_and_normalise_like_everyone(tmp_path):
    readers = lbann.reader_spec(data.FASHION_MNIST, tmp_path, train_samples=3200)
    assert [(r["name"], r["role"]) for r in readers] == [
        ("mnist", "train"),
        ("mnist", "validate"),
        ("mnist", "test"),
    ]
    assert readers[0]["absolute_sample_count"] == 3200 and readers[0]["shuffle"]
    # LBANN refuses a reader with both set (data_reader.cpp): exactly one is zero
    assert readers[0]["fraction_of_data_to_use"] == 0
    assert readers[1]["absolute_sample_count"] == 0 and readers[1]["fraction_of_data_to_use"] == 1
    assert readers[1]["data_filename"] == "t10k-images-idx3-ubyte"
    assert readers[0]["transforms"] == [
        ("scale", {"scale": 1 / 255}),
        ("normalize", {"means": "0.286", "stddevs": "0.353"}),
    ]
    cifar = lbann.reader_spec(data.CIFAR10, tmp_path, train_samples=100)
    # LBANN's cifar10 reader takes the roles train and test only
    assert [r["role"] for r in cifar] == ["train", "test"]
    assert cifar[0]["transforms"][0][0] == "normalize_to_lbann_layout"
    assert "data_filename" not in cifar[0]


def test_missing_lbann_names_the_environment():
    with pytest.raises(common.RunError, match="envs/lbann.md"):
        lbann.import_lbann()


def test_cifar_images_reach_lbann_the_right_way_up():
    """LBANN's normalize_to_lbann_layout puts pixel (row, col) at
    row + col * H; the files hold each image transposed, so the tensor LBANN
    builds is the image itself. The transform's index rule, applied here."""
    import numpy as np

    image = np.arange(3 * 32 * 32, dtype=np.uint32).astype(np.uint8).reshape(1, 3, 32, 32)
    stored = lbann.transposed(image)[0]  # what the file holds, plane by plane
    h = w = 32
    tensor = np.empty(3 * h * w, dtype=np.uint8)
    for c in range(3):
        for row in range(h):
            for col in range(w):
                tensor[c * h * w + row + col * h] = stored[c, row, col]
    assert (tensor.reshape(3, h, w) == image[0]).all()


def test_version_is_read_from_lbann_output():
    # src/utils/lbann_library.cpp prints it at the start of every run
    header = (
        "Running: LLNL LBANN version: 0.105.0 (v0.104-412-g04c297bd)\n"
        "         LLNL Hydrogen version: 1.5.2 (v1.5.2-d0d7f56)\n" + OUTPUT
    )
    assert lbann.lbann_version(header) == "0.105.0 (v0.104-412-g04c297bd)"
    assert lbann.lbann_version("Running: LLNL LBANN version: 0.104.0\n") == "0.104.0"
    assert lbann.lbann_version(OUTPUT).startswith("unknown")


def test_measured_time_leaves_the_timers_skipped_steps_out():
    parsed = lbann.parse_output(OUTPUT)  # 468 steps of 128 per epoch
    rows = lbann.epoch_rows(parsed, 468 * 128, global_batch=128, warmup_steps=10)
    first, second = rows
    assert first["measured_images"] == (468 - 10) * 128  # CallbackTimer(skip_steps=10)
    assert first["measured_s"] == pytest.approx(458 * 0.0254837)
    assert first["images_per_s"] == pytest.approx(128 / 0.0254837)
    assert second["measured_images"] == 468 * 128  # nothing skipped after epoch 1
    assert first["wall_s"] == pytest.approx(12.0417 + 0.814406, abs=1e-4)


# LBANN's timeline callback writes 'kind-name:start:end' per interval,
# in seconds since training began (src/callbacks/timeline.cpp).
TIMELINE = """fp-input_samples:0.001:0.002
fp-input_samples:0.1:0.1005
fp-input_labels:0.002:0.0025
fp-input_labels:0.1005:0.101
fp-conv1:0.0025:0.0125
fp-conv1:0.101:0.111
bp-conv1:0.013:0.043
bp-conv1:0.112:0.142
opt-w0_kernel:0.043:0.045
opt-w0_kernel:0.142:0.145
"""


def test_timeline_becomes_step_rows_with_the_common_phases():
    from frameworks import lbann_timeline
    from runfiles.phases import PHASES

    rows = lbann_timeline.step_rows(
        lbann_timeline.read(TIMELINE), steps_per_epoch=1, origin_ns=10**9
    )
    assert [(r[0], r[1]) for r in rows] == [(1, 0), (2, 1)]  # epoch, step
    first = dict(zip(["epoch", "step", "start_ns", "end_ns", *PHASES], rows[0]))
    assert first["start_ns"] == 10**9 + 1_000_000 and first["end_ns"] == 10**9 + 45_000_000
    assert first["data_load"] == 1_500_000  # both input layers' forward
    assert first["forward"] == 10_000_000
    assert first["backward"] == 30_000_000 and first["optimizer"] == 2_000_000
    assert first["other"] == 44_000_000 - 43_500_000  # the gaps between them
    assert first["grad_comm"] == 0


def test_a_step_missing_from_one_series_is_not_counted():
    from frameworks import lbann_timeline

    cut = TIMELINE.replace("opt-w0_kernel:0.142:0.145\n", "")
    assert len(lbann_timeline.step_rows(lbann_timeline.read(cut), 1, 0)) == 1


def test_a_damaged_timeline_is_named_and_leaves_no_steps(tmp_path):
    from frameworks import lbann_timeline

    with pytest.raises(lbann_timeline.TimelineError, match="line 2"):
        lbann_timeline.read("fp-a:0.1:0.2\nfp-a:0.3:garbage\n")
    config = {"nodes": 1, "procs_per_node": 2, "dataset": "cifar10", "tracer": "none"}
    (tmp_path / "timeline.m0.0.txt").write_text(TIMELINE)
    # rank 1 wrote nothing: no rank gets steps, and the run says so
    assert lbann.write_step_tables(tmp_path, tmp_path, [{"epoch": 1}], 1, config, 0.0) is None
    assert not list(tmp_path.glob("steps.rank*.tsv"))
    (tmp_path / "timeline.m0.1.txt").write_text(TIMELINE)
    assert lbann.write_step_tables(tmp_path, tmp_path, [{"epoch": 1}], 1, config, 0.0)
    assert len(list(tmp_path.glob("steps.rank*.tsv"))) == 2


def test_timeline_becomes_the_runs_otf2_trace(tmp_path):
    """With tracer: otf2, every layer's interval becomes a phase region in
    its step, on its rank, in the same archive the other frameworks write;
    the converter reads back what went in."""
    from traces import readers
    from traces.rules import PhaseRules

    for rank in (0, 1):
        (tmp_path / f"timeline.m0.{rank}.txt").write_text(TIMELINE)
    config = {
        "nodes": 1,
        "procs_per_node": 2,
        "dataset": "cifar10",
        "tracer": "otf2",
        "run_id": "t1",
    }
    parsed = [{"epoch": 1}, {"epoch": 2, "test_run_time_s": 0.5}]
    assert lbann.write_step_tables(tmp_path, tmp_path, parsed, 1, config, 0.0)
    assert (tmp_path / "trace" / "traces.otf2").exists()
    table, problems = readers.read(tmp_path / "trace" / "traces.otf2", PhaseRules(), "t1")
    assert problems == []
    table = table.to_pandas()
    in_steps = table[table["step"] >= 0]
    assert sorted(in_steps["rank"].unique()) == [0, 1]
    per_phase = in_steps[in_steps["rank"] == 0].groupby("phase")["dur_ns"].sum()
    # the two steps of TIMELINE: 1.5 + 1 ms loading, 20 ms forward, 60 ms
    # backward, 5 ms optimizer (to the rounding of ns)
    assert per_phase["data_load"] == pytest.approx(2_500_000, abs=10)
    assert per_phase["forward"] == pytest.approx(20_000_000, abs=10)
    assert per_phase["backward"] == pytest.approx(60_000_000, abs=10)
    assert per_phase["optimizer"] == pytest.approx(5_000_000, abs=10)
    assert set(table[table["step"].isna()]["phase"]) == {"init", "eval"}  # outside steps


def test_a_world_smaller_than_launched_is_refused():
    """Ranks that srun started without MPI support each train alone."""
    banner = "  Processes on node          : 1\n  Total number of processes  : 1\n"
    lbann.check_world(banner, 1)
    with pytest.raises(common.RunError, match="DDLC_SRUN_MPI"):
        lbann.check_world(banner, 2)


def test_layer_listing_of_a_run(tmp_path, capsys):
    from frameworks import lbann_timeline

    (tmp_path / "lbann").mkdir()
    (tmp_path / "lbann" / "timeline.m0.0.txt").write_text(TIMELINE)
    assert lbann_timeline.main([str(tmp_path), "1"]) == 0  # the second step only
    out = capsys.readouterr().out
    assert "rank 0: 44.00 ms per step" in out  # 0.5 + 0.5 + 10 + 30 + 3
    assert out.splitlines()[1].split() == ["bp", "conv1", "30.000", "ms", "backward"]
    assert lbann_timeline.main([str(tmp_path / "elsewhere")]) == 1
