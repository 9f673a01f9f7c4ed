"""What every training loop shares, whatever its framework: the config, the
epoch table, the run's figures and each rank's record.

The meaning of the figures is fixed here once:
- throughput is global: images processed by all ranks in the measured steps,
  divided by the wall time of the slowest rank over those steps; the first
  ``warmup_steps`` steps of the run are left out, and so is evaluation;
- evaluation is distributed: each rank scores its own shard of the test set
  and the sums are all-reduced.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from runfiles.names import EPOCH_COLUMNS, EPOCHS, METRICS
from runfiles import cpu, energy, names, ownership
from runfiles.atomic import write_json, write_text  # noqa: F401 (re-exported for loops)
from runfiles.run_config import RunConfig


class RunClock:
    """The run's clock, by MLPerf's rule: it starts just before the training
    data is first touched, and each epoch reads it after its evaluation, so
    that time to accuracy counts loading, training and evaluating."""

    def __init__(self):
        self.start_unix = time.time()
        self._start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def at(self, perf_counter_s: float) -> float:
        """A ``time.perf_counter()`` value of this process on the run clock."""
        return perf_counter_s - self._start


class RunError(Exception):
    """A run that cannot go on for a reason the user can fix; the worker
    prints it as one line, which becomes the run's failure reason."""


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int


@dataclass
class EpochSums:
    """Per-rank sums for one epoch; all-reduced before use (as a flat vector)."""

    train_loss: float = 0.0
    train_correct: float = 0.0
    train_images: float = 0.0
    test_loss: float = 0.0
    test_correct: float = 0.0
    test_images: float = 0.0
    measured_images: float = 0.0

    def vector(self) -> list[float]:
        return list(asdict(self).values())

    @classmethod
    def from_vector(cls, values) -> EpochSums:
        return cls(*[float(v) for v in values])


def epoch_sizes(config: RunConfig, dataset, world: int) -> tuple[int, int, int]:
    """Training images, test images and optimizer steps per epoch of a run
    (``train_images``, ``test_images``, ``max_steps`` and the global batch)."""
    from frameworks import data

    n_train = min(config["train_images"] or len(dataset.train_y), len(dataset.train_y))
    n_test = min(config["test_images"] or len(dataset.test_y), len(dataset.test_y))
    steps = data.steps_per_epoch(n_train, world, config["batch_size"], config["max_steps"])
    if steps == 0:
        raise RunError(
            f"batch_size {config['batch_size']} x {world} processes exceeds the "
            f"{n_train} training images: no step fits in an epoch"
        )
    return n_train, n_test, steps


def evaluates(config: RunConfig, epoch: int) -> bool:
    """Whether an epoch ends with an evaluation: every eval_every epochs, and the last."""
    return epoch % config["eval_every"] == 0 or epoch == config["epochs"]


def epoch_row(
    epoch: int, wall_s: float, sums: EpochSums, measured_s: float, elapsed_s: float
) -> dict:
    """One row of epochs.tsv from all-reduced sums and the slowest rank's
    times (measured steps; elapsed on the run clock)."""

    def ratio(a, b):
        return a / b if b else float("nan")

    return {
        "epoch": epoch,
        "wall_s": round(wall_s, 4),
        "train_loss": ratio(sums.train_loss, sums.train_images),
        "train_accuracy": ratio(sums.train_correct, sums.train_images),
        "test_loss": ratio(sums.test_loss, sums.test_images),
        "test_accuracy": ratio(sums.test_correct, sums.test_images),
        "images_per_s": ratio(sums.measured_images, measured_s),
        "measured_images": int(sums.measured_images),
        "measured_s": measured_s,
        "elapsed_s": round(elapsed_s, 4),
    }


