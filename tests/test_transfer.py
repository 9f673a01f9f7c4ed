"""Where the ranking holds (analysis/transfer.py), on constructed runs tables
whose answer is known: the same order at every level, a change of order
within the noise, a significant reversal (across CPUs, as when results of
two machines are collected together), and nothing said where no other
factor varies."""

import numpy as np
import pandas as pd

from analysis import summary, transfer

CPU_A = "AMD EPYC (AuthenticAMD family 25 model 1 stepping 1), avx2, virtual machine"
CPU_B = "Intel Xeon Gold 6130 (GenuineIntel family 6 model 85 stepping 4), avx512f"


def runs_table(cells: dict, spread: float = 2.0, seed: int = 7) -> pd.DataFrame:
    """cells: (framework, procs, batch_size, cpu) -> mean images_per_s; five
    replications each, normal noise of ``spread``."""
    rng = np.random.default_rng(seed)
    rows = []
    for (framework, procs, batch, cpu), mean in cells.items():
        for rep, value in enumerate(mean + rng.normal(0, spread, 5), start=1):
            rows.append(
                {
                    "run_id": f"{framework}-{procs}-{batch}-{cpu[:3]}-{rep}",
                    "status": "ok",
                    "framework": framework,
                    "nodes": 1,
                    "procs_per_node": procs,
                    "world_size": procs,
                    "batch_size": batch,
                    "cpu": cpu,
                    "images_per_s": value,
                    "time_to_accuracy_s": np.nan,
                    "rep": rep,
                }
            )
    return pd.DataFrame(rows)


def test_the_same_order_at_every_level_is_said_to_hold():
    runs = runs_table(
        {
            ("ddp", 1, 64, CPU_A): 300,
            ("hvd", 1, 64, CPU_A): 200,
            ("ddp", 2, 64, CPU_A): 500,
            ("hvd", 2, 64, CPU_A): 350,
        }
    )
    (said,) = transfer.sentences(runs)
    assert said == (
        "Scale (1 node x 1 process, 1 node x 2 processes): the same order of frameworks at "
        "every level (ddp > hvd)."
    )


def test_a_change_of_order_within_the_noise_is_no_reversal():
    runs = runs_table(
        {
            ("ddp", 1, 64, CPU_A): 301,
            ("hvd", 1, 64, CPU_A): 300,
            ("ddp", 1, 256, CPU_A): 300,
            ("hvd", 1, 256, CPU_A): 301,
        },
        spread=10.0,
    )
    (said,) = transfer.sentences(runs)
    assert said.startswith("batch_size (64, 256): the order changes (64: ")
    assert said.endswith(
        "Within the noise: no pair of frameworks is significantly ahead at one level and "
        "significantly behind at another."
    )


def test_a_ranking_that_reverses_on_another_cpu_is_said_not_to_hold():
    runs = runs_table(
        {
            ("ddp", 2, 64, CPU_A): 300,
            ("hvd", 2, 64, CPU_A): 200,
            ("tnt", 2, 64, CPU_A): 100,
            ("ddp", 2, 64, CPU_B): 200,
            ("hvd", 2, 64, CPU_B): 300,
            ("tnt", 2, 64, CPU_B): 100,
        }
    )
    (said,) = transfer.sentences(runs)
    assert said.startswith(f"CPU ({CPU_A}; {CPU_B}): the order changes (")
    assert f"{CPU_A}: ddp > hvd > tnt; {CPU_B}: hvd > ddp > tnt" in said
    assert (
        f"The ranking reverses: ddp significantly ahead of hvd at {CPU_A} (Holm-adjusted p" in said
    )
    assert f"behind it at {CPU_B}" in said
    # and the summary says it after its rankings
    assert said in summary.build(runs, pd.DataFrame()).holds


def test_a_framework_missing_at_a_level_is_left_out_of_that_comparison():
    runs = runs_table(
        {
            ("ddp", 1, 64, CPU_A): 300,
            ("hvd", 1, 64, CPU_A): 200,
            ("tnt", 1, 64, CPU_A): 250,
            ("ddp", 2, 64, CPU_A): 500,
            ("hvd", 2, 64, CPU_A): 350,
        }
    )
    (said,) = transfer.sentences(runs)
    assert "(ddp > hvd)" in said and "tnt" not in said


def test_nothing_is_said_where_no_other_factor_varies_or_one_framework_ran():
    one_scale = runs_table({("ddp", 2, 64, CPU_A): 300, ("hvd", 2, 64, CPU_A): 200})
    assert transfer.sentences(one_scale) == []
    one_framework = runs_table({("ddp", 1, 64, CPU_A): 300, ("ddp", 2, 64, CPU_A): 500})
    assert transfer.sentences(one_framework) == []
    failed = one_scale.assign(status="failed")
    assert transfer.sentences(failed) == []
