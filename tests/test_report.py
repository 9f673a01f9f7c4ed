"""The report from a real small run, opened in headless Chromium (Debian's
chromium, driven by Playwright): a screenshot, no console errors, every
figure present and decoded, every section there and reachable from the
table of contents, the summary above the fold at 1280x800, no `nan` and no
exponent notation in what a reader sees."""

import re
import shutil
import subprocess

import pytest

from conftest import shared_trace, snakemake_cmd, tiny_design, write_design

IMPORTED = [
    "pipit-ping-pong-otf2",
    "scorep-8.4-horovod-torch-mpi-np2",
    "horovod-timeline-IgorDavidyuk-cpu3/timeline.json",
]
SECTIONS = [
    "Summary",
    "How to make it faster",
    "A framework&#39;s own setting, level by level",
    "Two stages",
    "Network bandwidth limit",
    "Design and provenance",
    "Run status",
    "Throughput and scaling",
    "Where the speedup goes",
    "Spread: step times and run-to-run variation",
    "Runs, traces and the merged timeline",
    "Phase breakdown",
    "Bottlenecks",
    "Design statistics",
    "Accuracy",
    "Frameworks and the phases they expose",
    "Traces",
    "Imported traces",
    "Same model everywhere",
    "Energy",
    "Gradient compression",
    "Critical path and causes of waiting",
    "What if: a calibrated model of the step",
    "Trace diff: framework against framework, phase by phase",
]
FIGURES = [
    "throughput",
    "scaling",
    "waterfall",
    "phase breakdown",
    "timeline",
    "accuracy",
    "time to accuracy",
    "Critical path and causes of waiting",
    "step time per cell",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("report")
    doc = tiny_design(frameworks=("torch-ddp", "horovod-torch"), procs=(1, 2))
    doc["replications"] = 2
    doc["fixed"]["target_accuracy"] = 0.5
    write_design(workdir, doc)
    imported = "import_traces=" + ",".join(str(shared_trace(name)) for name in IMPORTED)
    out = subprocess.run(
        snakemake_cmd(workdir, imported, limit=900), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return next((workdir / "results").rglob("report.html"))


def expected_gate() -> str:
    """The design's frameworks are PyTorch's: its builder, always built in
    .venv, decides the verdict; a builder no framework of the design uses
    (Keras, Tarantella) does not make it incomplete where it is not built."""
    return "pass"


@pytest.mark.slow
def test_report_has_every_section_and_finding(report):
    page = report.read_text()
    for section in SECTIONS:
        assert f">{section}<" in page, section
    assert "8 of 8 runs ok" in page
    assert "of the step is spent in data_load" in page
    assert "Allocation of variation" in page
    assert "-1 = torch-ddp, +1 = horovod-torch" in page  # the design's order, stated
    assert "framework horovod-torch over torch-ddp: " in page
    assert "Holm" in page and "images/s" in page
    assert "MPI all-reduce probe, 2 processes" in page
    assert (report.parent / "summary.md").read_text().startswith("# ddl-compare: tiny")
    assert (report.parent / "summary-images_per_s.csv").exists()
    assert f"Same-model gate: <b>{expected_gate()}</b>" in page
    assert (
        ">Time to accuracy<" in page and "time_<wbr>to_<wbr>accuracy_<wbr>s</th>" in page
    )  # headers wrap at "_"
    assert "Energy was not measured" in page or "measured: " in page
    assert "http://" not in page and "https://" not in page  # nothing fetched
    for name in IMPORTED:  # each trace is named by its folder
        assert f"<td>{name.split('/')[0]}</td>" in page, name


@pytest.mark.slow
def test_report_renders_in_chromium_without_errors(report, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by envs/setup.sh"
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(report.as_uri())
        images = page.eval_on_selector_all(
            "img", "imgs => imgs.map(i => [i.alt, i.complete && i.naturalWidth > 0])"
        )
        summary_top = page.eval_on_selector("#summary h2", "e => e.getBoundingClientRect().top")
        first_answer = page.eval_on_selector("#summary li", "e => e.getBoundingClientRect().bottom")
        toc = page.eval_on_selector_all("nav#contents a", "as => as.map(a => a.hash.slice(1))")
        section_ids = page.eval_on_selector_all("section", "ss => ss.map(s => s.id)")
        reachable = [page.evaluate("id => !!document.getElementById(id)", i) for i in toc]
        text = page.inner_text("body")
        # the codecs' error bounds are formulas (6.1e-5 <= |x|): numbers elsewhere
        figures = " ".join(
            page.inner_text(f"#{i}")
            for i in ("summary", "throughput", "phases", "bottlenecks", "statistics")
        )
        page.screenshot(path=str(tmp_path / "fold.png"))
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        page.set_viewport_size({"width": 1400, "height": 3000})
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        tallest_row = page.eval_on_selector_all(
            "tr", "rows => Math.max(...rows.map(r => r.getBoundingClientRect().height))"
        )
        links = page.eval_on_selector_all("#spread a", "as => as.map(a => a.href)")
        browser.close()
    assert overflow <= 0, f"the page is {overflow} px wider than a 1400 px window"
    assert tallest_row < 300, f"a table row {tallest_row} px tall"
    assert "x 10^" not in text
    assert any(link.endswith("/rep~1/") for link in links)
    assert any(link.endswith("tables/timeline.json") for link in links)
    assert errors == []
    assert summary_top < 800 and first_answer < 800  # the answer above the fold
    assert toc == section_ids and all(reachable)
    assert not re.search(r"\bnan\b", text) and not re.search(r"\d\.?\d*e[-+]\d+", figures)
    assert sorted(alt for alt, _ in images) == sorted(FIGURES)
    assert all(decoded for _, decoded in images), images
    assert (tmp_path / "report.png").stat().st_size > 50_000


def test_a_section_is_text_and_marks_rendered_by_the_one_template(tmp_path):
    """A builder writes no HTML: its text is escaped, its marks become the
    only markup, a long table folds and a figure that is not there says so."""
    import pandas as pd

    from analysis.section import Code, Em, Link, Section

    section = (
        Section("x", "A <title>")
        .para("a < b & ", Code("<code>"), " ", Em("it's"), " ", Link("here", 'a"b.html'))
        .items(["one <li>", ["two ", Code("2")]])
        .table(pd.DataFrame({"long_name": range(13), "status": ["ok"] * 13}), caption="c")
        .figure(tmp_path / "missing.png", "plot")
    )
    page = section.html()
    assert '<section id="x">' in page and "<h2>A &lt;title&gt;</h2>" in page
    assert "<p>a &lt; b &amp; <code>&lt;code&gt;</code> <i>it&#39;s</i> " in page
    assert '<a href="a&#34;b.html">here</a></p>' in page
    assert "<li>one &lt;li&gt;</li><li>two <code>2</code></li>" in page
    assert "<details><summary>c (13 rows)</summary>" in page and "long_<wbr>name</th>" in page
    assert page.count('<td class="ok">ok</td>') == 13
    assert "plot: no figure (no successful run)." in page
    assert section.sentences == ["one <li>", "two 2"] and list(section.tables) == ["c"]


def test_run_status_says_whether_the_runs_kept_the_designs_order():
    import pandas as pd

    from analysis import provenance

    starts = [f"2026-11-27T10:00:0{i}" for i in range(4)]
    kept = pd.DataFrame({"order": [0, 1, 2, 3], "start": starts})
    assert "the 4 runs started in the design's randomized order" in provenance.order_words(kept)
    swapped = kept.assign(order=[1, 0, 2, 3])
    said = provenance.order_words(swapped)
    assert "of 4 runs, 1 started after a run later" in said and "tau 0.67" in said
