"""The PyTorch training loop shared by every PyTorch adapter.

Adapters subclass :class:`TorchAdapter` and override only their
framework's own calls (init, wrap, gradient sync, all-reduce, shutdown). The
model, the data, the phases and the figures are the same for all of them.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from runfiles import energy, names
from frameworks import balance, common, data, epoch_loop, models
from frameworks.common import Dist
from frameworks import tracing
from frameworks.recorder import LiveRegions, PhaseRecorder
from runfiles.run_config import RunConfig


class TorchAdapter:
    """Defaults follow plain single-process PyTorch; adapters override.

    ``phases`` is the run's recorder: adapters report each gradient
    collective to it (bytes, and start and end where they can) through
    ``phases.collective`` or ``phases.count_bytes``, tracer or not."""

    device: Any = None  # a torch.device once init has run (torch is imported late)
    phases: PhaseRecorder | None = None
    replicas = 1  # model replicas this process drives (DataParallel: its GPUs)

    def local_dist(self, rank: int, world: int) -> Dist:
        return Dist(rank=rank, world=world, local_rank=int(os.environ.get("LOCAL_RANK", 0)))

    def init(self, config: RunConfig) -> Dist:
        raise NotImplementedError

    def wrap(self, model, optimizer):
        return model, optimizer

    def backward(self, loss, optimizer) -> None:
        optimizer.zero_grad()  # set_to_none by default; Horovod takes no argument
        loss.backward()

    def sync_gradients(self, optimizer) -> None:
        """Wait for gradient communication, where the framework exposes it."""

    def step(self, optimizer) -> None:
        optimizer.step()

    def allreduce(self, tensor, op: str):
        raise NotImplementedError

    def knobs_in_effect(self) -> dict:
        """The framework knobs in effect, read back from the framework
        (frameworks/knobs.py); adapters that take knobs override it."""
        return {}

    def shutdown(self) -> None:
        pass


def build_model(spec: dict, info: data.DatasetInfo):
    """The shared specification as a torch.nn.Sequential (or, for a graph
    spec such as ResNet-34, a torch_graph.GraphNet), initialised as it says."""
    if not models.is_sequential(spec):
        from frameworks.torch_graph import graph_net

        return graph_net(spec, info)
    from torch import nn

    channels = info.shape[0]
    layers: list = []
    shapes = models.layer_shapes(spec, info.shape, info.classes)
    flat = 0  # the features after the flatten layer
    for layer, shape in zip(spec["layers"], (row["shape"] for row in shapes)):
        kind = layer["type"]
        if kind == "conv2d":
            conv = nn.Conv2d(channels, layer["filters"], layer["kernel"], padding="same")
            layers.append(conv)
            channels = layer["filters"]
        elif kind == "maxpool2d":
            layers.append(nn.MaxPool2d(layer["size"]))
        elif kind == "flatten":
            layers.append(nn.Flatten())
            flat = shape[0]
        elif kind == "dense":
            layers.append(nn.Linear(flat, shape[0]))
            flat = shape[0]
        if layer.get("activation") == "relu":
            layers.append(nn.ReLU())
        if kind in ("conv2d", "dense"):
            _initialise(
                layers[-2] if layer.get("activation") else layers[-1],
                spec["init"],
                layer.get("activation"),
            )
    return nn.Sequential(*layers)


def _initialise(module, init: dict, activation: str | None) -> None:
    from torch import nn

    if activation == "relu" and init["relu"] == "he_uniform":
        nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
    elif init["linear"] == "glorot_uniform":
        nn.init.xavier_uniform_(module.weight)
    nn.init.zeros_(module.bias)


def train(adapter: TorchAdapter, config: RunConfig, run_dir: Path) -> None:
    import torch

    phases = tracing.recorder(config)
    adapter.phases = phases
    init_start = time.perf_counter()
    with phases("init"):
        _require_gpu(config)  # before the framework asks NCCL for one
        dist = adapter.init(config)
        phases.one_rank = dist.world == 1
        energy.start_sampling(config, run_dir, dist)
        torch.set_num_threads(config["threads"])
        device = _device(config, dist)
        adapter.device = device
        if device.type == "cuda":
            phases.synchronize = torch.cuda.synchronize
        torch.manual_seed(config["seed"])  # identical initial weights on every rank
        clock = common.RunClock()
        dataset = data.load(config["dataset"], config["data_dir"])
        model = build_model(models.MODELS[config["model"]], dataset.info).to(device)
        mean = torch.tensor(dataset.info.mean).view(1, -1, 1, 1)
        std = torch.tensor(dataset.info.std).view(1, -1, 1, 1)

        def batch_tensors(x_u8, y):
            x = (torch.from_numpy(x_u8).float().div_(255) - mean) / std
            return x, torch.from_numpy(y)

        plan = _batch_plan(adapter, config, dist, model, dataset, batch_tensors)
        global_batch = plan.global_batch
        lr = models.scaled_learning_rate(config, global_batch)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=config["momentum"])
        model, optimizer = adapter.wrap(model, optimizer)
    init_s = time.perf_counter() - init_start
    tracing.attach(phases, config, run_dir, dist.rank, dist.world)
    profiler = _start_profiler(config, phases, device)

    n_train, n_test, steps = common.epoch_sizes(config, dataset, plan.world)
    evaluate = functools.partial(
        _evaluate,
        model,
        dataset,
        dist,
        batch_tensors=batch_tensors,
        device=device,
        batch=config["batch_size"],
        n_test=n_test,
    )
    steps_of = _TorchSteps(
        adapter, model, optimizer, batch_tensors, dataset, plan, phases, profiler, evaluate
    )
    rows = epoch_loop.run(steps_of, config, plan, dist, phases, clock, run_dir, n_train, steps)
    if profiler is not None:
        _stop_profiler(profiler, run_dir, dist.rank)
    common.finish(
        adapter,
        run_dir,
        phases,
        dist,
        {"torch": torch.__version__, **_framework_versions()},
        params_digest(model),
        common.summary(rows, plan.world, global_batch, lr, steps, init_s, clock),
    )


class _TorchSteps:
    """The PyTorch family's part of the epoch loop (frameworks/epoch_loop.py)."""

    def __init__(
        self,
        adapter: TorchAdapter,
        model,
        optimizer,
        batch_tensors,
        dataset,
        plan: balance.BatchPlan,
        phases: PhaseRecorder,
        profiler,
        evaluate,
    ):
        self.adapter, self.model, self.optimizer = adapter, model, optimizer
        self.evaluate = evaluate  # (sums): distributed evaluation into the epoch's sums
        self.batch_tensors, self.dataset, self.phases = batch_tensors, dataset, phases
        self.profiler, self.rank = profiler, plan.rank
        self.weight = plan.loss_weight  # a calibrated split weighs each rank's gradient
        self.device = adapter.device
        self.device_kind = "gpu" if self.device.type == "cuda" else "cpu"
        self.allreduce = _numpy_allreduce(adapter)

    def begin_epoch(self) -> None:
        import torch

        self.loss_sum = torch.zeros((), device=self.device)
        self.correct = torch.zeros((), device=self.device)
        self.model.train()

    def step(self, take) -> None:
        import torch.nn.functional as F

        adapter, optimizer, phases, device = self.adapter, self.optimizer, self.phases, self.device
        with phases("data_load"):
            x, y = self.batch_tensors(self.dataset.train_x[take], self.dataset.train_y[take])
        if device.type == "cuda":
            with phases("h2d"):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with phases("forward"):
            out = self.model(x)
            loss = F.cross_entropy(out, y)
            balance.slow_down(self.rank, len(y))
        with phases("backward"):
            adapter.backward(loss * self.weight if self.weight != 1 else loss, optimizer)
        with phases("grad_comm"):
            adapter.sync_gradients(optimizer)
        with phases("optimizer"):
            adapter.step(optimizer)
            self.loss_sum += loss.detach() * len(y)
            self.correct += (out.detach().argmax(1) == y).sum()

    def after_step(self) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def train_sums(self) -> tuple[float, float]:
        return float(self.loss_sum), float(self.correct)


