"""Gradient compression: every codec within its stated error, the design's
refusal of cells an adapter cannot run, comm_bytes per step, and real
2-process runs that train while the bytes per step drop by the codec's factor."""

import warnings
import json
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import compression as compression_table
from conftest import needs_environment, tiny_design
from ddlcompare.plan import design
from ddlcompare.run import runner
from frameworks import compression, data, models
from frameworks.recorder import PhaseRecorder

RNG = np.random.default_rng(8)
INPUTS = {
    "normal": RNG.standard_normal(50_000).astype(np.float32),
    "heavy tails": np.clip(RNG.standard_cauchy(50_000), -6e4, 6e4).astype(np.float32),
    "tiny": (RNG.standard_normal(50_000) * 1e-6).astype(np.float32),
    "zeros": np.zeros(1000, np.float32),
    "one element": np.array([-3.25], np.float32),
}


# A numpy model of what each codec does to a float32 buffer: the frameworks'
# fp16 and bf16 casts (held to torch's bit for bit below) and the int8 codecs.
def fp16_encode(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def bf16_decode(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def roundtrip(name: str, x: np.ndarray) -> np.ndarray:
    """What a float32 buffer becomes after one codec's trip over the wire."""
    x = np.asarray(x, dtype=np.float32)
    if name == "none":
        return x.copy()
    if name == "fp16":
        return fp16_encode(x).astype(np.float32)
    if name == "bf16":
        return bf16_decode(bf16_encode(x))
    return compression.decode(name, compression.encode(name, x))


def error_bound(name: str, x: np.ndarray) -> np.ndarray:
    """The table's error bound, per element of ``x`` (float32 inputs, fp16
    within its range), with float32's own rounding (2^-23) where the codec
    computes in float32."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    if name == "none":
        return np.zeros_like(x)
    if name == "fp16":
        return np.maximum(x * 2.0**-11, 2.0**-25)
    if name == "bf16":
        return np.maximum(x * 2.0**-8, 2.0**-134)  # below: float32's subnormals
    scale = float(compression.int8_scale(x.astype(np.float32)))
    return np.full_like(x, scale / 2 + (x.max(initial=0) + scale) * 2.0**-23)


@pytest.mark.parametrize("data", INPUTS, ids=list(INPUTS))
@pytest.mark.parametrize("name", compression.NAMES)
def test_each_codec_round_trips_within_its_stated_error(name, data):
    x = INPUTS[data]
    error = np.abs(roundtrip(name, x).astype(np.float64) - x)
    assert (error <= error_bound(name, x)).all()
    if name == "none":
        assert (roundtrip(name, x) == x).all()


def test_int8_uses_the_whole_range_and_its_bound_is_tight():
    x = INPUTS["normal"]
    payload = compression.encode("int8", x)
    q = np.frombuffer(payload[compression.SCALE_BYTES :], dtype=np.int8)
    assert len(payload) == x.size + compression.SCALE_BYTES
    assert q.max() == 127 or q.min() == -127
    assert q.min() >= -127  # -128 never used: the range is symmetric
    error = np.abs(roundtrip("int8", x) - x).max()
    assert error > 0.45 * compression.int8_scale(x)  # the bound is not vacuous


def test_the_lossless_step_is_exact_and_variable_length():
    x = INPUTS["heavy tails"]  # most elements quantize to 0: compressible
    plain, packed = compression.encode("int8", x), compression.encode("int8+lossless", x)
    assert plain[:4] == packed[:4]  # the same scale
    assert zlib.decompress(packed[4:]) == plain[4:]  # byte for byte
    assert (compression.decode("int8+lossless", packed) == compression.decode("int8", plain)).all()
    assert len(packed) < len(plain) / 4
    assert len(compression.encode("int8+lossless", INPUTS["normal"])) != len(packed)


def test_numpy_casts_are_torchs_bit_for_bit():
    """The adapters use torch's casts for fp16 and bf16: the same rounding."""
    import torch

    x = np.concatenate([INPUTS["normal"], INPUTS["tiny"], INPUTS["heavy tails"]])
    t = torch.from_numpy(x)
    assert (bf16_encode(x) == t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)).all()
    assert (fp16_encode(x) == t.to(torch.float16).numpy()).all()


def test_average_of_payloads_is_the_mean_of_the_decoded():
    a, b = INPUTS["normal"], INPUTS["normal"][::-1].copy()
    for name in ("int8", "int8+lossless"):
        mean = compression.average_payloads(
            name, [compression.encode(name, a), compression.encode(name, b)]
        )
        expected = (roundtrip(name, a) + roundtrip(name, b)) / 2
        assert np.allclose(mean, expected, rtol=0, atol=1e-6)


def compressions_design(framework, levels):
    doc = tiny_design([framework])
    doc["factors"]["compression"] = levels
    return doc


def test_design_refuses_a_cell_the_adapter_cannot_run():
    with pytest.raises(design.DesignError) as caught:
        design.parse(compressions_design("horovod-torch", ["none", "bf16"]), "d.yaml")
    assert caught.value.problems == [
        "framework horovod-torch cannot run compression bf16 (it supports: none, fp16, int8, "
        "int8+lossless); add the exclude rule {framework: horovod-torch, compression: bf16}"
    ]
    doc = tiny_design(["torch-ddp", "horovod-torch"])
    doc["factors"]["compression"] = ["none", "bf16"]
    doc["exclude"] = [{"framework": "horovod-torch", "compression": "bf16"}]
    runs = design.parse(doc, "d.yaml").runs()
    assert sorted((r.config["framework"], r.config["compression"]) for r in runs) == [
        ("horovod-torch", "none"),
        ("torch-ddp", "bf16"),
        ("torch-ddp", "none"),
    ]
    fixed = tiny_design(["tf-mwms"], compression="fp16")
    with pytest.raises(design.DesignError, match="set fixed.compression to one of none$"):
        design.parse(fixed, "d.yaml")


def test_recorder_counts_bytes_per_step_and_leaves_them_empty_when_unmeasured(tmp_path):
    phases = PhaseRecorder()
    phases.measures_bytes = True
    for step, sizes in enumerate([(100, 28), (64,)]):
        phases.begin_step(1, step)
        phases.collective("allreduce", sizes[0], 0, 1)
        for size in sizes[1:]:
            phases.count_bytes(size)
        phases.end_step()
    phases.write(tmp_path, 0)
    assert list(pd.read_csv(tmp_path / "steps.rank0.tsv", sep="\t")["comm_bytes"]) == [128, 64]
    unmeasured = PhaseRecorder()
    unmeasured.begin_step(1, 0)
    unmeasured.end_step()
    unmeasured.write(tmp_path, 1)
    assert pd.read_csv(tmp_path / "steps.rank1.tsv", sep="\t")["comm_bytes"].isna().all()
    alone = PhaseRecorder()  # a run of one rank: its collectives send nothing
    alone.measures_bytes = alone.one_rank = True
    alone.begin_step(1, 0)
    alone.collective("allreduce", 1000, 0, 1)
    alone.end_step()
    alone.write(tmp_path, 2)
    assert list(pd.read_csv(tmp_path / "steps.rank2.tsv", sep="\t")["comm_bytes"]) == [0]


def test_summary_divides_by_the_uncompressed_run_of_the_same_cell():
    runs = pd.DataFrame(
        {
            "run_id": list("abcd"),
            "status": ["ok", "ok", "ok", "failed"],
            "framework": "torch-ddp",
            "compression": ["none", "fp16", "int8", "bf16"],
            "world_size": 2,
            "batch_size": 32,
            "comm_bytes_per_step": [400.0, 200.0, 104.0, None],
            "step_mean_s_slowest_rank": 0.1,
            "images_per_s": 10.0,
            "final_test_accuracy": 0.8,
        }
    )
    table = compression_table.summary(runs).set_index("compression")
    assert list(table.index) == ["none", "fp16", "int8"]  # the codecs' order
    assert table["bytes_vs_none"].to_dict() == {"fp16": 0.5, "int8": 0.26, "none": 1.0}
    alone = runs.assign(world_size=1, comm_bytes_per_step=0.0)  # nothing crosses a wire
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 warning on the console
        assert compression_table.summary(alone)["bytes_vs_none"].isna().all()
    support = compression_table.support().set_index("framework")
    assert support.loc["horovod-torch", "bf16"] == "cannot"
    assert (support.loc["torch-ddp"] == "yes").all()


def test_the_figure_of_a_design_of_many_settings_is_drawn_within_bounds(tmp_path):
    """Ten settings (a pause swept at two scales, say) make a facet grid
    wider than plotnine saves (25 inches): it is drawn at the widest it
    takes, not refused (the report's figures job failed on one)."""
    from PIL import Image

    from analysis import figures

    runs = pd.DataFrame(
        {
            "run_id": [f"r{i}" for i in range(10)],
            "status": "ok",
            "framework": "torch-ddp",
            "compression": "none",
            "world_size": 2,
            "batch_size": 32,
            "epochs": list(range(1, 11)),  # a factor of ten levels
            "comm_bytes_per_step": 400.0,
            "step_mean_s_slowest_rank": 0.1,
            "images_per_s": 10.0,
            "final_test_accuracy": 0.8,
        }
    )
    plot = figures.compression(runs)
    assert plot.theme.getp("figure_size")[0] > 25
    figures.save(plot, tmp_path / "compression.png")
    with Image.open(tmp_path / "compression.png") as drawn:
        assert drawn.width <= figures.MAX_INCHES * 110


LEVELS = ["none", "fp16", "int8", "int8+lossless"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_two_processes_train_while_bytes_per_step_drop(framework):
    """Each codec trains (loss down, ranks agree) and comm_bytes per step is
    the codec's factor of the uncompressed run's: fp16 half, int8 a quarter
    plus 4 bytes of scale per buffer, int8+lossless less than int8."""
    doc = compressions_design(framework, LEVELS)
    # 2 epochs of 6 steps, evaluated once at the end: seconds per run
    doc["fixed"].update(max_steps=6, train_images=1000, eval_every=2, tracer="none")
    sent = {}
    with tempfile.TemporaryDirectory() as tmp:
        for row in design.parse(doc, "d.yaml").runs():
            assert runner.execute(row, Path(tmp)) == 0
            folder = Path(tmp) / row.path
            done = json.loads((folder / "done.json").read_text())
            assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
            epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
            assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
            ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
            assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
            steps = pd.concat(pd.read_csv(folder / f"steps.rank{r}.tsv", sep="\t") for r in (0, 1))
            sent[row.config["compression"]] = steps["comm_bytes"]
    none = sent["none"].iloc[-1]
    assert none == 4 * cnn_parameters()  # every fp32 gradient once
    assert (sent["none"] == none).all() and (sent["fp16"] == none / 2).all()
    int8 = sent["int8"] / none
    assert ((int8 > 0.25) & (int8 < 0.2501)).all()
    assert (sent["int8+lossless"] < sent["int8"].min()).all()


def cnn_parameters() -> int:
    info = data.DATASETS["fashion-mnist"]
    return sum(
        row["params"] for row in models.layer_shapes(models.MODELS["cnn"], info.shape, info.classes)
    )


@pytest.mark.slow
@needs_environment("tensorflow", "horovod.tensorflow")
def test_horovod_keras_sends_half_the_bytes_with_fp16(tmp_path):
    doc = tiny_design(
        ["horovod-keras"],
        compression="fp16",
        max_steps=6,
        train_images=1000,
        eval_every=2,
        tracer="none",
    )
    row = design.parse(doc, "d.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    assert json.loads((folder / "done.json").read_text())["status"] == "ok", (
        folder / "train.log"
    ).read_text()[-3000:]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    assert epochs["train_loss"].iloc[1] < epochs["train_loss"].iloc[0]
    steps = pd.read_csv(folder / "steps.rank1.tsv", sep="\t")
    assert (steps["comm_bytes"] == 2 * cnn_parameters()).all()
