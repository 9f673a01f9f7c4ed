"""PyTorch DistributedDataParallel: gloo on CPU, NCCL on GPUs; torchrun."""

from __future__ import annotations

from frameworks import compression, knobs
from frameworks.registry import AdapterInfo, register
from frameworks.torch_family import Dist, TorchAdapter
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="torch-ddp",
        family="torch",
        launcher="torchrun",
        probe="torch.distributed",
        notes="DDP all-reduces gradient buckets during backward and waits for them "
        "before backward returns, so gradient communication is inside 'backward' "
        "and no 'grad_comm' phase is exposed. Compression is a communication hook "
        "(frameworks/torch_compression.py): fp16 and bf16 cast each bucket for the "
        "all-reduce, as torch's fp16/bf16_compress_hook; int8 and int8+lossless "
        "all-gather each bucket's payload and every rank averages the decoded ones.",
        compressions=compression.NAMES,
        devices=("cpu", "gpu", "hybrid"),
        batch_splits=("even", "calibrated"),
        knobs=("fusion_threshold_kib", "ddp_gradient_as_bucket_view"),
    )
)


class Adapter(TorchAdapter):
    def init(self, config: RunConfig) -> Dist:
        import torch.distributed as dist

        # hybrid: gloo, the one backend that reduces CPU and CUDA tensors in
        # one group (NCCL reaches GPU ranks only); see docs/devices.md
        backend = "nccl" if config["device"] == "gpu" else "gloo"
        dist.init_process_group(backend=backend)
        self.dist = dist
        self.compression = config["compression"]
        self.config = config
        return self.local_dist(dist.get_rank(), dist.get_world_size())

    def wrap(self, model, optimizer):
        from torch.nn.parallel import DistributedDataParallel

        from frameworks.torch_compression import ddp_hook

        # DDP broadcasts rank 0's parameters when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        kib = self.config["fusion_threshold_kib"]
        model = DistributedDataParallel(
            model,
            device_ids=ids,
            gradient_as_bucket_view=self.config["ddp_gradient_as_bucket_view"],
            **({} if kib is None else {"bucket_cap_mb": kib / knobs.KIB}),
        )
        self.ddp = model
        # One hook, always: it compresses (or not), exchanges each gradient
        # bucket and reports its bytes, start and end to the phase recorder.
        model.register_comm_hook(*ddp_hook(self.compression, self.phases))
        self.phases.measures_bytes = True
        return model, optimizer

    def allreduce(self, tensor, op: str):
        # NCCL reduces device tensors only: the figures travel on the GPU.
        on_device = tensor.to(self.device)
        self.dist.all_reduce(
            on_device, op={"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}[op]
        )
        return on_device.cpu()

    def knobs_in_effect(self) -> dict:
        """The bucket cap and gradient view from DDP's own logging data, and
        the buckets its reducer built after the first steps, which must obey
        that cap: a bucket closes at the first gradient that fills it."""
        logged = self.ddp._get_ddp_logging_data()
        cap = logged["bucket_cap_bytes"]
        found = {
            "fusion_threshold_kib": cap // knobs.KIB if cap % knobs.KIB == 0 else cap / knobs.KIB,
            "ddp_gradient_as_bucket_view": bool(logged["gradient_as_bucket_view"]),
        }
        if "rebuilt_per_bucket_param_indices" in logged:
            sizes = [p.numel() * p.element_size() for p in self.ddp.module.parameters()]
            buckets = [
                [sizes[int(i)] for i in group.split()]
                for group in logged["rebuilt_per_bucket_param_indices"].split(",")
            ]
            found["ddp_bucket_bytes"] = [sum(b) for b in buckets]
            if any(sum(b[:-1]) >= cap for b in buckets):
                found["fusion_threshold_kib"] = f"buckets {found['ddp_bucket_bytes']} overrun it"
        return knobs.confirm(self.config, found, "DDP's logging data")

    def shutdown(self) -> None:
        self.dist.destroy_process_group()
