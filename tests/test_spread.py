"""The spread section on a constructed run whose step times are known, its
links, and the one wait figure quoted alike by the bottlenecks and the
critical path."""

import pandas as pd
import pytest
from test_bottlenecks import constructed

from analysis import bottlenecks, critical_path, spread
from analysis.section import Section


def test_step_time_distribution_per_cell():
    phases, runs = constructed()  # steps of 60 ms (rank 2 late) and 40 ms, alternately
    runs = runs.assign(images_per_s=1000.0, init_s=4.5)
    row = spread.table(runs, phases).iloc[0]
    assert row["init_s"] == 4.5  # start-up beside the step
    assert row["steps"] == 40 * 4 and row["runs"] == 1
    assert row["step_median_s"] == pytest.approx(0.050)
    assert row["step_p95_s"] == pytest.approx(0.060)
    assert row["step_slowest_s"] == pytest.approx(0.060)
    assert row["p95_over_median"] == pytest.approx(1.2)
    assert pd.isna(row["throughput_cv_share"])  # one run: no run-to-run variation


def test_links_to_runs_traces_and_the_merged_timeline(tmp_path):
    root = "d/cfg~1"
    runs = pd.DataFrame(
        [
            {
                "run_id": f"r{rep}",
                "path": f"{root}/framework~f/procs_per_node~2/rep~{rep}",
                "status": status,
                "rep": rep,
                "framework": "f",
                "world_size": 2,
                "batch_size": 64,
            }
            for rep, status in ((1, "ok"), (2, "failed"))
        ]
    )
    (tmp_path / "framework~f/procs_per_node~2/rep~1/trace").mkdir(parents=True)
    (tmp_path / "tables").mkdir()
    (tmp_path / spread.TIMELINE).write_text("{}")
    text = Section("spread", "Spread").items(spread.links(runs, root, tmp_path)).html()
    assert '<a href="framework~f/procs_per_node~2/rep~1/">rep 1</a> (ok' in text
    assert '<a href="framework~f/procs_per_node~2/rep~1/trace">trace</a>' in text
    assert f'in the <a href="{spread.TIMELINE}">merged timeline</a>' in text
    # a run that left no folder is named, not linked
    assert ", rep 2 (failed)" in text and "rep 2</a>" not in text


def test_the_wait_is_one_figure_everywhere():
    phases, runs = constructed()
    path = critical_path.cell_table(critical_path.analyse(phases, runs), runs)
    found = bottlenecks.findings(phases, runs).set_index("bottleneck")
    waited_ms = path["waiting_ms_per_step"].iloc[0]
    # rank 2 is 20 ms late every other step: the 3 others wait 20 ms, it waits 0
    assert waited_ms == pytest.approx(20 * 3 / 4 / 2)
    assert found.loc[bottlenecks.WAIT, "value"] == pytest.approx(waited_ms / 1e3)
    assert "7.5 ms" in found.loc[bottlenecks.WAIT, "finding"]
    assert "7.5 ms" in critical_path.sentence(path.iloc[0].to_dict())
