"""Fractional factorial designs: Jain's 2^(7-4) example reproduced (the
design, its sign table, its confoundings and the allocation of variation),
the plan lists exactly the fraction's runs, bad input named in one line."""

import itertools

import pandas as pd
import pytest

from analysis import stats
from conftest import ddlc, write_design
from ddlcompare.plan import design
from ddlcompare.plan.design import DesignError

# Seven two-level factors, A..G in this order; the first level is -1.
FACTORS = {
    "framework": ["torch-ddp", "horovod-torch"],
    "procs_per_node": [1, 2],
    "batch_size": [32, 64],
    "dataset": ["fashion-mnist", "cifar10"],
    "lr_scaling": ["none", "linear"],
    "momentum": [0.0, 0.9],
    "eval_every": [1, 2],
}
NAMES = list(FACTORS)
JAIN = ["D = A B", "E = A C", "F = B C", "G = A B C"]
# Jain, The Art of Computer Systems Performance Analysis, Table 19.2: the
# 2^(7-4) design in standard order (A varies fastest) and its responses.
JAIN_Y = [20, 35, 7, 42, 36, 50, 45, 82]


def jain_rows():
    """Table 19.1's sign rows: A, B, C a 2^3 in standard order; D = AB,
    E = AC, F = BC, G = ABC."""
    rows = []
    for c, b, a in itertools.product((-1, 1), repeat=3):
        rows.append((a, b, c, a * b, a * c, b * c, a * b * c))
    return rows


def doc(**over):
    return {
        "name": "jain",
        "design": "fractional",
        "generators": JAIN,
        "factors": FACTORS,
        "replications": 1,
        **over,
    }


def level(name, sign):
    return FACTORS[name][0 if sign < 0 else 1]


def test_plan_lists_exactly_jain_fraction():
    d = design.parse(doc())
    planned = {tuple(r.factors[f] for f in NAMES) for r in d.runs()}
    expected = {tuple(level(f, s) for f, s in zip(NAMES, row)) for row in jain_rows()}
    assert len(d.runs()) == 8 and planned == expected
    assert len(design.parse(doc(replications=3)).runs()) == 24


def test_confoundings_and_defining_relation():
    fraction = design.parse(doc()).fraction
    letter = dict(zip(NAMES, "ABCDEFG"))
    words = {"".join(sorted(letter[f] for f in w)) for w in fraction.defining_relation()}
    assert {"ABD", "ACE", "BCF", "ABCG"} <= words and len(words) == 15
    assert fraction.resolution == 3
    chains = {}
    for group in fraction.alias_groups():
        main = [t for t in group if len(t) == 1]
        if main:
            chains[letter[main[0][0]]] = {
                "".join(letter[f] for f in t) for t in group if len(t) == 2
            }
    # Each main effect is confounded with three two-factor interactions.
    assert chains == {
        "A": {"BD", "CE", "FG"},
        "B": {"AD", "CF", "EG"},
        "C": {"AE", "BF", "DG"},
        "D": {"AB", "CG", "EF"},
        "E": {"AC", "BG", "DF"},
        "F": {"BC", "AG", "DE"},
        "G": {"CD", "BE", "AF"},
    }


def test_sign_table_reproduces_jain_table_19_2():
    d = design.parse(doc())
    # Each y goes to the cell with its row's levels, whatever order pydoe used.
    rows = [
        {**{f: level(f, s) for f, s in zip(NAMES, row)}, "images_per_s": y, "status": "ok"}
        for row, y in zip(jain_rows(), JAIN_Y)
    ]
    runs = pd.DataFrame(rows).sample(frac=1, random_state=3)
    effects = stats.sign_table_2kr(
        runs, NAMES, "images_per_s", levels=FACTORS, terms=d.fraction.estimable()
    ).set_index("term")
    totals = {
        "framework": 101,
        "procs_per_node": 35,
        "batch_size": 109,
        "dataset": 43,
        "lr_scaling": 1,
        "momentum": 47,
        "eval_every": 3,
    }
    shares = {
        "framework": 37.26,
        "procs_per_node": 4.47,
        "batch_size": 43.40,
        "dataset": 6.75,
        "lr_scaling": 0.01,
        "momentum": 8.06,
        "eval_every": 0.03,
    }
    assert effects.loc["mean", "effect"] == pytest.approx(317 / 8)
    for name, total in totals.items():
        row = effects[effects.index.str.startswith(name + " =")].iloc[0]
        assert row["effect"] == pytest.approx(total / 8)
        assert row["variation"] * 100 == pytest.approx(shares[name], abs=0.01)
    first = effects[effects.index.str.startswith("framework =")].iloc[0]
    assert first["difference"] == "framework horovod-torch over torch-ddp: +25.2 images/s"
    assert first["significant"] == "no interval: one replication per cell"


