"""The network's own limit: the mpi4py all-reduce probe run for real with
two processes, its message sizes from the model specification, and the
report's comparison of achieved gradient-exchange bandwidth against it."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from analysis import network_limit
from conftest import REPO
from ddlcompare import probe

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def test_sizes_are_the_cnn_gradients():
    # conv 32x1x3x3+32, conv 64x32x3x3+64, dense 3136x128+128, dense 128x10+10
    layers = [320, 18496, 401536, 1290]
    assert probe.gradient_sizes("cnn", "fashion-mnist") == sorted(
        [4 * n for n in layers] + [4 * sum(layers)])


def test_probe_runs_over_mpi(tmp_path):
    out = tmp_path / "probe-2.json"
    done = subprocess.run(["mpirun", "-n", "2", sys.executable, "-m", "ddlcompare.probe",
                           "--out", str(out), "--repeats", "3"], cwd=REPO, timeout=240,
                          capture_output=True, text=True, env={**os.environ, **MPI_ENV})
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["processes"] == 2 and doc["mpi"].startswith("Open MPI")
    sizes = [row["bytes"] for row in doc["sizes"]]
    assert sizes == probe.gradient_sizes("cnn", "fashion-mnist")
    for row in doc["sizes"]:
        assert row["seconds"] > 0
        assert row["algbw_bytes_per_s"] == pytest.approx(row["bytes"] / row["seconds"])
        assert row["busbw_bytes_per_s"] == pytest.approx(row["algbw_bytes_per_s"])  # 2(P-1)/P


def test_achieved_bandwidth_against_the_probe():
    runs = pd.DataFrame([
        {"run_id": "h", "status": "ok", "framework": "horovod-torch", "world_size": 2,
         "batch_size": 64},
        {"run_id": "d", "status": "ok", "framework": "torch-ddp", "world_size": 2,
         "batch_size": 64}])
    steps = pd.DataFrame([
        {"run_id": "h", "rank": r, "comm_bytes_mean": 2e6, "grad_comm_mean_s": 0.01}
        for r in (0, 1)] + [
        {"run_id": "d", "rank": r, "comm_bytes_mean": 2e6, "grad_comm_mean_s": 0.0}
        for r in (0, 1)])
    found = {2: pd.DataFrame({"bytes": [1e6, 4e6], "algbw_bytes_per_s": [4e8, 8e8]})}
    table = network_limit.compare(runs, steps, found).set_index("framework")
    assert table.loc["horovod-torch", "achieved_mb_s"] == pytest.approx(200)
    # 2 MB lies halfway between 1 and 4 MB on a log scale: 600 MB/s
    assert table.loc["horovod-torch", "probe_mb_s"] == pytest.approx(600)
    assert table.loc["horovod-torch", "share_of_probe"] == pytest.approx(1 / 3)
    assert pd.isna(table.loc["torch-ddp", "achieved_mb_s"])  # nothing exposed to divide by
