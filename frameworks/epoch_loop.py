"""The epoch skeleton of every custom training loop (the PyTorch and the
TensorFlow family's), said once: warm-up and measured steps, the step
records, the epoch's sums, evaluation, the all-reduced epoch row and the
idle clock of calibrated splits. A family supplies only a :class:`Steps`:
its training step, its evaluation and its all-reduce.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import numpy as np

from frameworks import balance, common
from frameworks.common import Dist
from frameworks.recorder import PhaseRecorder
from runfiles.run_config import RunConfig


class Reduces(Protocol):
    """What the epoch's row needs: an all-reduce (Tarantella's fit loop
    has no steps of its own, only this)."""

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """Sum or max of a float64 vector over all processes."""


class Steps(Reduces, Protocol):
    """What a family's loop does within the skeleton."""

    device_kind: str  # "cpu" or "gpu": what this process computes on (balance.json)

    def begin_epoch(self) -> None:
        """Reset the epoch's training sums (and set training mode)."""

    def step(self, take: np.ndarray) -> None:
        """One training step on these training images, its phases timed."""

    def after_step(self) -> None:
        """After the step record is closed (a profiler's step)."""

    def train_sums(self) -> tuple[float, float]:
        """This process's loss sum and correct predictions of the epoch."""

    def evaluate(self, sums: common.EpochSums) -> None:
        """Score this process's share of the test set into ``sums``."""


def run(
    steps_of: Steps,
    config: RunConfig,
    plan: balance.BatchPlan,
    dist: Dist,
    phases: PhaseRecorder,
    clock: common.RunClock,
    run_dir: Path,
    n_train: int,
    steps: int,
) -> list[dict]:
    """Train every epoch; rank 0 rewrites epochs.tsv after each, so that
    progress is visible. Returns the epoch rows."""
    rows, global_step, idle = [], 0, balance.IdleClock(plan, dist.rank)
    for epoch in range(1, config["epochs"] + 1):
        epoch_start = time.perf_counter()
        phases.begin_epoch(epoch)
        batches = plan.epoch(n_train, epoch, steps)
        steps_of.begin_epoch()
        measured_start, measured_steps = None, 0
        for take in batches:
            if measured_start is None and global_step >= config["warmup_steps"]:
                measured_start = time.perf_counter()  # each epoch, once warm-up is over
            phases.begin_step(epoch, global_step)
            steps_of.step(take)
            phases.end_step()
            steps_of.after_step()
            measured_steps += measured_start is not None
            global_step += 1
        measured_s = time.perf_counter() - measured_start if measured_start else 0.0
        idle.add(measured_s, measured_steps)
        loss_sum, correct = steps_of.train_sums()
        sums = common.EpochSums(
            train_loss=loss_sum,
            train_correct=correct,
            train_images=steps * plan.own,
            measured_images=plan.own * measured_steps,
        )
        if common.evaluates(config, epoch):
            with phases.evaluation():
                steps_of.evaluate(sums)
        rows.append(epoch_row(steps_of, epoch, epoch_start, sums, measured_s, clock))
        phases.end_epoch()
        if dist.rank == 0:
            common.write_epochs(run_dir, rows)
    idle.write(run_dir, steps_of.device_kind, steps_of.allreduce)
    return rows


def epoch_row(
    steps_of: Reduces,
    epoch: int,
    epoch_start: float,
    sums: common.EpochSums,
    measured_s: float,
    clock: common.RunClock,
) -> dict:
    """The epoch's row from the all-reduced sums and the slowest process's times."""
    totals = steps_of.allreduce(np.asarray(sums.vector(), dtype=np.float64), "sum")
    slowest = steps_of.allreduce(np.asarray([measured_s, clock.elapsed()], dtype=np.float64), "max")
    return common.epoch_row(
        epoch,
        time.perf_counter() - epoch_start,
        common.EpochSums.from_vector(totals),
        float(slowest[0]),
        float(slowest[1]),
    )
