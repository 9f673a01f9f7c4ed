"""PyTorch DataParallel: one process drives every local GPU (launcher
'one-process'); procs_per_node is the number of GPUs it spreads over."""

from __future__ import annotations

from frameworks.common import RunError
from frameworks.registry import AdapterInfo, register
from frameworks.torch_family import Dist, TorchAdapter
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="torch-dp",
        family="torch",
        launcher="one-process",
        devices=("gpu",),
        one_process=True,
        notes="torch.nn.DataParallel in one process: each forward scatters the batch from "
        "GPU 0 to every GPU, replicates the module onto them, runs the replicas in "
        "threads and gathers their outputs on GPU 0, so scatter, replicate and gather "
        "are inside 'forward'; backward sums the replicas' gradients onto GPU 0's "
        "parameters (reduce-add through autograd), inside 'backward'. There is no "
        "all-reduce, hence no 'grad_comm', and GPU 0 does the optimizer step alone. "
        "Evaluation runs on GPU 0.",
    )
)


class Adapter(TorchAdapter):
    def init(self, config: RunConfig) -> Dist:
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.replicas = config["procs_per_node"]
        if found < self.replicas:
            raise RunError(
                f"torch-dp spreads one process over procs_per_node={self.replicas} "
                f"GPUs, and torch sees {found} here"
            )
        return Dist(rank=0, world=1, local_rank=0)

    def wrap(self, model, optimizer):
        from torch.nn import DataParallel

        # Chunks of batch_size in order: replica k gets what DDP's rank k would.
        return DataParallel(model, device_ids=list(range(self.replicas))), optimizer

    def allreduce(self, tensor, op: str):
        return tensor  # one process: its figures are the run's
