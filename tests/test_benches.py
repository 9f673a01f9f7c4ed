"""Every bench measures alone and says how alone it was: it holds the
host-wide measuring lock (bench/measuring.py) and prints the load beside
its figures, or its figures come from workflow runs (or run-one's), which hold the lock
themselves and record their load in run.json."""

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
NOT_MEASURING = {
    "measuring.py": "the helpers themselves",
    "fusion_rule.py": "reads measured results; times nothing",
    "bare_loop.py": "adapter_overhead.py's child, inside its hold",
    "improve_false_positives.py": "computes on synthetic runs; times nothing",
    "interval_coverage.py": "computes on synthetic runs; times nothing",
    "gaspi_ranks.py": "the GaspiCxx benches' launcher, inside their hold",
}


@pytest.mark.parametrize(
    "bench", sorted(p.name for p in BENCH.glob("*.py") if p.name not in NOT_MEASURING)
)
def test_a_bench_holds_the_machine_and_says_its_load(bench):
    text = (BENCH / bench).read_text()
    if "workflow_argv(" in text or 'cli("run-one"' in text:
        return  # its runs hold the lock and record their load
    assert "with holding_the_machine(" in text
    # its last line's load: load_fields(), or figures_line(), which adds it
    assert "load()" in text and ("load_fields()" in text or "figures_line(" in text)
