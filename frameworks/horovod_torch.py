"""Horovod on PyTorch: horovodrun with the Gloo or MPI controller."""
from __future__ import annotations

from frameworks.common import RunError
from frameworks.registry import AdapterInfo
from frameworks.torch_family import Dist, TorchAdapter

ADAPTER = AdapterInfo(
    name="horovod-torch", module=__name__, family="torch", launcher="horovodrun",
    env="torch", probe="horovod.torch",
    exposes=("init", "data_load", "h2d", "forward", "backward", "grad_comm",
             "optimizer", "eval"),
    notes="Horovod starts each gradient's all-reduce from a backward hook; "
          "'grad_comm' is the exposed wait in optimizer.synchronize().",
)


class Adapter(TorchAdapter):
    def init(self, config: dict) -> Dist:
        import horovod.torch as hvd
        hvd.init()
        self.hvd = hvd
        if config["device"] == "gpu" and not hvd.nccl_built():
            raise RunError("device: gpu needs Horovod built with NCCL, and this one was "
                           "built without it: run envs/setup.sh where nvcc is on PATH "
                           "(e.g. after 'module load cuda'), which rebuilds it with NCCL")
        return Dist(rank=hvd.rank(), world=hvd.size(), local_rank=hvd.local_rank())

    def wrap(self, model, optimizer):
        hvd = self.hvd
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def sync_gradients(self, optimizer) -> None:
        optimizer.synchronize()

    def step(self, optimizer) -> None:
        with optimizer.skip_synchronize():
            optimizer.step()

    def allreduce(self, tensor, op: str):
        reduce_op = {"sum": self.hvd.Sum, "max": self.hvd.Max}[op]
        return self.hvd.allreduce(tensor, op=reduce_op, name=f"metrics.{op}")

    def shutdown(self) -> None:
        self.hvd.shutdown()
