"""The report as a reader meets it, on a constructed results folder with the
three seed frameworks (Horovod, LBANN, Tarantella) where the answer is known:
horovod-torch fastest, LBANN second, Tarantella third; LBANN's one-process
cells never ran, nor did any horovod-keras run. One test per class of defect
a reader met: a framework left out of the answer, numbers not written for
people, levels out of numeric order, a hash where a name exists, a link to a
run that does not exist, a table wider than its box, a speedup without its
base, communication at one process, a framework offered that the plan
refuses, a gate verdict that blames an unused builder; and the figures'
ticks, titles and empty panels."""

import html
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis import cells, collect, figures, humanize, provenance, report
from analysis.collect import PHASE_COLUMNS
from conftest import step_phase_rows
from ddlcompare.plan import design

# The analysis of a folder with untimed frameworks and missing cells says
# what it cannot compute in words: numpy's and statsmodels' warnings about
# it (divisions by zero, a rank-deficient design) fail the tests.
pytestmark = pytest.mark.filterwarnings(
    "error::RuntimeWarning", "error::statsmodels.tools.sm_exceptions.ModelWarning"
)

MS = 1_000_000
SEEDS = ["horovod-torch", "lbann", "tarantella", "horovod-keras"]
THROUGHPUT = {"horovod-torch": 1500, "lbann": 1000, "tarantella": 650}  # images/s at 1 process


def never_ran(framework: str, world: int) -> bool:
    return framework == "horovod-keras" or (framework == "lbann" and world == 1)


def seeds_design():
    return design.parse(
        {
            "name": "seeds",
            "factors": {"framework": SEEDS, "procs_per_node": [1, 2], "batch_size": [64, 256]},
            "replications": 3,
            "fixed": {"target_accuracy": 0.8, "epochs": 2},
        },
        "seeds.yaml",
    )


