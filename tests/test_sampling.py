"""Latin hypercube designs: the plan lists exactly the sampled points, each
crossed with every framework; every level is taken equally often; points
drawn twice run once; the cap counts the sample; bad input named in one line."""

import collections

import pytest
from pydoe import lhs

from conftest import ddlc, write_design
from ddlcompare.plan import design
from ddlcompare.plan.design import DesignError

BATCH = [16, 32, 64, 128]
RATES = [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
FRAMEWORKS = ["torch-ddp", "horovod-torch"]


def doc(**over):
    return {
        "name": "lhs",
        "design": "latin-hypercube",
        "samples": 8,
        "seed": 7,
        "replications": 2,
        # levels in no particular order: a coordinate picks them in increasing order
        "factors": {"framework": FRAMEWORKS, "batch_size": BATCH[::-1], "learning_rate": RATES},
        **over,
    }


def test_plan_lists_exactly_the_sampled_points_for_every_framework():
    d = design.parse(doc())
    # the sample drawn here, from pydoe and the design's seed, as the docs say
    unit = lhs(2, samples=8, seed=7)
    points = {(BATCH[int(u * 4)], RATES[int(v * 8)]) for u, v in unit}
    runs = d.runs()
    planned = collections.Counter(
        (r.factors["framework"], r.factors["batch_size"], r.factors["learning_rate"]) for r in runs
    )
    assert set(planned) == {(f, b, lr) for f in FRAMEWORKS for b, lr in points}
    assert set(planned.values()) == {2} and len(runs) == 8 * 2 * 2  # replications
    # the Latin property: each batch size twice, each learning rate once, per framework
    cells = [(b, lr) for f, b, lr in planned if f == "torch-ddp"]
    assert collections.Counter(b for b, _ in cells) == dict.fromkeys(BATCH, 2)
    assert sorted(lr for _, lr in cells) == RATES
    assert design.parse(doc()).runs() == runs  # the seed makes it reproducible
    assert {(r.factors["batch_size"], r.factors["learning_rate"]) for r in runs} != {
        (r.factors["batch_size"], r.factors["learning_rate"])
        for r in design.parse(doc(seed=8)).runs()
    }


def test_points_drawn_twice_run_once():
    # 8 samples of a 2 x 2 grid: at most 4 distinct points
    d = design.parse(
        doc(factors={"framework": ["torch-ddp"], "batch_size": [32, 64], "momentum": [0.0, 0.9]})
    )
    assert d.sample.samples == 8 and len(d.sample.points) == 4 and len(d.runs()) == 4 * 2
    assert "8 samples of batch_size, momentum, 4 distinct" in d.sample.describe(d.factors)[0]


def test_max_runs_counts_the_sample():
    # the full grid (2 x 4 x 8 = 64 cells x 2 = 128 runs) is over the cap, the sample (32) is not
    assert len(design.parse(doc(max_runs=40)).runs()) == 32
    with pytest.raises(DesignError, match=r"the plan has 16 cells x 2 replications = 32 runs"):
        design.parse(doc(max_runs=31))


@pytest.mark.parametrize(
    "over, message",
    [
        ({"samples": None}, "samples: design: latin-hypercube needs samples: N"),
        ({"samples": 1}, "an integer from 2 to 10000, got 1"),
        ({"design": "full"}, "samples: only with 'design: latin-hypercube'"),
        ({"factors": {"framework": FRAMEWORKS}}, "this design has none; use design: full"),
        ({"exclude": [{"batch_size": 16}]}, "exclude: cannot be combined with design: latin"),
    ],
)
def test_bad_samples_are_named(over, message):
    with pytest.raises(DesignError) as err:
        design.parse(doc(**over))
    assert any(message in p for p in err.value.problems), err.value.problems


def test_plan_shows_the_sample(tmp_path):
    out = ddlc("plan", "--design", str(write_design(tmp_path, doc())), "--no-check")
    assert out.returncode == 0, out.stderr
    assert (
        "latin hypercube: 8 samples of batch_size, learning_rate, crossed with every "
        "framework: 16 cells per replication" in out.stdout
    )
    assert "32 runs (16 cells x 2 replications)" in out.stdout


def test_report_allocates_no_variation_it_cannot_separate():
    """Each learning rate is sampled once, so batch_size and learning_rate
    are confounded: the full-factorial ANOVA would split the variation
    between them at random; the report says so instead."""
    import numpy as np
    import pandas as pd

    from types import SimpleNamespace

    from analysis import stats

    d = design.parse(doc())
    noise = np.random.default_rng(0).normal(size=len(d.runs()))
    runs = pd.DataFrame(
        [
            {**r.factors, "run_id": r.run_id, "status": "ok", "images_per_s": 100 + e}
            for r, e in zip(d.runs(), noise)
        ]
    )
    html = stats.section(SimpleNamespace(design=d, runs=runs)).html()
    assert "a Latin hypercube leaves most cells of the grid empty" in html
    assert "Allocation of variation (full-factorial ANOVA" not in html