def _batch_plan(
    adapter: TorchAdapter, config: RunConfig, dist: Dist, model, dataset, batch_tensors
) -> balance.BatchPlan:
    """Even shares, or shares from timing a few local steps of a copy of
    the model (no communication: the copy is not wrapped)."""
    if not balance.calibrates(config):
        return balance.even_plan(config, dist, adapter.replicas)
    import copy

    import torch
    import torch.nn.functional as F

    probe = copy.deepcopy(model)
    take = slice(0, config["batch_size"])
    x, y = batch_tensors(dataset.train_x[take], dataset.train_y[take])
    x, y = x.to(adapter.device), y.to(adapter.device)

    def one_step():
        probe.zero_grad()
        F.cross_entropy(probe(x), y).backward()
        balance.slow_down(dist.rank, len(y))
        if adapter.device.type == "cuda":
            torch.cuda.synchronize()

    return balance.calibrated_plan(config, dist, one_step, _numpy_allreduce(adapter))


def _numpy_allreduce(adapter: TorchAdapter):
    """The adapter's all-reduce on float64 numpy vectors (the balance module's)."""
    import torch

    return lambda values, op: adapter.allreduce(torch.from_numpy(values), op).numpy()


def params_digest(model) -> str:
    """SHA-256 of every trainable parameter's bytes: equal on all ranks iff
    the replicas hold the same weights. BN running statistics are left out:
    they are per process (the spec's plain BN)."""
    import hashlib

    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _require_gpu(config: RunConfig) -> None:
    import torch

    if config["device"] in ("gpu", "hybrid") and not torch.cuda.is_available():
        raise common.RunError(
            "device: gpu was asked for, but torch sees no CUDA device here "
            f"(torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'no'})"
        )


