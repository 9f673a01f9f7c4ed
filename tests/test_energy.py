"""Energy: RAPL on fake powercap trees in the kernel's exact layout, NVML's
"not available" path and power integration, Kwollect through a real local
HTTP server speaking the Grid'5000 metrics API's JSON, and the run figures
(energy.json, epochs, energy to a time)."""

import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from analysis import collect
from conftest import REPO, tiny_design
from ddlcompare.plan import design
from ddlcompare.run import runner
from runfiles import energy

MAX_UJ = 262143328850  # max_energy_range_uj of a real package zone


def make_powercap(
    sys_root: Path, packages: dict[int, dict[str, int]], max_uj: int = MAX_UJ
) -> Path:
    """A /sys tree as the intel_rapl driver makes it: zones are directories
    under devices/virtual/powercap/intel-rapl, subzones inside their
    package, and /sys/class/powercap holds one symlink per zone.
    ``packages``: package index -> {zone name: energy_uj}, the package's own
    zone under "package"."""
    devices = sys_root / "devices" / "virtual" / "powercap" / "intel-rapl"
    devices.mkdir(parents=True)
    (devices / "enabled").write_text("1\n")
    links = sys_root / "class" / "powercap"
    links.mkdir(parents=True)
    (links / "intel-rapl").symlink_to("../../devices/virtual/powercap/intel-rapl")
    for i, zones in packages.items():
        package = devices / f"intel-rapl:{i}"
        _zone(package, f"package-{i}", zones["package"], max_uj)
        (links / package.name).symlink_to(
            f"../../devices/virtual/powercap/intel-rapl/{package.name}"
        )
        for j, name in enumerate(n for n in zones if n != "package"):
            sub = package / f"intel-rapl:{i}:{j}"
            _zone(sub, name, zones[name], max_uj)
            (links / sub.name).symlink_to(
                f"../../devices/virtual/powercap/intel-rapl/{package.name}/{sub.name}"
            )
    return links


def _zone(folder: Path, name: str, energy_uj: int, max_uj: int) -> None:
    folder.mkdir()
    (folder / "device").symlink_to("..")
    for key, value in {
        "name": name,
        "enabled": 1,
        "max_energy_range_uj": max_uj,
        "max_power_range_uw": 200000000,
        "constraint_0_name": "long_term",
        "constraint_0_power_limit_uw": 150000000,
    }.items():
        (folder / key).write_text(f"{value}\n")
    set_energy(folder, energy_uj)  # 0400: root only, as since the 2020 fix


def set_energy(zone: Path, energy_uj: int) -> None:
    """A new counter value, whole at once (a sampler may be reading)."""
    tmp = zone / ".energy_uj"
    tmp.write_text(f"{energy_uj}\n")
    tmp.chmod(0o400)
    tmp.replace(zone / "energy_uj")


def zone(links: Path, name: str) -> Path:
    return (links / name).resolve()


def test_rapl_counts_packages_and_dram_not_core_or_uncore(tmp_path):
    links = make_powercap(
        tmp_path,
        {
            0: {"package": 1_000_000, "core": 500_000, "uncore": 100_000, "dram": 200_000},
            1: {"package": 3_000_000, "core": 700_000, "dram": 400_000},
        },
    )
    meter = energy.RaplMeter(links)
    meter.open()
    assert meter.read() == {"package-0": 0, "dram-0": 0, "package-1": 0, "dram-1": 0}
    set_energy(zone(links, "intel-rapl:0"), 3_500_000)
    set_energy(zone(links, "intel-rapl:0:2"), 700_000)
    set_energy(zone(links, "intel-rapl:1"), 4_000_000)
    set_energy(zone(links, "intel-rapl:0:0"), 99_000_000)  # core: not counted
    assert meter.read() == {"package-0": 2.5, "dram-0": 0.5, "package-1": 1.0, "dram-1": 0}