def phases_of(run: dict) -> list[dict]:
    """30 steps on each rank: Horovod and LBANN time their phases (rank 1's
    forward 1 ms slower), Tarantella's table times no phase (an empty panel)."""
    rows = []
    for step in range(30):
        for rank in range(run["world_size"]):
            timed = (
                [("grad_comm", 0)]
                if run["framework"] == "tarantella"
                else [
                    ("data_load", 5),
                    ("forward", 10 + rank),
                    ("backward", 20),
                    ("grad_comm", 3),
                    ("optimizer", 2),
                ]
            )
            durations = [(phase, ms * MS) for phase, ms in timed]
            rows += step_phase_rows(run["run_id"], rank, step, step * 50 * MS, durations)
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The constructed folder: results/ with a folder for each run that ran,
    tables/ as analysis/collect.py writes them, the figures and the report."""
    root = tmp_path_factory.mktemp("seeds")
    d = seeds_design()
    rng = np.random.default_rng(0)
    runs, phases, epochs = [], [], []
    for row in d.runs():
        run = collect.run_row(d, row, root / "results")  # every column, status missing
        framework, world = run["framework"], row.world_size
        run.update(harness_commit="abc1234", hosts="", version_torch="2.13.0")
        if not never_ran(framework, world):
            rate = THROUGHPUT[framework] * (1.6 if world == 2 else 1)
            rate *= 1.2 if run["batch_size"] == 256 else 1
            rate += rng.normal(0, 20)
            (root / "results" / row.path).mkdir(parents=True)
            run.update(
                status="ok",
                exit_status=0,
                hosts="node-1",
                images_per_s=rate,
                time_per_epoch_s=15000 / rate,
                final_test_accuracy=0.86,
                target_status="reached",
                time_to_accuracy_s=30000 / rate,
                epochs_to_accuracy=1.0,
                energy_to_accuracy_j=np.nan,
            )
            phases += phases_of(run)
            epochs += [
                {"run_id": run["run_id"], "epoch": e, "test_accuracy": 0.7 + 0.08 * e}
                for e in (1, 2)
            ]
        runs.append(run)
    table = cells.with_setting(pd.DataFrame(runs))
    tables = root / "results" / d.root / "tables"
    tables.mkdir(parents=True)
    table.to_parquet(tables / "runs.parquet", index=False)
    pd.DataFrame(phases)[PHASE_COLUMNS].to_parquet(tables / "step_phases.parquet", index=False)
    pd.DataFrame(epochs).to_parquet(tables / "epochs.parquet", index=False)
    figures.draw_all(tables)
    page = report.build(d, tables, tables.parent / "report.html")
    return {"design": d, "runs": table, "phases": pd.DataFrame(phases), "page": page.read_text()}


def text_of(page: str, section: str | None = None) -> str:
    """What a reader reads (of one section): the page without its markup."""
    if section:
        page = re.search(rf'<section id="{section}".*?</section>', page, re.S).group(0)
    page = re.sub(r"<(style|script)\b.*?</\1>", "", page, flags=re.S)
    page = re.sub(r"<(td|th)[^>]*>", " | ", page)
    page = re.sub(r"</(p|li|tr|h\d)>", "\n", page)
    return html.unescape(re.sub(r"<[^>]+>", "", page)).replace("\u00ad", "")


def test_the_summary_places_every_framework_of_each_scale(built):
    lines = [
        line for line in text_of(built["page"], "summary").splitlines() if " at 1 node" in line
    ]
    two = next(
        line
        for line in lines
        if line.startswith("Throughput at 1 node x 2 processes, batch_size 64")
    )
    # first and second, then the third against the best and the one ahead, with Holm's p
    assert "horovod-torch leads" in two and "ahead of lbann (significant, Holm-adjusted p" in two
    assert re.search(
        r"Then tarantella [\d.]+ images/s \(95 % interval .*\), [\d.]+ % below the best "
        r"\(horovod-torch: significant, Holm-adjusted p [^)]+\), behind lbann \(significant, "
        r"Holm-adjusted p ",
        two,
    ), two
    one = next(
        line for line in lines if line.startswith("Throughput at 1 node x 1 process, batch_size 64")
    )
    assert "No successful run here: horovod-keras (missing), lbann (missing)." in one
    for framework in THROUGHPUT:
        assert all(framework in line for line in lines if "2 processes" in line), framework
    summary = text_of(built["page"], "summary")
    assert "reached by no successful run, so in no comparison: horovod-keras" in summary


def chain_page(tmp_path, mean: dict[str, float]) -> str:
    """The page of a one-cell design (2 processes, batch 64) of the frameworks
    in ``mean``, 5 runs each at their mean images/s -2 .. +2."""
    d = design.parse(
        {
            "name": "chain",
            "factors": {"framework": list(mean)},
            "fixed": {"procs_per_node": 2, "batch_size": 64, "epochs": 2},
            "replications": 5,
        },
        "chain.yaml",
    )
    runs, phases, epochs = [], [], []
    for row in d.runs():
        run = collect.run_row(d, row, tmp_path / "results")
        rate = mean[run["framework"]] + row.rep - 3  # -2 .. +2 around it
        run.update(status="ok", exit_status=0, harness_commit="abc1234", hosts="node-1")
        run.update(images_per_s=rate, time_per_epoch_s=15000 / rate, final_test_accuracy=0.86)
        run.update(target_status="not set", time_to_accuracy_s=np.nan, epochs_to_accuracy=np.nan)
        run.update(energy_to_accuracy_j=np.nan)
        (tmp_path / "results" / row.path).mkdir(parents=True)
        runs.append(run)
        phases += phases_of(run)
        epochs += [{"run_id": run["run_id"], "epoch": e, "test_accuracy": 0.86} for e in (1, 2)]
    tables = tmp_path / "results" / d.root / "tables"
    tables.mkdir(parents=True)
    cells.with_setting(pd.DataFrame(runs)).to_parquet(tables / "runs.parquet", index=False)
    pd.DataFrame(phases)[PHASE_COLUMNS].to_parquet(tables / "step_phases.parquet", index=False)
    pd.DataFrame(epochs).to_parquet(tables / "epochs.parquet", index=False)
    return report.build(d, tables, tables.parent / "report.html").read_text()


def test_each_framework_is_tested_against_the_best_directly(tmp_path):
    """A chain: each framework 2 % behind the one ahead, within noise, but the
    third 4 % behind the best, well outside it. The neighbour tests cannot
    say that; the direct test with the best, in the same Holm family as the
    neighbours', does, and the page says it with the family's own p."""
    from statsmodels.stats.multitest import multipletests

    mean = {"horovod-torch": 100.0, "lbann": 98.0, "tarantella": 96.0}
    page = chain_page(tmp_path, mean)
    summary = text_of(page, "summary")
    line = next(x for x in summary.splitlines() if "No significant difference in throughput" in x)
    # Welch's p of the three pairs, one family: 2 neighbour pairs and the best with the third
    welch = {
        pair: scipy_stats.ttest_ind(
            [mean[pair[0]] + k for k in range(-2, 3)],
            [mean[pair[1]] + k for k in range(-2, 3)],
            equal_var=False,
        ).pvalue
        for pair in [
            ("horovod-torch", "lbann"),
            ("lbann", "tarantella"),
            ("horovod-torch", "tarantella"),
        ]
    }
    adjusted = dict(zip(welch, multipletests(list(welch.values()), method="holm")[1]))
    assert adjusted["horovod-torch", "lbann"] > 0.05 < adjusted["lbann", "tarantella"]
    assert adjusted["horovod-torch", "tarantella"] < 0.05
    assert (
        f"tarantella 96 images/s (95 % interval 94.1 images/s to 98 images/s), 4 % below the best "
        f"(horovod-torch: significant, Holm-adjusted p "
        f"{humanize.p_value(adjusted['horovod-torch', 'tarantella'])}), behind lbann "
        f"(not significant, Holm-adjusted p {humanize.p_value(adjusted['lbann', 'tarantella'])})"
    ) in line, line
    assert "between the best and each framework further down" in summary
    assert "Not in this design" not in summary  # all three studied frameworks are in it


def test_the_answer_names_a_studied_framework_the_design_leaves_out(tmp_path):
    """The default design has no LBANN (not built here): the first screen
    says that one of the study's three is not in the answer, and where to
    read how to add it, right after the comparisons."""
    page = chain_page(tmp_path, {"torch-ddp": 100.0, "horovod-torch": 98.0, "tarantella": 96.0})
    summary = text_of(page, "summary")
    said = (
        "Not in this design, so not in this answer: LBANN (lbann), of the study's three "
        "frameworks (Horovod, LBANN, Tarantella); the Frameworks section says how to add it."
    )
    assert said in summary, summary
    assert summary.index("No significant difference in throughput") < summary.index(said)
    assert summary.index(said) < summary.index("Replications:")


def test_numbers_are_written_for_people(built):
    text = text_of(built["page"])
    assert "process(es)" not in text and "(s)" not in text
    assert "in all)" not in text  # one node: the total is the process count
    assert "((" not in text and "))" not in text
    assert "hosts: node-1" in text and "hosts: ," not in text
    # "not set" only for the settings left unset, once each
    unset = [k for k, v in built["design"].fixed.items() if v is None]
    assert text.count("not set") == len(unset)
    # a predicted gain is a percentage, never a fraction
    improve = text_of(built["page"], "improve")
    gains = re.findall(
        r"\| contention removed \| [^|]+ \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", improve
    )
    assert gains and all(cell.strip().endswith("%") for row in gains for cell in row), gains
    # each version row names its framework
    versions = text_of(built["page"], "design").split("Software and hosts")[1]
    assert "| framework | version_torch" in versions


def test_levels_are_in_numeric_order(built):
    for section in ("summary", "accuracy"):
        text = text_of(built["page"], section)
        assert text.index("batch_size 64") < text.index("batch_size 256"), section
    accuracy = text_of(built["page"], "accuracy")
    rows = re.findall(r"\| horovod-torch \| (\d) \| (batch_size \d+) \|", accuracy)
    assert rows == sorted(rows, key=lambda r: (int(r[0]), int(r[1].split()[1]))), rows


def test_a_run_is_named_not_hashed_and_missing_runs_are_not_linked(built):
    runs = built["runs"]
    prose = re.findall(r"<(?:p|li)\b[^>]*>(.*?)</(?:p|li)>", built["page"], re.S)
    for run_id in runs["run_id"]:
        assert not any(run_id in p for p in prose), run_id
    # nor in a table: a table of runs names each by its cell and replication
    shown = text_of(built["page"])
    hashed = [shown[shown.find(r) - 200 : shown.find(r) + 20] for r in runs["run_id"] if r in shown]
    assert hashed == [], hashed[:2]
    critical = text_of(built["page"], "critical-path")
    assert "| framework | world_size | setting | rep | rank |" in critical, critical
    ok = runs[runs["status"] == "ok"].iloc[0]
    name = figures.run_name(runs, ok["run_id"])
    assert name == (
        f"{ok['framework']}, {ok['world_size']} process{'es' if ok['world_size'] > 1 else ''}, "
        f"{ok['setting']}, rep {ok['rep']}"
    )
    spread = re.search(r'<section id="spread".*?</section>', built["page"], re.S).group(0)
    linked = re.findall(r'<a href="([^"]+)/">rep \d+</a>', spread)
    assert linked and not any("horovod-keras" in href for href in linked)
    assert re.search(r"horovod-keras, 1 process, batch_size 64: rep 1 \(missing\)", text_of(spread))


def test_every_table_scrolls_inside_its_box(built):
    page = built["page"]
    assert page.count("<table>") == page.count('<div class="table-box"><table>') > 10
    style = re.search(r"\.table-box \{([^}]*)\}", page).group(1)
    assert "overflow-x: auto" in style and "max-width: 100%" in style


def test_no_speedup_without_its_base_and_no_communication_at_one_process(built):
    throughput = text_of(built["page"], "throughput")
    lbann = [r for r in throughput.splitlines() if r.startswith(" |  | lbann") or "| lbann |" in r]
    assert lbann and all("| 1 | – | – |" not in r and "100 %" not in r for r in lbann), lbann
    critical = text_of(built["page"], "critical-path")
    one = [line for line in critical.splitlines() if ", 1 process, " in line and ": " in line]
    assert one and all("communication proper" not in line for line in one), one
    assert all("no communication and no waiting" in line for line in one), one


def test_an_interaction_whose_cells_did_not_all_run_is_left_out_in_words(built):
    """LBANN never ran at one process: framework x procs_per_node cannot be
    estimated, and the allocation of variation says it left it out."""
    text = " ".join(text_of(built["page"]).split())
    assert "Interactions left out, since not every combination of their levels ran: " in text
    assert re.search(r"framework x procs_per_node \((\d+) of its (?!\1)\d+ combinations", text)


def test_a_framework_the_plan_refuses_is_not_offered(built):
    frameworks = text_of(built["page"], "frameworks")
    (torch_dp,) = [line for line in frameworks.splitlines() if "| torch-dp |" in line]
    assert "not on this design's device: framework torch-dp cannot run device cpu" in torch_dp
    assert "add it to the design" not in torch_dp


def test_the_gate_judges_the_builders_the_design_uses():
    rows = [
        {"builder": "pytorch", "status": "pass", "checked on": "cpu"},
        {"builder": "keras", "status": "not checked", "checked on": "no TensorFlow here"},
    ]
    verdict, note = provenance.gate_verdict(rows, ["torch-ddp", "horovod-torch"])
    assert (
        verdict == "pass" and note == "Not checked, and used by no framework of this design: keras."
    )
    verdict, note = provenance.gate_verdict(rows, ["horovod-torch", "horovod-keras"])
    assert verdict == "incomplete"
    assert note.startswith("Next step: the keras builder (used by horovod-keras) was not checked")
    # the default design: Tarantella's model is checked by its own builder (the
    # tnt.Model around the Keras model), not by the unused plain Keras one
    rows.append({"builder": "tarantella", "status": "pass", "checked on": "cpu"})
    verdict, note = provenance.gate_verdict(rows, ["torch-ddp", "horovod-torch", "tarantella"])
    assert verdict == "pass", note
    rows[-1]["status"] = "not checked"
    verdict, note = provenance.gate_verdict(rows, ["tarantella-patched"])
    assert verdict == "incomplete"
    assert note.startswith("Next step: the tarantella builder (used by tarantella-patched)")


def test_figures_have_whole_ticks_full_titles_and_say_why_a_panel_is_empty(built):
    runs, phases = built["runs"], built["phases"]
    epochs = pd.DataFrame(
        [
            {"run_id": r, "epoch": e, "test_accuracy": 0.8}
            for r in runs["run_id"][:3]
            for e in (1, 2, 3)
        ]
    )
    figure = figures.accuracy_per_epoch(runs[runs["status"] == "ok"], epochs).draw()
    for axis in figure.axes:
        assert all(float(t).is_integer() for t in axis.get_xticks() if 1 <= t <= 3)
    assert not any("(es)" in t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text")))

    from analysis import critical_path as cp

    ok = runs[runs["status"] == "ok"]
    found = cp.analyse(phases[phases["run_id"].isin(ok["run_id"])], ok)
    figure = figures.critical_path_plot(found, runs).draw()
    texts = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
    title = next(t for t in texts if t.startswith("Critical path"))
    assert "2 processes" in title and not re.search(r"[0-9a-f]{12}", title)
    (axis,) = figure.axes
    assert [float(t) for t in axis.get_yticks() if 0 <= t <= 1] == [0.0, 1.0]

    figure = figures.timeline(phases, runs).draw()
    texts = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
    assert "tarantella: whole steps only (fit_step_phases: false)" in texts

    figure = figures.scaling(runs).draw()
    width = figure.get_size_inches()[0] * figure.dpi
    figure.draw_without_rendering()
    titles = figure.findobj(lambda a: hasattr(a, "get_text") and a.get_text().startswith("Speedup"))
    assert titles
    for text in titles:
        box = text.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= width, (box, width)


def test_relative_figures_are_percentages_in_every_table():
    """The what-if's errors and ddlc improve's predictions and changes are
    fractions in the tables (CSV), percentages on the page."""
    from analysis import humanize

    columns = {
        "relative_error": -0.71,
        "naive_error": 0.05,
        "held_out_error": -0.307,
        "compute_drift": 0.177,
        "change": -0.000467,
        "predicted_gain": 0.192,
        "predicted_gain_low": 0.18,
        "predicted_step_change": -0.192,
        "predicted_low": -0.2,
        "predicted_high": -0.18,
        "step_change": -0.2,
        "step_change_high": -0.1,
        "throughput_change_low": 0.1,
    }
    shown = humanize.frame(pd.DataFrame([columns])).iloc[0]
    assert shown["relative_error"] == "-71 %" and shown["predicted_gain"] == "19.2 %"
    assert shown["held_out_error"] == "-30.7 %" and shown["compute_drift"] == "17.7 %"
    assert humanize.frame(pd.DataFrame({"seconds": [2.53e-6]})).iloc[0, 0] == "2.53 µs"
    assert all(text.endswith(" %") for text in shown), shown.to_dict()


def test_no_table_reaches_past_its_box_in_a_browser(built, tmp_path):
    """At 1400 px, in Chromium: the page does not scroll sideways and every
    table's box ends inside its section (a wide table scrolls in its box)."""
    import shutil

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by envs/setup.sh"
    page_file = tmp_path / "report.html"
    page_file.write_text(built["page"])
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(page_file.as_uri())
        page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        past = page.eval_on_selector_all(
            ".table-box",
            """boxes => boxes.filter(b => b.getBoundingClientRect().right >
                 b.closest('section').getBoundingClientRect().right + 0.5).length""",
        )
        browser.close()
    assert overflow <= 0 and past == 0, (overflow, past)
