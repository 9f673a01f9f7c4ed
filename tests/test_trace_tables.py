"""The report's table of imported traces: seconds of each phase are the time
its intervals cover, not the sum of nested intervals."""

from pathlib import Path

import pandas as pd
import pytest

from analysis.trace_tables import covered_seconds
from traces import readers
from traces.rules import PhaseRules

DDP = Path(__file__).parent / "data" / "real-traces" / "kineto-gloo-ddp-np2" / "rank0.json.gz"


def test_phase_seconds_are_covered_time_not_nested_sums():
    """A DDP trace's forward records nest (DDP.forward > module > aten ops):
    their sum is several times the forward's time, more than the whole
    trace spans; the covered time is at most the span, and at least the
    longest forward record."""
    table = readers.read(DDP, PhaseRules(), "ddp")[0].to_pandas()
    forward = table[table["phase"] == "forward"]
    span = (table["end_ns"].max() - table["start_ns"].min()) / 1e9
    assert forward["dur_ns"].sum() / 1e9 > span  # what the table showed
    seconds = covered_seconds(table).loc[("ddp", "kineto"), "forward"]
    assert forward["dur_ns"].max() / 1e9 <= seconds <= span


def test_covered_time_joins_overlaps_and_keeps_gaps_and_ranks_apart():
    rows = [  # rank, phase, start, end (ns)
        (0, "forward", 0, 100),
        (0, "forward", 10, 50),  # nested
        (0, "forward", 90, 150),  # overlapping
        (0, "forward", 200, 210),  # after a gap
        (0, "backward", 0, 1000),  # another phase: its own
        (1, "forward", 0, 100),  # another rank: summed
        (1, "step", 0, 5000),  # a marker: no phase
    ]
    table = pd.DataFrame(rows, columns=["rank", "phase", "start_ns", "end_ns"])
    table = table.assign(run_id="r", source="kineto")
    seconds = covered_seconds(table).loc[("r", "kineto")]
    assert seconds.to_dict() == pytest.approx({"forward": 260e-9, "backward": 1000e-9})


def test_covered_time_is_exact_at_epoch_nanoseconds():
    """Traces' times are nanoseconds since 1970, beyond a double's 256 ns
    steps there: a gap of 20 ns between two intervals is kept (the
    furthest end so far, shifted by a row, became a double and swallowed
    it: the covered time was off by up to some hundred ns a phase)."""
    at = 1_712_195_495_520_023_040  # a multiple of 256: 100 and 120 ns after it round to it
    rows = [(0, "grad_comm", at, at + 100), (0, "grad_comm", at + 120, at + 300)]
    table = pd.DataFrame(rows, columns=["rank", "phase", "start_ns", "end_ns"])
    table = table.assign(run_id="r", source="kineto")
    covered = covered_seconds(table).loc[("r", "kineto"), "grad_comm"]
    assert round(covered * 1e9) == 280