def test_resolution_picks_the_smallest_fraction():
    d = design.parse({k: v for k, v in doc(resolution=3).items() if k != "generators"})
    assert len(d.runs()) == 8 and d.fraction.resolution == 3
    four = {f: FACTORS[f] for f in NAMES[:4]}
    d4 = design.parse({"design": "fractional", "resolution": 4, "factors": four})
    assert len(d4.runs()) == 8 and d4.fraction.resolution == 4


def test_max_runs_counts_the_fraction_not_the_full_factorial():
    # the full 2^7 factorial (128 runs) is over the cap, its fraction (8) is not
    assert len(design.parse(doc(max_runs=100)).runs()) == 8
    with pytest.raises(DesignError) as err:
        design.parse(doc(max_runs=15, replications=2))
    assert err.value.problems == [
        "the plan has 8 cells x 2 replications = 16 runs, more than max_runs (15); "
        "fewer levels or replications, or set max_runs: N at the top of the design "
        "if you mean it"
    ]


@pytest.mark.parametrize(
    "over, message",
    [
        ({"generators": ["D = A Z"]}, "generators[0]: 'Z' is neither a letter A-G"),
        ({"resolution": 3}, "needs exactly one of resolution: N or generators"),
        (
            {"design": "half"},
            "design: 'half' is not a design (use full, fractional or latin-hypercube)",
        ),
        ({"factors": {**FACTORS, "nodes": [1, 2, 4]}}, "needs two levels per varied factor"),
        ({"zip": [["batch_size", "procs_per_node"]]}, "zip: cannot be combined with design"),
    ],
)
def test_bad_fractions_are_named(over, message):
    with pytest.raises(DesignError) as err:
        design.parse(doc(**over))
    assert any(message in p for p in err.value.problems), err.value.problems


def test_resolution_without_fractional_is_refused():
    raw = {"factors": {"framework": ["torch-ddp"]}, "resolution": 3}
    with pytest.raises(DesignError, match="resolution: only with 'design: fractional'"):
        design.parse(raw)


def test_plan_shows_the_alias_structure(tmp_path):
    path = write_design(tmp_path, doc())
    out = ddlc("plan", "--design", str(path), "--no-check")
    assert out.returncode == 0, out.stderr
    assert "fractional factorial 2^(7-4): 8 cells per replication, resolution III" in out.stdout
    assert "A = BD = CE = FG: framework = procs_per_node:dataset" in out.stdout
    assert "8 runs (8 cells x 1 replications)" in out.stdout


def test_report_estimates_only_the_separable_effects():
    from types import SimpleNamespace

    d = design.parse(doc())
    runs = pd.DataFrame(
        [
            {
                **{f: level(f, s) for f, s in zip(NAMES, row)},
                "nodes": 1,
                "run_id": str(i),
                "images_per_s": y,
                "status": "ok",
            }
            for i, (row, y) in enumerate(zip(jain_rows(), JAIN_Y))
        ]
    )
    html = stats.section(SimpleNamespace(design=d, runs=runs)).html()
    assert "fractional factorial 2^(7-4): 8 cells per replication, resolution III" in html
    assert "A = BD = CE = FG: framework = procs_per_node:dataset" in html
    assert "framework: -1 = torch-ddp, +1 = horovod-torch" in html
    assert "framework horovod-torch over torch-ddp: +25.2 images/s" in html
    assert "Allocation of variation (full-factorial ANOVA" not in html  # not separable
    assert html.count("(+12 higher-order)") == 7 * 2  # each chain in the plan text and table
