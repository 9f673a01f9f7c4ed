"""Devices as the studies used them: calibrated uneven shares of the global
batch (the mechanism of device: hybrid, tested on CPU ranks made unequal),
and the cells that cannot run refused at plan time with their reason."""

import json

import numpy as np
import pandas as pd
import pytest

from conftest import ddlc, tiny_design, write_design
from ddlcompare.plan import design, devices
from ddlcompare.run import runner
from frameworks import balance, data, models
from frameworks.common import Dist

NO_GPU = devices.gpu_count() == 0


def test_shares_follow_the_speeds_and_add_up():
    assert balance.shares([200.0, 100.0], 64) == [43, 21]
    assert balance.shares([1.0, 1.0, 1.0], 64) == [22, 21, 21]
    assert balance.shares([1e6, 1.0], 64) == [63, 1]  # every rank keeps an image
    assert sum(balance.shares([3.7, 1.2, 0.4, 9.9], 1000)) == 1000


def test_every_split_trains_on_the_same_global_batches():
    """Even (round-robin shards), uneven (calibrated slices) and one process
    with the whole global batch take the same images at each step."""
    config = {"seed": 7, "batch_size": 32}
    even = [balance.even_plan(config, Dist(rank, 2, rank)) for rank in (0, 1)]
    uneven = [
        balance.BatchPlan(seed=7, world=2, rank=rank, replicas=1, images=[45, 19])
        for rank in (0, 1)
    ]
    alone = balance.even_plan({"seed": 7, "batch_size": 64}, Dist(0, 1, 0))
    old = data.shard(4000, 1, 2, 7, 3, 10 * 32)  # the plain shard of the epoch's order
    assert (np.concatenate(even[1].epoch(4000, 3, 10)) == old).all()
    for step in range(10):
        batches = [
            sorted(np.concatenate([p.epoch(4000, 3, 10)[step] for p in plans]))
            for plans in (even, uneven, [alone])
        ]
        assert batches[0] == batches[1] == batches[2]
    # The weights turn the frameworks' plain average into the global batch's mean.
    assert [p.loss_weight for p in uneven] == [45 * 2 / 64, 19 * 2 / 64]
    assert [p.loss_weight for p in even] == [1.0, 1.0]


def assert_same_training(epochs: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Same updates, up to float rounding, which training amplifies step
    after step (test_weighted_gradient_is_the_global_batch_gradient checks
    one update to float precision; a 1e-7 relative change of the weights
    moves this CNN's loss by up to 3e-4 within 36 steps)."""
    assert epochs["train_loss"][0] == pytest.approx(expected["train_loss"][0], rel=1e-3)
    assert epochs["train_loss"].tolist() == pytest.approx(expected["train_loss"].tolist(), rel=1e-2)
    assert epochs["test_accuracy"].tolist() == pytest.approx(
        expected["test_accuracy"].tolist(), abs=0.01
    )


def test_weighted_gradient_is_the_global_batch_gradient():
    """Uneven slices, each rank's mean loss times its loss weight, averaged
    as the frameworks average: the gradient of the global batch's mean loss."""
    import torch
    import torch.nn.functional as F

    from frameworks.torch_family import build_model

    torch.manual_seed(3)
    info = data.DATASETS["fashion-mnist"]
    model = build_model(models.MODELS["cnn"], info).double()
    x = torch.randn(64, *info.shape, dtype=torch.float64)
    y = torch.randint(0, info.classes, (64,))

    def gradient(loss):
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, model.parameters())])

    whole = gradient(F.cross_entropy(model(x), y))
    ranks = [
        balance.BatchPlan(seed=3, world=3, rank=r, replicas=1, images=[37, 18, 9]) for r in range(3)
    ]
    parts = []
    for plan in ranks:
        start = sum(plan.images[: plan.rank])
        mine = slice(start, start + plan.own)
        parts.append(gradient(F.cross_entropy(model(x[mine]), y[mine]) * plan.loss_weight))
    averaged = sum(parts) / len(parts)  # what DDP and Horovod do with the gradients
    assert torch.allclose(averaged, whole, rtol=1e-12, atol=1e-15)


def plan_errors(tmp_path, frameworks, **fixed) -> str:
    doc = tiny_design(frameworks, **fixed)
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    return out.stderr if out.returncode else ""


