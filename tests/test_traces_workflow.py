"""The workflow converts each run's traces after the run and collects them;
a run whose trace is broken still gives a result, and the others go on."""

import pandas as pd
import pytest

from conftest import TABLES_ONLY, tiny_design, write_design
from test_workflow import snakemake


@pytest.mark.slow
def test_phase_tables_per_run_and_collected(tmp_path):
    write_design(tmp_path, tiny_design(procs=(1, 2)))  # tracer: otf2 is the default
    first = snakemake(tmp_path, *TABLES_ONLY)  # the tables are what it checks
    assert first.returncode == 0, first.stderr[-3000:]
    tables = next((tmp_path / "results").rglob("tables"))
    phases = pd.read_parquet(tables / "phases.parquet")
    runs = pd.read_parquet(tables / "runs.parquet")
    assert set(phases["run_id"]) == set(runs["run_id"])
    assert runs["trace_errors"].isna().all()
    steps = phases[phases["phase"] == "step"].groupby("run_id")["rank"].nunique()
    assert sorted(steps) == [1, 2]

    # Damage one run's trace: its table is redone with an error line, the
    # collection goes on with the other run.
    broken = min((tmp_path / "results").rglob("trace/traces/*.evt"), key=str)
    broken.write_bytes(broken.read_bytes()[:100])
    run_dir = broken.parent.parent.parent
    second = snakemake(tmp_path, "--forcerun", "phases", *TABLES_ONLY)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "error: " in (run_dir / "phases.log").read_text()
    assert "traces.otf2" in (run_dir / "phases.log").read_text()
    runs = pd.read_parquet(tables / "runs.parquet")
    damaged = runs[runs["trace_errors"].notna()]
    assert len(damaged) == 1 and "traces.otf2" in damaged["trace_errors"].iloc[0]
    # the damaged run keeps the rows its readable ranks and records give
    phases = pd.read_parquet(tables / "phases.parquet")
    assert set(phases["run_id"]) >= set(runs["run_id"]) - set(damaged["run_id"])
