"""Which training images each process takes at each step, evenly or in
shares sized to each rank's measured speed (``batch_split: calibrated``,
and always under ``device: hybrid``). Framework-neutral: the PyTorch and
TensorFlow loops ask the same :class:`BatchPlan`.

The global batch of step i is the same block of the epoch's shared
permutation in every case: ``order[i*N:(i+1)*N]`` with N the global batch.
Even split deals it round-robin (data.shard); a calibrated split cuts it
into contiguous slices of ``images[r]`` images, one per rank.

Uneven slices need a weighted gradient average: the frameworks average
gradients over the ranks, each rank's gradient being the mean over its
slice. Scaling rank r's loss by ``images[r] * world / N`` (``loss_weight``)
makes that plain average ``sum_r images[r] / N * mean_r = the mean over the
global batch``: the update of the same global batch on one device, and no
framework's communication has to change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from runfiles import variables
from runfiles.names import BALANCE
from frameworks import data
from frameworks.common import Dist, RunError, write_json
from runfiles.run_config import RunConfig


CALIBRATION_STEPS = 3  # timed steps, after one untimed (first-call costs)
# A deliberate slowdown, "RANK:SECONDS_PER_IMAGE[,RANK:...]": each named rank
# sleeps that long per image it computes, in calibration and in training.
# It emulates a slower device on a machine whose cores are all alike (tests).
SLOW_RANKS_ENV = "DDLC_SLOW_RANKS"


def calibrates(config: RunConfig) -> bool:
    return config["batch_split"] == "calibrated" or config["device"] == "hybrid"


@dataclass
class BatchPlan:
    """Images per step of every rank of the data-parallel group.

    ``world`` counts data-parallel replicas: processes times the replicas
    each process drives (single-process strategies mirror over several)."""

    seed: int
    world: int
    rank: int  # this process's first replica
    replicas: int  # replicas this process drives (1 but for one-process strategies)
    images: list[int]  # images per step of each replica, in rank order
    speeds: list[float] | None = None  # measured images/s of each rank (calibrated only)

    @property
    def global_batch(self) -> int:
        return sum(self.images)

    @property
    def own(self) -> int:
        """Images this process takes per step (all its replicas)."""
        return sum(self.images[self.rank : self.rank + self.replicas])

    @property
    def even(self) -> bool:
        return len(set(self.images)) == 1

    @property
    def loss_weight(self) -> float:
        """Factor on this process's mean loss that turns the frameworks' plain
        gradient average over the processes into the global batch's mean
        (1 when the split is even)."""
        return self.own * (self.world // self.replicas) / self.global_batch

    def epoch(self, n_train: int, epoch: int, steps: int) -> list[np.ndarray]:
        """This process's indices for each step of an epoch, its replicas'
        slices one after the other (as DataParallel scatters them)."""
        if self.even:
            per = self.images[0]
            parts = [
                data.shard(n_train, r, self.world, self.seed, epoch, steps * per)
                for r in range(self.rank, self.rank + self.replicas)
            ]
            return [
                np.concatenate([p[i * per : (i + 1) * per] for p in parts]) for i in range(steps)
            ]
        order = np.random.default_rng([self.seed, epoch]).permutation(n_train)
        start = sum(self.images[: self.rank])
        n = self.global_batch
        return [order[i * n + start : i * n + start + self.own] for i in range(steps)]


def even_plan(config: RunConfig, dist: Dist, replicas: int = 1) -> BatchPlan:
    world = dist.world * replicas
    return BatchPlan(
        seed=config["seed"],
        world=world,
        rank=dist.rank * replicas,
        replicas=replicas,
        images=[config["batch_size"]] * world,
    )


def calibrated_plan(config: RunConfig, dist: Dist, seconds_per_step, allreduce) -> BatchPlan:
    """Time a few local steps of ``batch_size`` images on this rank
    (``seconds_per_step()``: one forward and backward, no communication),
    share every rank's speed (``allreduce(vector, "sum")``) and cut the
    global batch in proportion to the speeds."""
    batch = config["batch_size"]
    seconds_per_step()  # first call: allocation, kernel selection
    start = time.perf_counter()
    for _ in range(CALIBRATION_STEPS):
        seconds_per_step()
    speed = CALIBRATION_STEPS * batch / (time.perf_counter() - start)
    mine = np.zeros(dist.world, dtype=np.float64)
    mine[dist.rank] = speed
    speeds = [float(s) for s in allreduce(mine, "sum")]
    return BatchPlan(
        seed=config["seed"],
        world=dist.world,
        rank=dist.rank,
        replicas=1,
        images=shares(speeds, batch * dist.world),
        speeds=speeds,
    )


def shares(speeds: list[float], global_batch: int) -> list[int]:
    """Cut ``global_batch`` in proportion to ``speeds`` by largest remainder
    (the parts always add up to the batch), at least one image each."""
    if global_batch < len(speeds):
        raise RunError(
            f"a calibrated split needs at least one image per rank: global batch "
            f"{global_batch} < {len(speeds)} ranks"
        )
    exact = [global_batch * s / sum(speeds) for s in speeds]
    parts = [int(e) for e in exact]
    by_remainder = sorted(range(len(speeds)), key=lambda r: exact[r] - parts[r], reverse=True)
    for r in by_remainder[: global_batch - sum(parts)]:
        parts[r] += 1
    for r in range(len(parts)):
        if parts[r] == 0:  # a rank far slower than the others still takes one image
            parts[r] = 1
            parts[parts.index(max(parts))] -= 1
    return parts


def slow_down(rank: int, images: int) -> None:
    """Sleep as the deliberately slowed rank (DDLC_SLOW_RANKS), if this is one."""
    seconds = _slow_ranks(variables.get(SLOW_RANKS_ENV) or "").get(rank)
    if seconds:
        time.sleep(seconds * images)


@lru_cache(maxsize=4)
def _slow_ranks(text: str) -> dict[int, float]:
    try:
        return {
            int(r): variables.number(SLOW_RANKS_ENV, s)
            for r, s in (item.split(":") for item in text.split(",") if item)
        }
    except ValueError:
        raise RunError(
            f"{SLOW_RANKS_ENV}={text!r}: expected RANK:SECONDS_PER_IMAGE[,...], e.g. 1:0.002"
        ) from None


class IdleClock:
    """This rank's idle time under a calibrated split: the measured time of
    its steps less the time its share takes at its calibrated speed (what
    it spends waiting for the slowest rank, and communicating)."""

    def __init__(self, plan: BatchPlan, rank: int):
        self.plan, self.rank, self.idle_s, self.measured_s = plan, rank, 0.0, 0.0

    def add(self, measured_s: float, measured_steps: int) -> None:
        if self.plan.speeds:
            busy = measured_steps * self.plan.own / self.plan.speeds[self.rank]
            self.idle_s += max(0.0, measured_s - busy)
            self.measured_s += measured_s

    def write(self, run_dir: Path, device: str, allreduce) -> None:
        """Rank 0 writes balance.json; every rank must call this (an all-reduce)."""
        if not self.plan.speeds:
            return
        world = self.plan.world
        mine = np.zeros((3, world), dtype=np.float64)
        mine[:, self.rank] = self.idle_s, self.measured_s, device == "gpu"
        idle, measured, on_gpu = allreduce(mine.ravel(), "sum").reshape(3, world)
        if self.rank == 0:
            kinds = ["gpu" if gpu else "cpu" for gpu in on_gpu]
            write_json(
                run_dir / BALANCE, record(self.plan, kinds, idle.tolist(), measured.tolist())
            )


def record(
    plan: BatchPlan, devices: list[str], idle_s: list[float], measured_s: list[float]
) -> dict:
    """What balance.json says: each rank's device, share, speed and idle
    time, and the same summed by device kind (the hybrid study's question:
    does the CPU help or hold back?)."""
    ranks = [
        {
            "rank": r,
            "device": devices[r],
            "images_per_step": plan.images[r],
            "share": plan.images[r] / plan.global_batch,
            "calibrated_images_per_s": plan.speeds[r] if plan.speeds else None,
            "idle_s": idle_s[r],
            "measured_s": measured_s[r],
        }
        for r in range(plan.world)
    ]
    kinds: dict[object, dict] = {}
    for row in ranks:
        kind = kinds.setdefault(
            row["device"],
            {"device": row["device"], "ranks": 0, "share": 0.0, "idle_s": 0.0, "measured_s": 0.0},
        )
        kind["ranks"] += 1
        for key in ("share", "idle_s", "measured_s"):
            kind[key] += row[key]
    return {"global_batch": plan.global_batch, "ranks": ranks, "by_device": list(kinds.values())}
