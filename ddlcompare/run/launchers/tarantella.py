"""tarantella: Tarantella's own launcher (gaspi_run underneath)."""

from __future__ import annotations

import os
from pathlib import Path

from ddlcompare.run.provenance import REPO
from ddlcompare.run.launch import LOCAL_SSH, base_env, python, refuse_untraceable, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from frameworks.knobs import GASPI_PAUSE_VARIABLE
from runfiles.run_config import RunConfig

GPI2_LOCK = Path("/tmp/ddlc-gpi2.lock")  # one GPI-2 (Tarantella) job per machine at a time


@launcher("tarantella")
def tarantella(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    """Tarantella's own launcher: ``-n N`` on one node, a hostfile of the
    scheduler's nodes and ``--n-per-node K`` on several. It starts the ranks
    with gaspi_run over plain ssh (on OAR: a job with -t allow_classic_ssh)."""
    refuse_untraceable(config)
    executable = Path(python(config)).parent / "tarantella"
    if not executable.exists():
        raise RuntimeError(
            f"{executable} not found: build the 'tarantella' environment "
            "with 'bash envs/build-tarantella.sh' (notes: envs/tarantella.md) "
            "or set DDLC_VENV_TARANTELLA"
        )
    env = base_env(config)
    argv = [str(executable)]
    if len(hosts) == 1:
        argv += ["-n", str(hosts[0].slots)]
    else:
        hostfile = run_dir / "hostfile"
        hostfile.write_text("".join(f"{h.name}\n" for h in hosts))
        argv += ["--hostfile", str(hostfile), "--n-per-node", str(hosts[0].slots)]
    if config["device"] == "cpu":
        argv.append("--no-gpu")
    if config.get("fusion_threshold_kib") is not None:
        argv.append(f"--fusion-threshold={config['fusion_threshold_kib']}")
    if config.get("gaspi_sweep_pause_us") is not None:  # the patched GaspiCxx reads it
        env[GASPI_PAUSE_VARIABLE] = str(config["gaspi_sweep_pause_us"])
    # gaspi_run's ranks see only PATH, PYTHONPATH, LD_LIBRARY_PATH, TF_* and
    # TNT_* from here: the rest of the run's environment goes through -x.
    argv += ["-x", *(f"{k}={v}" for k, v in env.items())]
    path = [str(executable.parent), os.environ.get("PATH", "")]
    # Each rank under a guard: gaspi_run neither reports a rank a signal
    # ended nor stops its peers (ddlcompare/run/rank_guard.py).
    argv += ["--", "-m", "ddlcompare.run.rank_guard", str(run_dir)]
    if scheduler.ssh_dir:  # gaspi_run starts every rank with "ssh"
        path.insert(0, str(scheduler.ssh_dir))
    if len(hosts) == 1 and scheduler.this_host:
        path.insert(0, str(LOCAL_SSH))  # gaspi_run's ssh to this host, run here
        # GPI-2 listens on fixed ports: a second job on the node at the same
        # time fails ("Gaspi error: Device operation error"). One at a time.
        argv = ["flock", str(GPI2_LOCK), *argv]
    env["PATH"] = ":".join(path)
    # Tarantella's launcher writes its machine file into the working
    # directory: the run's folder, not the checkout (which the job's user
    # may not own); the ranks find the harness through PYTHONPATH instead.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return ["sh", "-c", 'cd "$0" && exec "$@"', str(run_dir), *argv], env
