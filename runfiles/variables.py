"""Every DDLC_* environment variable, declared once: its name, default,
meaning and who reads it.

Python code reads them through ``get``; shell scripts read them themselves,
with the same defaults. ``python -m ddlcompare.plan.schema`` lists them in
docs/settings.md, and tests/test_variables.py checks that every ``DDLC_``
name anywhere in the tree is declared here. This module sits in the lowest
layer so that every layer may read it.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator, Mapping


@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None  # the value ``get`` returns when unset (None: unset)
    meaning: str
    readers: str  # who reads it
    shown_default: str = ""  # for the docs, where the default is worked out

    def described_default(self) -> str:
        if self.shown_default:
            return self.shown_default
        return "unset" if self.default is None else f"`{self.default}`"


_ALL = [
    # --- where things live ---------------------------------------------------
    Variable(
        "DDLC_CACHE",
        None,
        "the one folder of every cache: built frameworks and tools, the environments' "
        "wheels and uv's unpacked copies of them (`wheels/`, `uv/`: set-up links "
        "each environment's files from there), compiled trace readers, CIFAR-10, "
        "the same-model gate's answers, bench traces",
        "runfiles/variables.py (cache_root), envs/*.sh, bench/",
        "`$XDG_CACHE_HOME/ddl-compare`, else `~/.cache/ddl-compare`",
    ),
    Variable(
        "DDLC_SHARED",
        None,
        "the shared data beside the checkout (real traces too large to commit); "
        "tests that need it skip naming this variable",
        "tests/conftest.py",
        "../shared beside the checkout",
    ),
    Variable(
        "DDLC_SOURCES",
        None,
        "a folder of every upstream source the builds take (`<owner>+<name>/repo` git "
        "copies, Score-P's tarball), used instead of GitHub and the network: needed where "
        "GitHub cannot be reached. `./ddlc sources DIR` gathers it (envs/sources.txt pins "
        "them); a build whose sources are missing stops at once, naming them",
        "envs/build-lib.sh, envs/sources.sh, envs/build-scorep.sh",
    ),
    # --- environments -------------------------------------------------------
    Variable(
        "DDLC_VENV",
        None,
        "the torch environment (a folder holding bin/python)",
        "ddlc, envs/setup.sh, ddlcompare/plan/envs.py",
        ".venv in the checkout",
    ),
    Variable(
        "DDLC_TAKE_OVER_ENV",
        None,
        "1: set-up may re-point an environment another checkout set up (it refuses otherwise)",
        "envs/setup.sh",
    ),
    Variable(
        "DDLC_VENV_TENSORFLOW",
        None,
        "the TensorFlow environment",
        "envs/setup.sh, ddlcompare/plan/envs.py",
        ".venv-tf in the checkout",
    ),
    Variable(
        "DDLC_VENV_TARANTELLA",
        None,
        "Tarantella's environment",
        "ddlcompare/plan/envs.py",
        ".venv-tarantella in the checkout, else envs/build-tarantella.sh's",
    ),
    Variable(
        "DDLC_VENV_LBANN",
        None,
        "LBANN's environment",
        "ddlcompare/plan/envs.py",
        ".venv-lbann in the checkout, else envs/build-lbann.sh's",
    ),
    Variable(
        "DDLC_TARANTELLA_PREFIX",
        None,
        "where envs/build-tarantella.sh installs Tarantella",
        "envs/build-tarantella.sh",
        "$DDLC_CACHE/tarantella-v0.8.0",
    ),
    Variable(
        "DDLC_TARANTELLA_PATCHED_PREFIX",
        None,
        "where `envs/build-tarantella.sh patched` installs Tarantella with our patch",
        "envs/build-tarantella.sh",
        "$DDLC_CACHE/tarantella-v0.8.0-patched",
    ),
    Variable(
        "DDLC_VENV_TARANTELLA_PATCHED",
        None,
        "the patched Tarantella's environment",
        "ddlcompare/plan/envs.py",
        ".venv-tarantella-patched in the checkout, else `envs/build-tarantella.sh patched`'s",
    ),
    Variable(
        "DDLC_KNOBS_TIMELINE",
        None,
        "the file Horovod's adapter writes its short knob-checking timeline to (set by the runner)",
        "frameworks/knobs.py, frameworks/adapters/horovod_torch.py",
    ),
    Variable(
        "DDLC_PYTHON39",
        None,
        "the python3.9 that envs/build-tarantella.sh uses",
        "envs/build-tarantella.sh",
        "found on PATH or through pyenv",
    ),
    Variable(
        "DDLC_LBANN_PREFIX",
        None,
        "where envs/build-lbann.sh builds LBANN",
        "envs/build-lbann.sh",
        "$DDLC_CACHE/lbann",
    ),
    Variable(
        "DDLC_LBANN_SOURCE",
        None,
        "an LBANN source tree (a checkout or a git directory) whose Python front end "
        "is used without an LBANN build",
        "frameworks/lbann_source.py",
        "envs/build-lbann.sh's checkout",
    ),
    Variable(
        "DDLC_LBANN_REF",
        "HEAD",
        "the commit of DDLC_LBANN_SOURCE to use when it is a git directory",
        "frameworks/lbann_source.py",
    ),
    # --- readers and measurement --------------------------------------------
    Variable(
        "DDLC_OTF2_READER",
        None,
        "'python': read OTF2 with the Python reader even where the C one is built",
        "traces/readers/otf2_reader.py",
    ),
    Variable(
        "DDLC_JSON_SCANNER",
        None,
        "'msgspec': read Kineto JSON with msgspec alone even where the C scanner is built",
        "traces/fastjson/__init__.py",
    ),
    Variable(
        "DDLC_MEASURE_LOCK",
        None,
        "the host-wide lock that training runs take while they measure",
        "ddlcompare/run/machine_lock.py",
        "/tmp/ddl-compare.measure.lock",
    ),
    Variable(
        "DDLC_MACHINE_HELD",
        None,
        "set by a measurement while it holds the machine (its pid): what it starts "
        "is part of it and takes no lock of its own",
        "ddlcompare/run/machine_lock.py, workflows/share_machine.sh",
    ),
    Variable(
        "DDLC_MACHINE_SHARED",
        None,
        "1: runs that only check correctness (the test suite sets it): their trainings and "
        "probes hold the measuring lock shared, overlapping one another but never a "
        "measurement, and record `machine_shared`; analysis counts them as not clean",
        "ddlcompare/run/machine_lock.py (set by tests/conftest.py)",
    ),
    Variable(
        "DDLC_JOB_WAITED_S",
        None,
        "seconds a workflow job's shell waited for the machine before its command began",
        "ddlcompare/run/machine_lock.py (set by workflows/share_machine.sh)",
    ),
    Variable(
        "DDLC_ATTEMPTS",
        None,
        "the folder where live run attempts register (the overlap check reads it)",
        "ddlcompare/run/machine_lock.py",
        "/tmp/ddl-compare.attempts",
    ),
    Variable(
        "DDLC_POWERCAP_DIR",
        "/sys/class/powercap",
        "the powercap tree RAPL energy is read from",
        "runfiles/energy.py",
    ),
    Variable(
        "DDLC_KWOLLECT_API",
        "https://api.grid5000.fr/stable",
        "Grid'5000's metrics API (Kwollect) energy is read from",
        "runfiles/energy.py",
    ),
    Variable(
        "DDLC_STALL_FLOOR_S",
        "120",
        "the shortest silence that counts as a hang: between two epochs (at least 10 times "
        "the slowest epoch so far), and of every rank's heartbeat inside the first epoch; "
        "the run is stopped and recorded failed",
        "ddlcompare/run/stall.py",
    ),
    # Its default is compiled into the patch (C++ cannot read this module):
    # tests/test_tarantella_patched.py holds the two equal.
    Variable(
        "DDLC_GASPI_SWEEP_PAUSE_US",
        "50",
        "the patched GaspiCxx's pause between sweeps of its progress thread while a "
        "collective runs, in microseconds; 0: upstream's spinning (never sleeps)",
        "envs/patches/tarantella/GaspiCxx/IdleWait.cpp",
    ),
    Variable(
        "DDLC_SLOW_RANKS",
        None,
        "RANK:SECONDS_PER_IMAGE[,...]: ranks that sleep that long per image, to emulate "
        "a slower device",
        "frameworks/balance.py",
    ),
    # --- schedulers and launchers -------------------------------------------
    Variable(
        "DDLC_SRUN_MPI",
        "pmix",
        "the MPI plugin srun starts LBANN with ('' for slurm.conf's MpiDefault)",
        "ddlcompare/run/schedulers/slurm.py",
    ),
    # --- set by the harness for its own processes ---------------------------
    Variable(
        "DDLC_NETNS_MAP",
        None,
        "set by the harness: 'address=namespace=hostname ...' of the emulated network",
        "ddlcompare/run/netem.py, ddlcompare/run/schedulers/netns_as_ssh/ssh",
    ),
    Variable(
        "DDLC_LOCAL_RANK",
        None,
        "set by the harness: a TensorFlow worker's rank on its node",
        "frameworks/adapters/tf_mwms.py",
    ),
    Variable(
        "DDLC_LBANN_RUN_ARGS",
        None,
        "set by the harness: lbann.run's scheduler and launch arguments, as JSON",
        "frameworks/lbann_family.py",
    ),
    Variable(
        "DDLC_WORKFLOW_PID",
        None,
        "set by the Snakefile: 'pid:start time' of the workflow's main process",
        "runfiles/ownership.py",
    ),
    Variable(
        "DDLC_STOP_FILE",
        None,
        "set by the workflow: a file it creates when Snakemake is told to stop; "
        "jobs still waiting for the machine then end without starting",
        "ddlcompare/run/machine_lock.py, workflows/share_machine.sh",
    ),
    Variable(
        "DDLC_CLUSTER_MARK",
        None,
        "set by `./ddlc cluster up` in the environment of every daemon it starts "
        "(their children inherit it): `down` stops every process that carries "
        "this cluster's mark",
        "ddlcompare/run/cluster.py",
    ),
    Variable(
        "DDLC_DESIGN_DIGEST",
        None,
        "set by the workflow: its design file's digest, to tell a design edited mid-campaign",
        "ddlcompare/plan/yaml_safe.py",
    ),
    # --- the test schedulers (envs/schedulers/) -------------------------------
    Variable(
        "DDLC_SLURM_DIR",
        None,
        "the test Slurm's configuration, state and logs",
        "envs/schedulers/slurm.sh",
        "/var/lib/ddlc-test/slurm",
    ),
    Variable(
        "DDLC_OAR_DIR",
        None,
        "the test OAR's state",
        "envs/schedulers/oar.sh",
        "/var/lib/ddlc-test/oar",
    ),
    Variable("DDLC_OAR_USER", None, "the test OAR's user", "envs/schedulers/oar.sh", "ddlcoar"),
    Variable(
        "DDLC_OAR_NODES",
        None,
        "the test OAR's nodes, `host=namespace=address=cpus ...` (./ddlc cluster sets it)",
        "envs/schedulers/oar.sh",
        "localhost",
    ),
    Variable(
        "DDLC_CLUSTER_DIR",
        "/var/lib/ddlc-cluster",
        "the state of the cluster on one machine (./ddlc cluster)",
        "ddlcompare/run/cluster.py",
    ),
    Variable("DDLC_OAR_UID", None, "that user's uid", "envs/schedulers/oar.sh", "64321"),
    Variable("DDLC_OAR_CORES", None, "cores the test OAR offers", "envs/schedulers/oar.sh", "4"),
]

VARIABLES = {v.name: v for v in _ALL}


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's value in ``env`` (default: this process's), else its
    declared default; KeyError for a name not declared here."""
    variable = VARIABLES[name]
    return (os.environ if env is None else env).get(name, variable.default)


def value(name: str, env: Mapping[str, str] | None = None) -> str:
    """``get`` for a variable whose default is declared: never None."""
    found = get(name, env)
    if found is None:
        raise KeyError(f"{name} has no declared default")
    return found


def number(name: str, text: str, least: float = 0.0) -> float:
    """``text``, the value of variable ``name`` (or a part of it), as a
    finite number >= ``least``; ValueError naming the variable otherwise
    (float() takes 'nan', 'inf' and '-1' that no wait or count means)."""
    try:
        found = float(text)
    except ValueError:
        found = math.nan
    if not (math.isfinite(found) and found >= least):
        raise ValueError(f"{name}={text!r} is not a finite number >= {least:g}; unset it or fix it")
    return found


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The one folder every cache lives under (DDLC_CACHE)."""
    env = os.environ if env is None else env
    if env.get("DDLC_CACHE"):
        return Path(env["DDLC_CACHE"])
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ddl-compare"


def cache(*parts: str) -> Path:
    """A place under the cache root."""
    return cache_root().joinpath(*parts)


@contextlib.contextmanager
def setting(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process's environment while the
    block runs, then as it was (unset where it was unset): for settings a
    library reads once, as it loads, that must not reach later children."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved
