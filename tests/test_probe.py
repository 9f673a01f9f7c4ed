"""The network's own limit: the mpi4py all-reduce probe run for real with
two processes, its message sizes from the model specification, and the
report's comparison of achieved gradient-exchange bandwidth against it."""

import json
import subprocess
import sys

import pandas as pd
import psutil
import pytest

from analysis import network_limit
from conftest import REPO
from ddlcompare.run import netem, probe


def test_sizes_are_the_cnn_gradients():
    # conv 32x1x3x3+32, conv 64x32x3x3+64, dense 3136x128+128, dense 128x10+10
    layers = [320, 18496, 401536, 1290]
    assert probe.gradient_sizes("cnn", "fashion-mnist") == sorted(
        [4 * n for n in layers] + [4 * sum(layers)]
    )


def run_probe(out, options: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """python -m ddlcompare.run.probe OPTIONS --out OUT, as the workflow runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ddlcompare.run.probe", *options.split(), "--out", str(out)],
        cwd=REPO,
        timeout=timeout,
        capture_output=True,
        text=True,
    )


def test_probe_runs_over_mpi(tmp_path):
    out = tmp_path / "probe-2.json"
    done = run_probe(out, "--nodes 1 --procs-per-node 2 --repeats 3")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["processes"] == 2 and doc["nodes"] == 1 and doc["mpi"].startswith("Open MPI")
    sizes = [row["bytes"] for row in doc["sizes"]]
    assert sizes == probe.gradient_sizes("cnn", "fashion-mnist")
    for row in doc["sizes"]:
        assert row["seconds"] > 0
        assert row["algbw_bytes_per_s"] == pytest.approx(row["bytes"] / row["seconds"])
        assert row["busbw_bytes_per_s"] == pytest.approx(row["algbw_bytes_per_s"])  # 2(P-1)/P


def test_achieved_bandwidth_against_the_probe():
    runs = pd.DataFrame(
        [
            {
                "run_id": "h",
                "status": "ok",
                "framework": "horovod-torch",
                "world_size": 2,
                "batch_size": 64,
            },
            {
                "run_id": "d",
                "status": "ok",
                "framework": "torch-ddp",
                "world_size": 2,
                "batch_size": 64,
            },
        ]
    )
    steps = pd.DataFrame(
        [
            {"run_id": "h", "rank": r, "comm_bytes_mean": 2e6, "grad_comm_mean_s": 0.01}
            for r in (0, 1)
        ]
        + [
            {"run_id": "d", "rank": r, "comm_bytes_mean": 2e6, "grad_comm_mean_s": 0.0}
            for r in (0, 1)
        ]
    )
    found = {(1, 2, None): pd.DataFrame({"bytes": [1e6, 4e6], "algbw_bytes_per_s": [4e8, 8e8]})}
    table = network_limit.compare(runs, steps, found).set_index("framework")
    assert table.loc["horovod-torch", "achieved_mb_s"] == pytest.approx(200)
    # 2 MB lies halfway between 1 and 4 MB on a log scale: 600 MB/s
    assert table.loc["horovod-torch", "probe_mb_s"] == pytest.approx(600)
    assert table.loc["horovod-torch", "share_of_probe"] == pytest.approx(1 / 3)
    assert pd.isna(table.loc["torch-ddp", "achieved_mb_s"])  # nothing exposed to divide by


@pytest.mark.skipif(bool(netem.problems("local")), reason="; ".join(netem.problems("local")))
def test_probe_on_the_emulated_network_finds_its_rate(tmp_path):
    """Two emulated nodes at 100 Mbit/s: the probe's Sendrecv ring and its
    all-reduce of the whole model's gradients (1.69 MB; busbw, what each
    link carries each way) come out near the rate and never above it. Plain
    TCP streams get 90-95 % of it each way with both ways busy; the probe
    with Open MPI's default of one TCP connection per pair got 41-48 %, with
    its four 71-94 % (bench/probe_network.py, docs/network.md)."""
    out = tmp_path / "probe.json"
    done = run_probe(out, "--nodes 2 --procs-per-node 1 --net-rate-mbit 100 --repeats 3")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["nodes"] == 2 and doc["net_rate_mbit"] == 100 and len(doc["hosts"]) == 2
    assert doc["tcp_links"] == probe.TCP_LINKS
    assert 0.65 * 12.5e6 < doc["link_bytes_per_s"] < 1.01 * 12.5e6, doc["link_bytes_per_s"]
    whole = doc["sizes"][-1]["busbw_bytes_per_s"]
    assert 0.65 * 12.5e6 < whole < 1.01 * 12.5e6, doc["sizes"][-1]


def test_a_probe_past_its_timeout_is_stopped_with_all_it_started(tmp_path):
    out = tmp_path / "probe.json"
    # a hundred thousand repeats take minutes
    done = run_probe(out, "--nodes 1 --procs-per-node 2 --repeats 100000 --timeout 2", 120)
    assert done.returncode == 1 and "no result after 2 s, stopped" in done.stderr
    assert not out.exists()
    ranks = [
        p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])
    ]
    _, left = psutil.wait_procs(ranks, timeout=10)  # stopped, if not yet reaped
    assert left == []