def test_cells_that_cannot_run_anywhere_are_refused_with_the_reason(tmp_path):
    errors = plan_errors(tmp_path, ["torch-dp"])
    assert "framework torch-dp cannot run device cpu (it runs: gpu)" in errors
    errors = plan_errors(tmp_path, ["tf-mirrored"], batch_split="calibrated")
    assert "framework tf-mirrored cannot cut the batch 'calibrated'" in errors
    assert "calibrated shares run with horovod-keras, horovod-torch, tf-mwms" in errors
    errors = plan_errors(tmp_path, ["torch-ddp"], device="hybrid", hybrid_gpus=2)
    assert "procs_per_node must exceed it, got 2" in errors
    doc = tiny_design(["tf-mirrored"])
    doc["factors"]["nodes"] = [1, 2]
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc)))
    assert "framework tf-mirrored drives the devices of one process on one node" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: nothing to refuse")
@pytest.mark.parametrize(
    "framework,fixed,needed",
    [("torch-dp", {"device": "gpu"}, 2), ("torch-ddp", {"device": "hybrid"}, 1)],
)
def test_gpu_cells_are_refused_at_plan_on_a_machine_without_gpus(
    tmp_path, framework, fixed, needed
):
    errors = plan_errors(tmp_path, [framework], **fixed)
    assert (
        f"framework {framework} with device: {fixed['device']} needs {needed} GPU(s) "
        "and this machine has 0"
    ) in errors, errors
    # --no-check plans here for a GPU machine elsewhere
    doc = tiny_design([framework], **fixed)
    assert ddlc("plan", "--no-check", "--design", str(write_design(tmp_path, doc))).returncode == 0


def parsed(doc):
    return design.parse(doc, "tiny.yaml")


def tiny_run(tmp_path, doc):
    row = parsed(doc).runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_calibrated_shares_give_the_update_of_one_global_batch(tmp_path, monkeypatch, framework):
    """Rank 1 slowed on purpose (4 ms per image): calibration gives it the
    smaller share, and the weighted gradient average trains exactly as one
    process with the whole global batch of 64."""
    monkeypatch.setenv(balance.SLOW_RANKS_ENV, "1:0.004")
    doc = tiny_design([framework], batch_split="calibrated")
    folder = tiny_run(tmp_path / "split", doc)
    monkeypatch.delenv(balance.SLOW_RANKS_ENV)
    alone = tiny_design(["torch-ddp"], procs=(1,))
    alone["factors"]["batch_size"] = [64]
    reference = tiny_run(tmp_path / "alone", alone)

    split = json.loads((folder / balance.BALANCE).read_text())
    ranks = split["ranks"]
    assert ranks[1]["calibrated_images_per_s"] < ranks[0]["calibrated_images_per_s"]
    assert ranks[1]["images_per_step"] < ranks[0]["images_per_step"]
    assert ranks[0]["images_per_step"] + ranks[1]["images_per_step"] == 64
    (cpu,) = split["by_device"]
    assert (cpu["device"], cpu["ranks"], cpu["share"]) == ("cpu", 2, 1.0)
    assert cpu["idle_s"] == pytest.approx(ranks[0]["idle_s"] + ranks[1]["idle_s"])
    assert 0 <= cpu["idle_s"] < cpu["measured_s"]
    epochs = pd.read_csv(folder / "epochs.tsv", sep="\t")
    expected = pd.read_csv(reference / "epochs.tsv", sep="\t")
    assert_same_training(epochs, expected)
    assert epochs["measured_images"].tolist() == expected["measured_images"].tolist()
    digests = {json.loads((folder / f"rank{r}.json").read_text())["params_digest"] for r in (0, 1)}
    assert len(digests) == 1
    if framework == "torch-ddp":  # the report shows each device kind's share and idle time
        from analysis import collect, report

        collect.write_tables(parsed(doc), tmp_path / "split", tmp_path / "tables")
        page = report.build(parsed(doc), tmp_path / "tables", tmp_path / "report.html")
        text = page.read_text()
        # a table header may wrap at "_"
        assert "Devices: shares and idle time" in text and "idle_<wbr>fraction" in text
