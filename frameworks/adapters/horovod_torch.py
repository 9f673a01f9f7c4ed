"""Horovod on PyTorch: horovodrun with the Gloo or MPI controller."""

from __future__ import annotations

import os
from pathlib import Path

from frameworks import compression, knobs
from frameworks.common import RunError
from frameworks.registry import AdapterInfo, register
from frameworks.torch_family import Dist, TorchAdapter
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="horovod-torch",
        family="torch",
        launcher="horovodrun",
        probe="horovod.torch",
        also_exposes=("grad_comm",),
        notes="Horovod starts each gradient's all-reduce from a backward hook; "
        "'grad_comm' is the exposed wait in optimizer.synchronize(). "
        "fp16 is hvd.Compression.fp16. bf16: Horovod 0.28 refuses bfloat16 tensors "
        "('Tensor type torch.BFloat16Tensor is not supported'). int8 and int8+lossless: "
        "Horovod's Compressor only wraps an all-reduce, so the adapter all-gathers every "
        "gradient's payload (one grouped all-gather) after backward and each rank "
        "averages the decoded payloads; that exchange does not overlap backward and "
        "all of it is in 'grad_comm'.",
        compressions=("none", "fp16", "int8", "int8+lossless"),
        batch_splits=("even", "calibrated"),
        knobs=("fusion_threshold_kib", "horovod_cycle_time_ms", "horovod_hierarchical_allreduce"),
    )
)


class Adapter(TorchAdapter):
    def init(self, config: RunConfig) -> Dist:
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        if config["device"] == "gpu" and not hvd.nccl_built():
            raise RunError(
                "device: gpu needs Horovod built with NCCL, and this one was "
                "built without it: run envs/setup.sh where nvcc is on PATH "
                "(e.g. after 'module load cuda'), which rebuilds it with NCCL"
            )
        self.config = config
        self.compression = config["compression"]
        self.gathers = compression.CODECS[self.compression].gathers
        return Dist(rank=hvd.rank(), world=hvd.size(), local_rank=hvd.local_rank())

    def wrap(self, model, optimizer):
        from frameworks.torch_compression import horovod_compressor

        hvd = self.hvd
        self.phases.measures_bytes = True
        self.grad_bytes = {
            f"allreduce.{name}": p.numel() * p.element_size()
            for name, p in model.named_parameters()
        }
        if self.gathers:
            self.params = list(model.parameters())
        else:
            optimizer = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=model.named_parameters(),
                compression=horovod_compressor(self.compression, self.phases),
            )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def sync_gradients(self, optimizer) -> None:
        if self.gathers:
            from frameworks.torch_compression import horovod_gather_average

            grads = [p.grad for p in self.params if p.grad is not None]
            horovod_gather_average(self.hvd, self.compression, grads, self.phases)
        else:
            optimizer.synchronize()

    # The steps whose Horovod timeline shows the knobs: after the first (its
    # negotiations are not typical), within the warm-up left out of throughput.
    KNOB_STEPS = range(2, 7)

    def step(self, optimizer) -> None:
        self._knob_window(self.steps_done)
        self.steps_done += 1
        self._step(optimizer)

    steps_done = 0
    window_open = False

    def _knob_window(self, index: int) -> None:
        window = os.environ.get(knobs.KNOBS_TIMELINE)
        if window and index == self.KNOB_STEPS.start:
            self.hvd.start_timeline(window, mark_cycles=True)
            self.window_open = True
        elif self.window_open and index == self.KNOB_STEPS.stop:
            self.hvd.stop_timeline()
            self.window_open = False

    def knobs_in_effect(self) -> dict:
        """Horovod reads its knobs from the environment at init; its
        timeline (a window of warm-up steps, or the run's own with
        horovod_timeline) shows whether its fused responses and cycles obey them."""
        set_ = knobs.asked(self.config)
        if not set_:
            return {}
        window = os.environ.get(knobs.KNOBS_TIMELINE)
        if self.window_open:  # a run shorter than the window
            self.hvd.stop_timeline()
        if self.hvd.rank() != 0:  # rank 0 alone writes Horovod's timeline
            return {}
        path = Path(window or os.environ["HOROVOD_TIMELINE"])
        events = knobs.timeline_events(path.read_text()) if path.exists() else []
        found = knobs.horovod_evidence(events, self.grad_bytes, self.config, self.hvd.local_size())
        return knobs.confirm(self.config, found, f"Horovod's timeline ({path.name})")

    def _step(self, optimizer) -> None:
        if self.gathers:
            optimizer.step()
            return
        with optimizer.skip_synchronize():
            optimizer.step()

    def allreduce(self, tensor, op: str):
        reduce_op = {"sum": self.hvd.Sum, "max": self.hvd.Max}[op]
        return self.hvd.allreduce(tensor, op=reduce_op, name=f"metrics.{op}")

    def shutdown(self) -> None:
        self.hvd.shutdown()