def _device(config: RunConfig, dist: Dist):
    """This process's device: its local rank's GPU; under device: hybrid,
    the first hybrid_gpus local ranks take a GPU each, the others the CPU."""
    import torch

    if config["device"] == "gpu" or (
        config["device"] == "hybrid" and dist.local_rank < config["hybrid_gpus"]
    ):
        torch.cuda.set_device(dist.local_rank)
        return torch.device("cuda", dist.local_rank)
    return torch.device("cpu")


def _evaluate(
    model,
    dataset,
    dist: Dist,
    sums: common.EpochSums,
    batch_tensors,
    device,
    batch: int,
    n_test: int,
) -> None:
    """Distributed evaluation: each rank scores every world-th of the first
    ``n_test`` test images."""
    import torch
    import torch.nn.functional as F

    model.eval()
    ids = np.arange(dist.rank, n_test, dist.world)
    eval_batch = max(batch, 256)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids), eval_batch):
            take = ids[start : start + eval_batch]
            x, y = batch_tensors(dataset.test_x[take], dataset.test_y[take])
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
    sums.test_loss, sums.test_correct, sums.test_images = loss, correct, len(ids)


class _ProfilerAnnotations(LiveRegions):
    """Phases as PyTorch profiler annotations, so the Kineto trace names them."""

    def __init__(self):
        from torch.autograd.profiler import record_function

        self.record_function = record_function
        self.open: list = []

    def begin(self, name: str) -> None:
        region = self.record_function(name)
        region.__enter__()
        self.open.append(region)

    def end(self, name: str) -> None:
        self.open.pop().__exit__(None, None, None)


def _start_profiler(config: RunConfig, phases: PhaseRecorder, device):
    """The PyTorch profiler over the training steps (``torch_profiler: true``),
    with CUDA activities where this rank computes on a GPU (``device: gpu``,
    and the GPU ranks of ``device: hybrid``)."""
    if not config["torch_profiler"]:
        return None
    import torch.profiler as tp

    activities = [tp.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(tp.ProfilerActivity.CUDA)
    profiler = tp.profile(activities=activities)
    profiler.start()
    phases.live.append(_ProfilerAnnotations())
    return profiler


def _stop_profiler(profiler, run_dir: Path, rank: int) -> None:
    profiler.stop()
    folder = run_dir / names.TORCH_PROFILER_DIR
    folder.mkdir(exist_ok=True)
    profiler.export_chrome_trace(str(folder / f"rank{rank}.json"))


def _framework_versions() -> dict:
    try:
        import horovod

        return {"horovod": horovod.__version__}
    except ImportError:
        return {}
