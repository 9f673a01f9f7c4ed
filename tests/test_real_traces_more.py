"""Real traces the converter had not seen (tests/data/real-traces/, see its
README) and damaged copies of them and of the shared fixtures: every record
that reads is kept, counts match an independent count of the JSON or of
otf2-print, and what was lost exits non-zero with one line, no traceback."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_traces_readers import FIXTURES, needs_fixtures, otf2_copy
from traces import fastotf2
from traces.readers import otf2_reader
from traces.rules import PhaseRules

RULES = PhaseRules()
REAL = Path(__file__).parent / "data" / "real-traces"


def convert_cli(*paths: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traces.convert", *map(str, paths), "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_fixtures
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_first_rank_with_no_interval_keeps_the_others(tmp_path, monkeypatch, workers):
    """The C reader's threads each fill a stretch of shared columns; when the
    first stretch holds no row (rank 0's event file empty or cut before its
    first Leave), the next ones must still be moved into place, not left as
    uninitialised memory (it gave garbage rows and a traceback)."""
    archive = otf2_copy(tmp_path)
    (archive / "traces" / "0.evt").write_bytes(b"")
    anchor = archive / "traces.otf2"
    read_intervals = fastotf2.read_intervals
    monkeypatch.setattr(
        fastotf2, "read_intervals", lambda *a: read_intervals(*a, workers=workers)
    )
    fast, fast_problems = otf2_reader.read(anchor, RULES, "r1", engine="fastotf2")
    slow, slow_problems = otf2_reader.read(anchor, RULES, "r1", engine="python")
    fast, slow = fast.to_pandas(), slow.to_pandas()
    assert len(fast) == len(slow) == 21  # rank 1's intervals (otf2-print: 21 Leave)
    assert set(fast["rank"]) == {1} and (fast["region"] == "MPI_Send").sum() == 8
    assert fast.drop(columns="op_id").equals(slow.drop(columns="op_id"))
    assert "MPI Rank 0/Master thread" in fast_problems[0] and fast_problems[0].lost
    monkeypatch.undo()
    done = convert_cli(anchor, out=tmp_path / "phases.parquet")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "21 rows" in done.stdout