def test_rapl_counter_wrap_between_samples(tmp_path):
    links = make_powercap(tmp_path, {0: {"package": MAX_UJ - 2_000_000}})
    meter = energy.RaplMeter(links)
    meter.open()
    set_energy(zone(links, "intel-rapl:0"), 1_000_000)  # wrapped: +2 J to the top, +1 J past it
    assert meter.read() == {"package-0": pytest.approx(3.0)}
    set_energy(zone(links, "intel-rapl:0"), 6_000_000)
    assert meter.read() == {"package-0": pytest.approx(8.0)}


def test_rapl_missing_powercap_and_no_rapl_zone(tmp_path):
    with pytest.raises(energy.Unavailable, match="exposes no power capping interface"):
        energy.RaplMeter(tmp_path / "class" / "powercap").open()
    (tmp_path / "class" / "powercap" / "dtpm").mkdir(parents=True)  # another driver's zone
    with pytest.raises(energy.Unavailable, match="no RAPL package zone"):
        energy.RaplMeter(tmp_path / "class" / "powercap").open()


def test_rapl_unreadable_energy_is_a_reason():
    """energy_uj is 0400 root: a normal user's sampler says so. Root reads
    any file, so there the reader runs as nobody (Debian's python3, the
    module copied where nobody can read it: it needs only the standard
    library)."""
    top = Path(tempfile.mkdtemp(prefix="ddlc-powercap-"))
    try:
        top.chmod(0o755)
        links = make_powercap(top / "sys", {0: {"package": 5, "dram": 6}})
        # The whole package: a list of the modules energy.py reaches went stale
        # each time one of them imported another.
        shutil.copytree(
            REPO / "runfiles", top / "runfiles", ignore=shutil.ignore_patterns("__pycache__")
        )
        code = (
            "import sys; from runfiles import energy\n"
            "try:\n    energy.RaplMeter(sys.argv[1]).open()\n"
            "except energy.Unavailable as e:\n    print(e)\n"
        )
        user = "nobody" if os.geteuid() == 0 else None
        if user is None:  # we own the files: take our own read right away too
            for path in top.rglob("energy_uj"):
                path.chmod(0)
        out = subprocess.run(
            ["/usr/bin/python3", "-c", code, str(links)],
            cwd=top,
            user=user,
            env={"PYTHONPATH": str(top)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "readable by root only" in out.stdout, out.stderr
        assert "intel-rapl:0/energy_uj" in out.stdout
    finally:
        shutil.rmtree(top)


def test_nvml_says_why_it_cannot_measure_here():
    meter = energy.NvmlMeter()
    if Path("/dev/nvidiactl").exists():  # a GPU node: it measures every GPU
        meter.open()
        assert set(meter.read()) == {f"gpu{i}" for i in range(len(meter.gpus))}
        meter.close()
        return
    with pytest.raises(energy.Unavailable, match="NVML cannot start: .*no NVIDIA driver"):
        meter.open()


def test_power_integral_is_the_trapezoid_rule():
    integral = energy.PowerIntegral()
    samples = [(100.0, 100.0), (101.0, 200.0), (103.0, 200.0), (103.5, 0.0)]
    assert [integral.add(t, w) for t, w in samples] == [0, 150, 550, 600]


def test_sampler_writes_samples_and_status(tmp_path):
    links = make_powercap(tmp_path / "sys", {0: {"package": 0, "dram": 0}})
    sampler = energy.Sampler(
        tmp_path, rank=3, interval_s=0.05, meters=[energy.RaplMeter(links), energy.NvmlMeter()]
    )
    sampler.start()
    for uj in range(1, 6):
        time.sleep(0.05)
        set_energy(zone(links, "intel-rapl:0"), uj * 1_000_000)
    sampler.stop()
    status = json.loads((tmp_path / "energy_sources.rank3.json").read_text())
    assert status["sources"]["rapl"] == {"available": True}
    assert status["sources"]["nvml"]["available"] is Path("/dev/nvidiactl").exists()
    series = {s.domain: s for s in energy.read_samples(tmp_path) if s.source == "rapl"}
    assert series["package-0"].joules[0] == 0 and series["package-0"].joules[-1] == 5
    assert series["dram-0"].joules[-1] == 0
    assert series["package-0"].times == sorted(series["package-0"].times)


def write_samples(folder: Path, name: str, rows: list[tuple]) -> None:
    lines = ["\t".join(energy.SAMPLE_COLUMNS)] + ["\t".join(map(str, r)) for r in rows]
    (folder / f"energy_samples.{name}.tsv").write_text("\n".join(lines) + "\n")


def write_sources(
    folder: Path, rank: int, host: str, start: float, end: float, sources: dict
) -> None:
    (folder / f"energy_sources.rank{rank}.json").write_text(
        json.dumps(
            {
                "host": host,
                "rank": rank,
                "interval_s": 1.0,
                "start_unix": start,
                "end_unix": end,
                "sources": sources,
            }
        )
    )


NVML_MISSING = {"available": False, "reason": "NVML cannot start: NVML Shared Library Not Found"}


def constructed_run(folder: Path, watts: dict[str, float], t0: float = 1000.0) -> None:
    """Two nodes sampled each second for 20 s at constant power per node
    (package-0 at 3/4 of it, dram-0 at 1/4); a run clock starting at t0+2
    with epochs ending 6 s and 16 s later."""
    for rank, (host, power) in enumerate(watts.items()):
        rows = [
            (host, "rapl", domain, t0 + s, share * power * s)
            for s in range(21)
            for domain, share in (("package-0", 0.75), ("dram-0", 0.25))
        ]
        write_samples(folder, f"rank{rank}", rows)
        write_sources(
            folder, rank, host, t0, t0 + 20, {"rapl": {"available": True}, "nvml": NVML_MISSING}
        )
    (folder / "metrics.json").write_text(json.dumps({"clock_start_unix": t0 + 2}))
    (folder / "epochs.tsv").write_text("epoch\ttest_accuracy\telapsed_s\n1\t0.5\t6\n2\t0.7\t16\n")


def test_run_energy_over_the_run_clock_with_epochs(tmp_path):
    constructed_run(tmp_path, {"node-1": 100.0, "node-2": 50.0})
    doc = energy.summarize(tmp_path)
    assert doc["status"] == "measured: rapl" and doc["counted"] == ["rapl"]
    assert (doc["start_unix"], doc["end_unix"]) == (1002, 1018)
    assert doc["joules"] == pytest.approx(150 * 16)
    assert doc["sources"]["rapl"]["node-1"]["joules"] == pytest.approx(
        {"package-0": 1200, "dram-0": 400}
    )
    assert doc["sources"]["nvml"]["node-2"]["reason"] == NVML_MISSING["reason"]
    assert doc["epochs"] == [
        {"epoch": 1, "energy_j": pytest.approx(900), "energy_to_epoch_j": pytest.approx(900)},
        {"epoch": 2, "energy_j": pytest.approx(1500), "energy_to_epoch_j": pytest.approx(2400)},
    ]


def test_energy_until_interpolates_and_refuses_times_outside(tmp_path):
    constructed_run(tmp_path, {"node-1": 100.0})
    series = energy.read_samples(tmp_path)
    assert energy.energy_until(series, 1002.5) == pytest.approx(250)
    assert energy.energy_until(series, 1021.0) == pytest.approx(2000)  # within the tolerance
    assert energy.energy_until(series, 1030.0) is None
    assert energy.energy_between(series, 1002, 1012) == pytest.approx(1000)


def test_a_node_without_rapl_makes_rapl_not_available(tmp_path):
    constructed_run(tmp_path, {"node-1": 100.0})
    write_sources(
        tmp_path,
        1,
        "node-2",
        1000,
        1020,
        {
            "rapl": {"available": False, "reason": "no /sys/class/powercap: ..."},
            "nvml": NVML_MISSING,
        },
    )
    doc = energy.summarize(tmp_path)
    assert doc["joules"] is None and doc["epochs"] == []
    assert doc["status"] == (
        "not available: nvml: NVML cannot start: NVML Shared Library "
        "Not Found; rapl: no /sys/class/powercap: ..."
    )
    assert doc["sources"]["rapl"]["node-1"]["joules"]["package-0"] == pytest.approx(1200)


def test_two_samplers_on_one_host_count_once(tmp_path):
    constructed_run(tmp_path, {"node-1": 100.0})
    write_samples(
        tmp_path, "rank1", [("node-1", "rapl", "package-0", 1000 + s, 999.0 * s) for s in range(21)]
    )
    write_sources(tmp_path, 1, "node-1", 1000, 1020, {"rapl": {"available": True}})
    assert energy.summarize(tmp_path)["joules"] == pytest.approx(1600)


class KwollectAPI(BaseHTTPRequestHandler):
    """/sites/<site>/metrics as Grid'5000 serves it: a JSON list of
    {timestamp, device_id, metric_id, value, labels} for the nodes and
    metrics asked, in the time window asked."""

    records: list[dict] = []
    asked: list[str] = []

    def do_GET(self):
        url = urlparse(self.path)
        type(self).asked.append(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/sites/lyon/metrics":
            self.send_error(404)
            return
        nodes, metrics = query["nodes"].split(","), query["metrics"].split(",")
        start, end = float(query["start_time"]), float(query["end_time"])
        body = json.dumps(
            [
                r
                for r in self.records
                if r["device_id"] in nodes
                and r["metric_id"] in metrics
                and start <= _unix(r["timestamp"]) <= end
            ]
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _unix(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp).timestamp()


def _record(node: str, metric: str, unix_s: float, watts: float, origin=None) -> dict:
    from datetime import datetime, timedelta, timezone

    paris = timezone(timedelta(hours=2))
    return {
        "timestamp": datetime.fromtimestamp(unix_s, paris).isoformat(),
        "device_id": node,
        "metric_id": metric,
        "value": watts,
        "labels": {"_device_orig": [origin]} if origin else {},
    }


@pytest.fixture
def kwollect_api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), KwollectAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    KwollectAPI.asked = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_kwollect_prefers_wattmeters_sums_ports_and_integrates(tmp_path, kwollect_api):
    start, end = 1_750_000_000.0, 1_750_000_010.0
    KwollectAPI.records = (
        [
            _record(
                "taurus-7", "wattmetre_power_watt", start - 6 + s * 0.5, 100.0, "wattmetre1-port6"
            )
            for s in range(46)
        ]
        + [_record("taurus-7", "bmc_node_power_watt", start - 6 + s, 130.0) for s in range(23)]
        + [
            _record("taurus-8", "wattmetre_power_watt", start - 6 + s * 0.5, w, port)
            for s in range(46)
            for w, port in ((60.0, "wattmetre1-port7"), (40.0, "wattmetre1-port8"))
        ]
        + [_record("taurus-9", "bmc_node_power_watt", start - 6 + s, 200.0) for s in range(23)]
    )
    hosts = ["taurus-7.lyon.grid5000.fr", "taurus-8.lyon.grid5000.fr", "taurus-9.lyon.grid5000.fr"]
    env = {"OAR_JOB_ID": "1234", "DDLC_KWOLLECT_API": kwollect_api}
    doc = energy.write_run_energy(tmp_path, hosts, start, end, env)
    query = parse_qs(urlparse(KwollectAPI.asked[0]).query)
    assert query["nodes"] == ["taurus-7,taurus-8,taurus-9"]
    assert query["metrics"] == ["wattmetre_power_watt,bmc_node_power_watt"]
    assert int(query["start_time"][0]) <= start - 5 and int(query["end_time"][0]) >= end + 5
    assert doc["status"] == "measured: kwollect"
    assert doc["joules"] == pytest.approx((100 + 100 + 200) * 10)
    assert doc["sources"]["kwollect"]["taurus-8"]["joules"] == pytest.approx(
        {"wattmetre_power_watt@wattmetre1-port7": 600, "wattmetre_power_watt@wattmetre1-port8": 400}
    )
    assert json.loads((tmp_path / "energy.json").read_text())["joules"] == doc["joules"]


def test_kwollect_missing_node_and_failing_api_are_reasons(tmp_path, kwollect_api):
    start, end = 1_750_000_000.0, 1_750_000_010.0
    KwollectAPI.records = [
        _record("taurus-7", "bmc_node_power_watt", start - 5 + s, 100.0) for s in range(21)
    ]
    hosts = ["taurus-7.lyon.grid5000.fr", "taurus-8.lyon.grid5000.fr"]
    env = {"OAR_JOB_ID": "1", "DDLC_KWOLLECT_API": kwollect_api}
    energy.query_kwollect(tmp_path, hosts, start, end, env, patience_s=0)
    status = energy.read_status(tmp_path)["kwollect"]
    assert status["taurus-7"]["available"] and not status["taurus-8"]["available"]
    assert "no power metric for taurus-8" in status["taurus-8"]["reason"]
    energy.query_kwollect(tmp_path, ["gros-1.nancy.grid5000.fr"], start, end, env, patience_s=0)
    reason = energy.read_status(tmp_path)["kwollect"]["gros-1"]["reason"]
    assert reason.startswith("Kwollect query failed: HTTP Error 404")


def test_kwollect_only_on_grid5000():
    g5k = ["dahu-1.grenoble.grid5000.fr", "dahu-2.grenoble.grid5000.fr"]
    assert energy.grid5000_site(g5k, {"OAR_JOB_ID": "7"}) == "grenoble"
    assert energy.grid5000_site(g5k, {}) is None  # not inside an OAR job
    assert energy.grid5000_site(["localhost"], {"OAR_JOB_ID": "7"}) is None
    assert energy.grid5000_site(["node1", "node2"], {"OAR_NODEFILE": "/tmp/f"}) is None


def tiny_row(**fixed):
    doc = tiny_design(energy_interval_s=0.2, **fixed)
    return doc, design.parse(doc, "tiny.yaml").runs()[0]


@pytest.mark.slow
def test_real_run_says_why_energy_is_not_available(tmp_path):
    """Here (no powercap, no NVIDIA driver, not Grid'5000): energy.json and
    the runs table say "not available" with each source's reason."""
    doc, row = tiny_row()
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    assert json.loads((folder / "done.json").read_text())["status"] == "ok"
    assert [p.name for p in folder.glob("energy_sources.rank*.json")] == [
        "energy_sources.rank0.json"
    ]  # local rank 0 only: one sampler per node
    doc_energy = json.loads((folder / "energy.json").read_text())
    assert set(doc_energy["sources"]) == {"rapl", "nvml", "kwollect"}
    if doc_energy["counted"]:
        pytest.skip(f"this machine measures energy ({doc_energy['status']})")
    assert doc_energy["joules"] is None
    for source in ("rapl", "nvml", "kwollect"):
        assert f"{source}: " in doc_energy["status"], doc_energy["status"]
    assert "not a Grid'5000 job" in doc_energy["status"]
    runs = collect.tables(design.parse(doc, "tiny.yaml"), tmp_path)
    row_out = runs["runs"].iloc[0]
    assert row_out["energy_status"] == doc_energy["status"]
    assert math.isnan(row_out["energy_j"]) and math.isnan(row_out["energy_per_image_j"])
    assert runs["epochs"]["energy_j"].isna().all()
    # energy.json or network.json of another shape: the run is damaged, the
    # file named, and the tables still built.
    for name, damaged_doc in [
        ("energy.json", [1, 2]),
        ("energy.json", {"joules": "many", "epochs": [{"epoch": "x"}]}),
        ("network.json", {"tx_bytes": "many"}),
    ]:
        sound = (folder / name).read_text() if (folder / name).exists() else None
        (folder / name).write_text(json.dumps(damaged_doc))
        row_out = collect.tables(design.parse(doc, "tiny.yaml"), tmp_path)["runs"].iloc[0]
        assert row_out["status"] == "damaged" and name in row_out["reason"], row_out["reason"]
        if sound is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(sound)


@pytest.mark.slow
def test_real_run_measures_a_powercap_counter(tmp_path, monkeypatch):
    """A real run whose sampler reads a fake powercap tree whose package
    counter a thread here advances at 20 W, wrapping every 40 J (a few
    times a run): the run's joules are 20 W times its window. A wrap every
    10 J (0.5 s) lost 20 J beside two test suites (load 10): a sampler held
    off for over 0.5 s saw two wraps as one. Real counters wrap after
    hundreds of kJ."""
    wrap_uj = 40_000_000
    links = make_powercap(tmp_path / "sys", {0: {"package": 0}}, max_uj=wrap_uj)
    package = zone(links, "intel-rapl:0")
    stop = threading.Event()

    def advance():
        uj, last = 0, time.time()
        while not stop.wait(0.02):
            now = time.time()
            uj = (uj + int(20e6 * (now - last))) % wrap_uj
            last = now
            set_energy(package, uj)

    monkeypatch.setenv("DDLC_POWERCAP_DIR", str(links))
    threading.Thread(target=advance, daemon=True).start()
    doc, row = tiny_row()
    try:
        assert runner.execute(row, tmp_path) == 0
    finally:
        stop.set()
    found = json.loads((tmp_path / row.path / "energy.json").read_text())
    assert found["status"] == "measured: rapl", found
    seconds = found["end_unix"] - found["start_unix"]
    assert seconds > 1
    assert found["joules"] == pytest.approx(20 * seconds, rel=0.1)
    metrics = json.loads((tmp_path / row.path / "metrics.json").read_text())
    assert found["start_unix"] == metrics["clock_start_unix"]  # the run clock's window
    assert sum(e["energy_j"] for e in found["epochs"]) == pytest.approx(found["joules"])
    tables = collect.tables(design.parse(doc, "tiny.yaml"), tmp_path)
    assert tables["epochs"]["energy_to_epoch_j"].iloc[-1] == pytest.approx(found["joules"])
    runs = tables["runs"].iloc[0]
    assert runs["energy_j"] == pytest.approx(found["joules"])
    assert runs["energy_per_epoch_j"] == pytest.approx(found["joules"] / 2)
    assert runs["energy_per_image_j"] == pytest.approx(found["joules"] / (2 * 12 * 64))
    # Energy to accuracy: the joules up to the first epoch at the target
    # (target_accuracy only re-analyses: the same run, another table).
    doc["fixed"]["target_accuracy"] = 0.0
    targeted = collect.tables(design.parse(doc, "tiny.yaml"), tmp_path)
    assert targeted["runs"]["energy_to_accuracy_j"].iloc[0] == pytest.approx(
        tables["epochs"]["energy_to_epoch_j"].iloc[0]
    )


def runs_table(energy_j: list):
    import pandas as pd

    return pd.DataFrame(
        {
            "run_id": [f"r{i}" for i in range(len(energy_j))],
            "status": "ok",
            "framework": "torch-ddp",
            "world_size": [1, 2][: len(energy_j)],
            "batch_size": 32,
            "energy_j": energy_j,
            "energy_per_epoch_j": [e / 2 for e in energy_j],
            "energy_per_image_j": [e / 1000 for e in energy_j],
            "energy_status": [
                "measured: rapl" if e == e else "not available: rapl: no powercap" for e in energy_j
            ],
        }
    )


def test_report_energy_section_shows_figures_or_reasons(tmp_path):
    from types import SimpleNamespace

    from analysis import energy, figures

    def section(runs):
        return energy.section(SimpleNamespace(runs=runs, figures=tmp_path)).html()

    plain = section(runs_table([float("nan")]))
    assert "Energy was not measured" in plain and "rapl: no powercap" in plain
    figures.energy(runs_table([100.0, 150.0])).save(tmp_path / "energy.png", verbose=False)
    mixed = section(runs_table([100.0, float("nan")]))
    assert "<img" in mixed and "not measured for 1 run" in mixed
    assert "<td>100 mJ</td>" in mixed  # energy_per_image_j of the measured run
