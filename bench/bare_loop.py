"""The baseline for adapter_overhead.py: the shortest correct distributed
training loop of a framework, with the same model, data, batch and process
count as the harness, and nothing else (no phases, no metrics, no files).

    torchrun --nproc_per_node=2 bench/bare_loop.py torch-ddp BATCH STEPS WARMUP
    horovodrun -np 2 -H localhost:2 --gloo python bench/bare_loop.py horovod-torch ...
Rank 0 prints one JSON line: {"images_per_s": ...}, measured like the
harness: all ranks' images after the warm-up over the slowest rank's time.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

from frameworks import data, models
from frameworks.torch_family import build_model


def main(framework: str, batch: int, steps: int, warmup: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(42)
    dataset = data.load("fashion-mnist")
    model = build_model(models.CNN, dataset.info)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    if framework == "torch-ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model)

        def slowest(seconds):
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t[0])
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

        def slowest(seconds):
            return float(hvd.allreduce(torch.tensor([seconds], dtype=torch.float64), op=hvd.Max))

    mean = torch.tensor(dataset.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(dataset.info.std).view(1, -1, 1, 1)
    indices = data.shard(len(dataset.train_y), rank, world, 42, 1, steps * batch)
    for i in range(steps):
        if i == warmup:
            start = time.perf_counter()
        take = indices[i * batch : (i + 1) * batch]
        x = (torch.from_numpy(dataset.train_x[take]).float().div_(255) - mean) / std
        y = torch.from_numpy(dataset.train_y[take])
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    elapsed = slowest(time.perf_counter() - start)
    if rank == 0:
        print(json.dumps({"images_per_s": (steps - warmup) * batch * world / elapsed}))


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:5]))
