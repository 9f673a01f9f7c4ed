"""The hang watch between epochs (ddlcompare/run/stall.py) on epochs.tsv
files written as rank 0 writes them, their age set by hand; the real hang,
a rank stopped mid-run, is in tests/test_faults.py."""

import os

import pytest

from ddlcompare.run import stall
from frameworks.recorder import PhaseRecorder
from runfiles import names

HEADER = "\t".join(names.EPOCH_COLUMNS)


def epochs_file(tmp_path, walls: list[float], age_s: float, torn: bool = False):
    rows = [
        "\t".join(str(wall if c == "wall_s" else 1) for c in names.EPOCH_COLUMNS) for wall in walls
    ]
    if torn:
        rows.append("3\t")
    path = tmp_path / "epochs.tsv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    written = path.stat().st_mtime
    os.utime(path, (written - age_s, written - age_s))
    return path, written


@pytest.mark.parametrize(
    "walls, age_s, hung",
    [
        ([3.5], 119, False),  # the floor: 120 s
        ([3.5], 121, True),
        ([20.0, 30.0], 299, False),  # 10 times the slowest epoch so far
        ([20.0, 30.0], 301, True),
        ([3.5, 3.4, 3.6, 3.5, 3.5], 10_000, False),  # every epoch done: writing its outputs
        ([], 10_000, False),  # no epoch yet: start-up is the timeout's
    ],
)
def test_a_silence_counts_as_a_hang_only_between_epochs_and_past_its_limit(
    tmp_path, walls, age_s, hung
):
    path, now = epochs_file(tmp_path, walls, age_s)
    said = stall.EpochWatch(path, epochs=5, floor_s=120).stalled(now)
    assert bool(said) == hung, said
    if hung:
        assert said.startswith(f"stalled: no epoch ended in {age_s} s after epoch {len(walls)}")


def test_no_file_and_a_half_written_row_are_no_hang(tmp_path):
    watch = stall.EpochWatch(tmp_path / "epochs.tsv", epochs=5, floor_s=1)
    assert watch.stalled() is None
    path, now = epochs_file(tmp_path, [1.0, 1.0], age_s=60, torn=True)
    assert watch.stalled(now) is None  # read again at the next rewrite


def test_a_bad_floor_is_named_with_its_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DDLC_STALL_FLOOR_S", "two minutes")
    with pytest.raises(RuntimeError, match="DDLC_STALL_FLOOR_S='two minutes' is not a number"):
        stall.EpochWatch(tmp_path / "epochs.tsv", epochs=5)
    monkeypatch.setenv("DDLC_STALL_FLOOR_S", "30")
    assert stall.EpochWatch(tmp_path / "epochs.tsv", epochs=5).limit_s() == 30


@pytest.mark.parametrize(
    "beats, hung",
    [
        ([], False),  # no rank has ended a step: start-up is the timeout's
        ([119, 400], False),  # a rank beat 119 s ago: within the floor
        ([121, 400], True),  # every rank silent past the floor, inside epoch 1
    ],
)
def test_inside_the_first_epoch_the_ranks_heartbeats_are_watched(tmp_path, beats, hung):
    """No epochs.tsv yet: the newest of the ranks' heartbeats decides."""
    for rank, age in enumerate(beats):
        path = tmp_path / f"progress.rank{rank}"
        path.write_text("0 7\n")
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    said = stall.EpochWatch(tmp_path / "epochs.tsv", epochs=5, floor_s=120).stalled(1_000_000)
    assert bool(said) == hung, said
    if hung:
        assert said.startswith("stalled: no step ended in 121 s inside epoch 1 of 5")


def test_evaluation_inside_the_first_epoch_is_no_hang(tmp_path):
    """Evaluation ends no step, and on a slow model it outlasts the floor
    (ResNet-34 on a CPU: 8.6 s per 256 test images, docs/resnet34.md): a
    rank's recorder says it evaluates in its heartbeat, and the watch waits."""
    recorder = PhaseRecorder()
    recorder.heartbeat = tmp_path / names.progress(0)
    recorder.begin_epoch(1)
    recorder.begin_step(1, 0)
    recorder.end_step()
    watch = stall.EpochWatch(tmp_path / "epochs.tsv", epochs=5, floor_s=120)
    later = recorder.heartbeat.stat().st_mtime + 121
    assert watch.stalled(later)  # silent after a step: a hang
    with recorder.evaluation():
        assert watch.stalled(recorder.heartbeat.stat().st_mtime + 121) is None
