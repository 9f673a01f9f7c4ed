"""LBANN's per-step phases, from its timeline callback.

``CallbackTimeline(directory=...)`` (src/callbacks/timeline.cpp) times, on
every rank, each training step's forward pass of every layer (``fp-<layer>``),
its backward pass (``bp-<layer>``) and the optimizer's update of every weight
tensor (``opt-<weights>``), and writes them at the end of training to
``timeline.m<trainer>.<rank>.txt``, one ``kind-name:start:end`` line per
interval, in seconds since training began (after a barrier of all ranks).

The phases of a step, in the common vocabulary:
- ``data_load``: the forward pass of the input layers, which take the next
  mini-batch from LBANN's background reader;
- ``forward``: the forward pass of every other layer (loss included);
- ``backward``: the backward pass of every layer;
- ``optimizer``: the weight updates. The gradient exchange has no phase of
  its own (no ``grad_comm``): LBANN starts each weight tensor's all-reduce
  (MPI_Iallreduce) when the backward pass has its gradient and keeps one in
  flight, so starting the next waits for the one before
  (include/lbann/optimizers/optimizer_impl.hpp, start_sync). Most of the
  exchange is in ``backward``, the last all-reduce's wait in ``optimizer``;
- ``other``: the rest of the step (callbacks, the metrics).

The timeline's times are printed with 6 significant digits: a resolution of
0.1 ms in the first 100 s of training, 1 ms up to 1000 s. Errors of rounding
cancel out in means over many steps, not in one step.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from runfiles import names
from runfiles.phases import PHASES

# the names the driver gives the input layers (frameworks/lbann_family.build_model)
INPUT_LAYERS = ("input_samples", "input_labels")
LINE = re.compile(r"^(fp|bp|opt)-(.+):([^:]+):([^:]+)$")
FILE = re.compile(r"^timeline\.m0\.(\d+)\.txt$")  # trainer 0, the rank in it


class TimelineError(ValueError):
    """A timeline file that cannot be read as LBANN writes it."""


def read(text: str) -> dict[tuple[str, str], np.ndarray]:
    """(kind, name) -> (n, 2) array of (start, end) seconds, in the order
    LBANN wrote them (one per training step)."""
    intervals: dict[tuple[str, str], list] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        match = LINE.match(line)
        if match is None:
            raise TimelineError(f"line {number} is not 'kind-name:start:end': {line[:80]!r}")
        kind, name, start, end = match.groups()
        try:
            intervals.setdefault((kind, name), []).append((float(start), float(end)))
        except ValueError:
            raise TimelineError(
                f"line {number} has a time that is no number: {line[:80]!r}"
            ) from None
    return {key: np.asarray(values, dtype=float) for key, values in intervals.items()}


def rank_files(folder: Path) -> dict[int, Path]:
    """rank -> its timeline file, for the ranks that wrote one."""
    found = {}
    for path in folder.glob("timeline.m0.*.txt"):
        match = FILE.match(path.name)
        if match:
            found[int(match[1])] = path
    return found


def counted_steps(intervals: dict[tuple[str, str], np.ndarray]) -> dict:
    """Every series cut to the steps that every layer and every weight
    tensor has an interval of."""
    steps = min((len(a) for a in intervals.values()), default=0)
    return {key: a[:steps] for key, a in intervals.items()}


def phase_of(kind: str, name: str) -> str:
    if kind == "fp":
        return "data_load" if name in INPUT_LAYERS else "forward"
    return "backward" if kind == "bp" else "optimizer"


def step_rows(
    intervals: dict[tuple[str, str], np.ndarray], steps_per_epoch: int, origin_ns: int
) -> list[tuple]:
    """The rows of steps.rank<r>.tsv (runfiles.phases.PhaseRecorder.steps:
    epoch, step, start_ns, end_ns, a duration per phase, comm_bytes), on a
    clock where training began at ``origin_ns``, for the counted steps."""
    cut = counted_steps(intervals)
    if not any(kind == "fp" for kind, _ in cut):
        return []
    every = np.stack(list(cut.values()))  # (series, steps, 2)
    start, end = every[:, :, 0].min(axis=0), every[:, :, 1].max(axis=0)
    durations = {phase: np.zeros(len(start)) for phase in PHASES}
    for (kind, name), a in cut.items():
        durations[phase_of(kind, name)] += a[:, 1] - a[:, 0]
    durations["other"] = np.clip((end - start) - sum(durations.values()), 0, None)
    columns = [np.round(durations[phase] * 1e9).astype(np.int64) for phase in PHASES]
    start_ns = origin_ns + np.round(start * 1e9).astype(np.int64)
    end_ns = origin_ns + np.round(end * 1e9).astype(np.int64)
    return [
        (
            k // steps_per_epoch + 1,
            k,
            int(start_ns[k]),
            int(end_ns[k]),
            *(int(c[k]) for c in columns),
            "",
        )
        for k in range(len(start))
    ]


def phase_intervals(
    intervals: dict[tuple[str, str], np.ndarray], steps_per_epoch: int, origin_ns: int
) -> list[tuple]:
    """Every layer's and weight tensor's interval of the counted steps as
    (phase, epoch, step, start_ns, end_ns), what an event tracer keeps."""
    rows = []
    for (kind, name), times in counted_steps(intervals).items():
        phase = phase_of(kind, name)
        ns = origin_ns + np.round(times * 1e9).astype(np.int64)
        rows += [
            (phase, k // steps_per_epoch + 1, k, int(start), int(end))
            for k, (start, end) in enumerate(ns)
        ]
    return rows


def training_began_ns(path: Path, last_s: float, after_s: float) -> int:
    """When training began, on this host's perf_counter_ns clock. LBANN
    gives its times only relative to that moment, and writes the file when
    training ends: ``after_s`` (the last epoch's evaluation) after the last
    interval, which ended ``last_s`` into training. The file's time (wall
    clock) is taken onto the monotonic clock that perf_counter_ns reads: an
    estimate to within the time LBANN takes to write the file."""
    wall_to_monotonic = time.time_ns() - time.perf_counter_ns()
    written = path.stat().st_mtime_ns - wall_to_monotonic
    return written - round((last_s + after_s) * 1e9)


def last_end_s(intervals: dict[tuple[str, str], np.ndarray]) -> float:
    return max(float(a[:, 1].max()) for a in intervals.values() if len(a))


def layer_means(intervals: dict[tuple[str, str], np.ndarray], skip: int = 0) -> list[tuple]:
    """(mean seconds per step, kind, name) of every series after the first
    ``skip`` steps, longest first: where an LBANN step's time goes."""
    rows = [
        (float((a[skip:, 1] - a[skip:, 0]).mean()), kind, name)
        for (kind, name), a in intervals.items()
        if len(a) > skip
    ]
    return sorted(rows, reverse=True)


def main(argv: list[str] | None = None) -> int:
    """python -m frameworks.lbann_timeline RUN_DIR [WARMUP_STEPS]: each
    rank's layers and weight updates by their mean time per step."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m frameworks.lbann_timeline RUN_DIR [WARMUP_STEPS]", file=sys.stderr)
        return 2
    run_dir, skip = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 0
    files = rank_files(run_dir / names.LBANN_DIR)
    if not files:
        print(
            f"error: {run_dir / 'lbann'}: no timeline.m0.<rank>.txt (an LBANN run's)",
            file=sys.stderr,
        )
        return 1
    for rank, path in sorted(files.items()):
        try:
            means = layer_means(read(path.read_text()), skip)
        except TimelineError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 1
        print(
            f"rank {rank}: {sum(m for m, _, _ in means) * 1e3:.2f} ms per step in layers and updates"
        )
        for seconds, kind, name in means:
            print(f"  {kind:3s} {name:24s} {seconds * 1e3:9.3f} ms  {phase_of(kind, name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
