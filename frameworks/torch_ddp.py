"""PyTorch DistributedDataParallel: gloo on CPU, NCCL on GPUs; torchrun."""
from __future__ import annotations

from frameworks.registry import AdapterInfo
from frameworks.torch_family import Dist, TorchAdapter

ADAPTER = AdapterInfo(
    name="torch-ddp", module=__name__, family="torch", launcher="torchrun",
    env="torch", probe="torch.distributed",
    exposes=("init", "data_load", "h2d", "forward", "backward", "optimizer", "eval"),
    notes="DDP all-reduces gradient buckets during backward and waits for them "
          "before backward returns, so gradient communication is inside 'backward' "
          "and no 'grad_comm' phase is exposed.",
)


class Adapter(TorchAdapter):
    def init(self, config: dict) -> Dist:
        import torch.distributed as dist
        backend = "nccl" if config["device"] == "gpu" else "gloo"
        dist.init_process_group(backend=backend)
        self.dist = dist
        return self.local_dist(dist.get_rank(), dist.get_world_size())

    def wrap(self, model, optimizer):
        from torch.nn.parallel import DistributedDataParallel
        # DDP broadcasts rank 0's parameters when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def trace_collectives(self, model, phases) -> None:
        """DDP's default all-reduce, wrapped in a communication hook that
        reports each gradient bucket: its bytes, when it was handed to the
        process group, and when its result was ready."""
        import time

        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def traced_allreduce(process_group, bucket):
            start = time.perf_counter_ns()
            nbytes = bucket.buffer().numel() * bucket.buffer().element_size()

            def done(future):
                phases.collective("allreduce", nbytes, start, time.perf_counter_ns())
                return future.value()
            return default_hooks.allreduce_hook(process_group, bucket).then(done)

        model.register_comm_hook(None, traced_allreduce)

    def allreduce(self, tensor, op: str):
        # NCCL reduces device tensors only: the figures travel on the GPU.
        on_device = tensor.to(self.device)
        self.dist.all_reduce(on_device, op={"sum": self.dist.ReduceOp.SUM,
                                            "max": self.dist.ReduceOp.MAX}[op])
        return on_device.cpu()

    def shutdown(self) -> None:
        self.dist.destroy_process_group()