def write_epochs(folder: Path, rows: list[dict]) -> None:
    ownership.guard_worker_write(folder)
    lines = ["\t".join(EPOCH_COLUMNS)]
    lines += ["\t".join(_fmt(row[c]) for c in EPOCH_COLUMNS) for row in rows]
    write_text(folder / EPOCHS, "\n".join(lines) + "\n")


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def summary(
    rows: list[dict],
    world: int,
    global_batch: int,
    lr: float,
    steps_per_epoch: int,
    init_s: float,
    clock: RunClock,
) -> dict:
    """The run's headline figures, written by rank 0 to metrics.json."""
    measured_images = sum(r["measured_images"] for r in rows)
    measured_s = sum(r["measured_s"] for r in rows)
    last = rows[-1]
    return {
        "world_size": world,
        "global_batch": global_batch,
        "learning_rate_scaled": lr,
        "steps_per_epoch": steps_per_epoch,
        "epochs_done": len(rows),
        "images_per_s": measured_images / measured_s if measured_s else None,
        "images_per_s_per_process": measured_images / measured_s / world if measured_s else None,
        "time_per_epoch_s": sum(r["wall_s"] for r in rows) / len(rows),
        "final_test_accuracy": last["test_accuracy"],
        "final_test_loss": last["test_loss"],
        "final_train_loss": last["train_loss"],
        "init_s": init_s,
        "clock_start_unix": clock.start_unix,
    }


def finish(
    adapter, run_dir: Path, phases, dist: Dist, versions: dict, params_digest: str, metrics: dict
) -> None:
    """What every loop does last: stop the energy sampler, write this rank's
    phases and record, rank 0 the run's figures, and leave the framework."""
    energy.stop_sampling()
    in_effect = adapter.knobs_in_effect()  # a knob not in effect fails the run here
    ownership.guard_worker_write(run_dir)  # an orphaned attempt writes nothing
    phases.write(run_dir, dist.rank)
    record = rank_record(dist, versions)
    record["knobs"] = in_effect
    record["params_digest"] = params_digest
    write_json(run_dir / names.rank_record(dist.rank), record)
    if dist.rank == 0:
        write_json(run_dir / METRICS, metrics)
    adapter.shutdown()


def built_versions(label: str) -> dict:
    """What an envs/build-*.sh script recorded next to the environment this
    process runs in (``sys.prefix/versions.json``: its parts, refs and
    commits), as ``<label>_<part>`` entries for the rank record."""
    record = Path(sys.prefix) / "versions.json"
    if not record.exists():
        return {}
    found = json.loads(record.read_text())
    return {f"{label}_{k}": v for k, v in found.items() if k != "built_by"}


def rank_record(dist: Dist, versions: dict) -> dict:
    """What each rank says of itself: where it ran and with what."""
    return {
        "rank": dist.rank,
        "local_rank": dist.local_rank,
        "world": dist.world,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu.this_machine(),
        **where_it_ran(),
        **versions,
    }


def where_it_ran() -> dict:
    """The cores this process could run on (its affinity, read back from the
    kernel: a cpuset or taskset of the node confines it), the threads its
    framework's compute pool uses, and the threads the process has now."""
    return {
        "cpus": sorted(os.sched_getaffinity(0)),
        "compute_threads": _compute_threads(),
        "os_threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self") else None,
    }


def _compute_threads() -> int | None:
    """The threads that can run the step's kernels at once: torch's intra-op
    pool; TensorFlow's larger of its intra-op and inter-op pools (0 there
    means its default, one per core), since with one intra-op thread each
    kernel runs on an inter-op thread, and the harness keeps two of those
    (tf_family.configure_tensorflow): at ``threads: 1`` two kernels of a
    step (backward's) run at once, on two cores (docs/improvements.md, "The
    patch where a core is free"), one with ``inter_op_threads: 1``; else
    OMP_NUM_THREADS."""
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    if "tensorflow" in sys.modules:
        threading = sys.modules["tensorflow"].config.threading
        cores = len(os.sched_getaffinity(0))
        pools = (
            threading.get_intra_op_parallelism_threads(),
            threading.get_inter_op_parallelism_threads(),
        )
        return max(pool or cores for pool in pools)
    text = os.environ.get("OMP_NUM_THREADS", "")
    return int(text) if text.isdigit() else None
