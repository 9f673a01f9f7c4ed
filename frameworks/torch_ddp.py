"""PyTorch DistributedDataParallel: gloo on CPU, NCCL on GPUs; torchrun."""

from __future__ import annotations

from frameworks import compression
from frameworks.registry import AdapterInfo
from frameworks.torch_family import Dist, TorchAdapter

ADAPTER = AdapterInfo(
    name="torch-ddp",
    module=__name__,
    family="torch",
    launcher="torchrun",
    env="torch",
    probe="torch.distributed",
    exposes=("init", "data_load", "h2d", "forward", "backward", "optimizer", "eval"),
    notes="DDP all-reduces gradient buckets during backward and waits for them "
    "before backward returns, so gradient communication is inside 'backward' "
    "and no 'grad_comm' phase is exposed. Compression is a communication hook "
    "(frameworks/torch_compression.py): fp16 and bf16 cast each bucket for the "
    "all-reduce, as torch's fp16/bf16_compress_hook; int8 and int8+lossless "
    "all-gather each bucket's payload and every rank averages the decoded ones.",
    compressions=compression.NAMES,
    devices=("cpu", "gpu", "hybrid"),
    batch_splits=("even", "calibrated"),
)


class Adapter(TorchAdapter):
    def init(self, config: dict) -> Dist:
        import torch.distributed as dist

        # hybrid: gloo, the one backend that reduces CPU and CUDA tensors in
        # one group (NCCL reaches GPU ranks only); see docs/devices.md
        backend = "nccl" if config["device"] == "gpu" else "gloo"
        dist.init_process_group(backend=backend)
        self.dist = dist
        self.compression = config["compression"]
        return self.local_dist(dist.get_rank(), dist.get_world_size())

    def wrap(self, model, optimizer):
        from torch.nn.parallel import DistributedDataParallel

        from frameworks.torch_compression import ddp_hook

        # DDP broadcasts rank 0's parameters when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
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

    def shutdown(self) -> None:
        self.dist.destroy_process_group()
