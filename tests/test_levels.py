"""A framework's own setting, level by level (analysis/levels.py): on
constructed tables where the answer is known (a level truly faster is
found, equal levels claim nothing, loaded runs are left out and counted)
and on the real pause sweep's runs table (tests/data/tarantella-pause-sweep)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import levels, report, summary
from analysis.page import Context
from ddlcompare.plan import design

SWEEP = Path(__file__).parent / "data" / "tarantella-pause-sweep" / "runs.parquet"
DESIGNS = Path(__file__).parents[1] / "designs"
PLAIN, PATCHED, PAUSE = "tarantella", "tarantella-patched", "gaspi_sweep_pause_us"


def runs_table(steps: dict, loaded: dict | None = None) -> pd.DataFrame:
    """steps: level (None: the plain build) -> step times in s, one a run;
    loaded: level -> how many of its first runs were loaded."""
    rows = []
    for level, values in steps.items():
        for rep, step in enumerate(values, start=1):
            rows.append(
                {
                    "run_id": f"{level}-{rep}",
                    "rep": rep,
                    "status": "ok",
                    "framework": PLAIN if level is None else PATCHED,
                    PAUSE: level,
                    "nodes": 1,
                    "procs_per_node": 1,
                    "world_size": 1,
                    "batch_size": 128,
                    "step_mean_s_slowest_rank": step,
                    "images_per_s": 128 / step,
                    "loaded": rep <= (loaded or {}).get(level, 0),
                    "cores_per_rank": 2,
                    "runnable_per_core": 0.5,
                    "network": "this machine's own (eth0)",
                    "device": "cpu",
                    "cpu": "Some CPU, avx2",
                }
            )
    return pd.DataFrame(rows)


def noisy(rng, mean: float, n: int = 5, cv: float = 0.03) -> list[float]:
    return list(mean * np.exp(rng.normal(0, cv, n)))


def test_a_level_truly_faster_is_found_and_one_equal_to_the_baseline_is_not():
    rng = np.random.default_rng(41)
    runs = runs_table(
        {
            None: noisy(rng, 0.100),
            0: noisy(rng, 0.100),
            10: noisy(rng, 0.070),
            50: noisy(rng, 0.070),
        }
    )
    found, compared = levels.tables(runs)
    assert list(found["level"]) == [PLAIN, "0", "10", "50"]  # the baseline first, then numbers
    base = compared[compared["role"] == levels.BASELINE].set_index("level")
    assert base.loc["10", "significant"] == "yes" and base.loc["50", "significant"] == "yes"
    assert base.loc["10", "step_change"] == pytest.approx(-0.3, abs=0.05)
    assert base.loc["10", "step_change_low"] < -0.3 < base.loc["10", "step_change_high"] + 0.05
    assert base.loc["0", "significant"] == "no"
    # The fastest level against the others: 0 is slower, 10 and 50 are not told apart.
    fastest = compared[compared["role"] == levels.FASTEST].set_index("level")
    assert len(fastest) == 2 and fastest["against"].iloc[0].startswith(("10", "50"))
    slower = "0"
    assert fastest.loc[slower, "significant"] == "yes"
    assert (fastest.drop(index=slower)["significant"] == "no").all()
    # Holm over all 6 comparisons together.
    smallest = compared.loc[compared["p_raw"].idxmin()]
    assert smallest["p_adjusted"] == pytest.approx(min(1, smallest["p_raw"] * len(compared)))


def test_equal_levels_claim_nothing():
    """A/A: every level and the baseline drawn from one distribution. No
    claim on a fixed draw, and family-wise at most about 5 % over many."""
    rng = np.random.default_rng(7)
    same = {None: noisy(rng, 0.1), 0: noisy(rng, 0.1), 10: noisy(rng, 0.1), 50: noisy(rng, 0.1)}
    _, compared = levels.tables(runs_table(same))
    assert len(compared) == 5 and (compared["significant"] == "no").all()
    # 60 draws (statsmodels' Holm collects garbage at each call: 0.2-0.5 s):
    # 3 expected at 5 %, 5 allowed; without Holm's correction 7 of these claim.
    claims = 0
    for _ in range(60):
        steps = {level: noisy(rng, 0.1, n=3) for level in (None, 0, 10, 50)}
        _, compared = levels.tables(runs_table(steps))
        claims += bool((compared["significant"] == "yes").any())
    assert claims <= 5


def test_loaded_runs_are_left_out_and_counted_and_conditions_said():
    rng = np.random.default_rng(3)
    steps = {None: noisy(rng, 0.1, 3), 10: noisy(rng, 0.07, 3), 50: noisy(rng, 0.07, 3)}
    steps[50][0] = 0.5  # beside heavy foreign load
    found, compared = levels.tables(runs_table(steps, loaded={50: 1}))
    fifty = found.set_index("level").loc["50"]
    assert fifty["runs"] == 2 and fifty["step_ms"] == pytest.approx(70, rel=0.1)
    assert fifty["loaded_runs"] == "1 loaded run left out"
    [said] = levels.sentences(found, compared)
    for words in (
        "1 node x 1 process",
        "2 cores a rank could use",
        "a core free beside the compute threads",
        "network: this machine's own (eth0)",
        "device cpu",
        "CPU Some CPU, avx2",
        "2 to 3 runs a level, 1 loaded run left out",
        "step time against tarantella",
    ):
        assert words in said
    # The baseline's runs on another CPU: said before the figures.
    other = runs_table(steps, loaded={50: 1})
    other.loc[other[PAUSE].isna(), "cpu"] = "Other CPU, avx512f"
    [said] = levels.sentences(*levels.tables(other))
    mixed = "measured on 2 different CPUs (Other CPU, avx512f; Some CPU, avx2): figures compared"
    assert mixed in said and said.index(mixed) < said.index("step time against")
    # Too few clean runs: all kept, and said.
    found, _ = levels.tables(runs_table(steps, loaded={50: 2}))
    assert found.set_index("level").loc["50", "runs"] == 3
    assert "kept (too few clean runs a level)" in found["loaded_runs"].iloc[0]


def test_the_summary_compares_the_levels_instead_of_ranking_cells_of_one_framework():
    rng = np.random.default_rng(5)
    runs = runs_table({None: noisy(rng, 0.1), 0: noisy(rng, 0.1), 10: noisy(rng, 0.07)})
    result = summary.build(runs, pd.DataFrame())
    assert not any("only tarantella-patched ran" in line for line in result.headlines)
    [folded] = result.headlines
    assert folded.startswith("Throughput: 3 cells hold one framework only")
    assert levels.HEADING in folded
    [level_line] = result.levels
    assert level_line.startswith("tarantella-patched's gaspi_sweep_pause_us at 1 node x 1 process")
    assert "level 10 -" in level_line and "significant, Holm-adjusted p" in level_line


def test_no_level_section_where_frameworks_meet_in_every_cell():
    rng = np.random.default_rng(9)
    runs = runs_table({None: noisy(rng, 0.1)})
    other = runs.assign(framework="torch-ddp", run_id=runs["run_id"] + "-ddp")
    found, compared = levels.tables(pd.concat([runs, other], ignore_index=True))
    assert found.empty and compared.empty


def test_the_real_pause_sweep():
    """The lead's by-hand table in docs/improvements.md ("The pause swept in
    training"): the same means over the clean runs, 2 loaded runs left out,
    pause 0 as the plain build, 50 us faster than plain on two one-core nodes."""
    runs = pd.read_parquet(SWEEP)
    found, compared = levels.tables(runs)
    means = found.set_index(["nodes", "level"])["step_ms"].round(1)
    assert means[1].to_dict() == {PLAIN: 98.8, "0": 100.9, "10": 71.6, "50": 71.0, "200": 71.7}
    assert means[2].to_dict() == {PLAIN: 184.6, "0": 187.0, "10": 115.7, "50": 111.8, "200": 112.0}
    assert set(found.loc[found["nodes"] == 1, "loaded_runs"]) == {"2 loaded runs left out"}
    assert set(found.loc[found["nodes"] == 2, "loaded_runs"]) == {""}
    base = compared[compared["role"] == levels.BASELINE].set_index(["nodes", "level"])
    assert (base.xs("0", level="level")["significant"] == "no").all()
    assert base.loc[(2, "50"), "significant"] == "yes"
    assert base.loc[(1, "10"), "step_change"] == pytest.approx(0.73 - 1, abs=0.005)
    said = levels.sentences(found, compared)
    assert len(said) == 2 and "every core taken by compute threads" in said[1]
    assert "emulated 1000 Mbit/s" in said[1] and "1 core a rank could use" in said[1]


def test_the_section_renders_the_real_sweep_and_says_why_where_there_is_nothing(tmp_path):
    ctx = Context(
        design=design.load(DESIGNS / "tarantella-pause-sweep.yaml"),
        runs=pd.read_parquet(SWEEP),
        step_phases=pd.DataFrame(),
        tables=tmp_path,
    )
    page, [built] = report.render(ctx, [levels.section])
    assert "<h2>A framework&#39;s own setting, level by level</h2>" in page
    assert "Holm-adjusted over all 14 comparisons" in page
    assert page.count("tarantella-patched&#39;s gaspi_sweep_pause_us at ") == 2
    assert "2 loaded runs left out" in page and "nan" not in page
    assert "gaspi_sweep_pause_us" in built.blocks[-1].data["factor"].tolist()
    plain = Context(ctx.design, ctx.runs[ctx.runs["framework"] == PLAIN], pd.DataFrame(), tmp_path)
    page, _ = report.render(plain, [levels.section])
    assert "nothing to compare level by level" in page


def test_without_the_baseline_the_levels_are_compared_with_the_fastest_alone():
    rng = np.random.default_rng(11)
    runs = runs_table({0: noisy(rng, 0.1), 10: noisy(rng, 0.07), 50: noisy(rng, 0.07)})
    found, compared = levels.tables(runs)
    assert list(found["level"]) == ["0", "10", "50"]
    assert set(compared["role"]) == {levels.FASTEST} and len(compared) == 2
    [said] = levels.sentences(found, compared)
    assert "against tarantella" not in said and ": Fastest level " in said
