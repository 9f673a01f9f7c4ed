"""What the GaspiCxx benches share (bench/gaspi_allreduce_latency.py,
bench/gaspi_setup_hangs.py): the two Tarantella builds, our C++ program
(bench/gaspi_collectives.cpp) compiled against each build's GaspiCxx, and
one launch of it on 2 ranks of this machine with GPI-2's gaspi_run, watched:
a launch whose rank 0 prints nothing for a while has hung, and is stopped
(its process group, which holds every rank: envs/local-ssh starts them
here without an ssh server). Each launch holds the machine's GPI-2 lock, as
Tarantella's runs do."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.plan import envs  # noqa: E402
from ddlcompare.run.launchers.tarantella import GPI2_LOCK  # noqa: E402
from measuring import bench_cache  # noqa: E402

SOURCE = REPO / "bench" / "gaspi_collectives.cpp"
BUILDS = {"plain": "tarantella", "patched": "tarantella-patched"}  # bench name: environment
PAUSE_VARIABLE = "DDLC_GASPI_SWEEP_PAUSE_US"  # read by the patched build only
RANKS = 2


class Unavailable(Exception):
    """A build or a tool the bench needs is missing: one line says which."""


def prefix(build: str) -> Path:
    """The build's prefix (GPI-2, GaspiCxx and Tarantella installed in it)."""
    env = BUILDS[build]
    folder = envs.env_dir(env)
    if not (folder / "lib" / "libGaspiCxx.so").exists():
        variant = " patched" if build == "patched" else ""
        raise Unavailable(
            f"no {env} build at {folder}: run 'bash envs/build-tarantella.sh{variant}' "
            f"(or point {envs.variable(env)} at one)"
        )
    return folder


def program(build: str) -> Path:
    """Our program, compiled against the build's GaspiCxx (cached by the
    source's and the library's content; compiled aside, renamed into place)."""
    root = prefix(build)
    library = (root / "lib" / "libGaspiCxx.so").resolve()
    key = hashlib.sha256(SOURCE.read_bytes() + library.read_bytes()).hexdigest()[:12]
    target = bench_cache() / "gaspi" / f"gaspi_collectives-{build}-{key}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        argv = ["g++", "-std=c++17", "-O2", "-pthread", f"-I{root / 'include'}", str(SOURCE)]
        argv += ["-o", str(built), f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}"]
        done = subprocess.run([*argv, "-lGaspiCxx", "-lGPI2"], capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(
                f"compiling {SOURCE.name} against {root} failed: {done.stderr[-400:]}"
            )
        built.rename(target)
    return target


@dataclass
class Launch:
    """One gaspi_run of the program: rank 0's lines, and how it ended."""

    lines: list[str] = field(default_factory=list)
    hung: bool = False
    returncode: int | None = None
    stderr: str = ""
    seconds: float = 0.0


def launch(build: str, args: list[str], silence_s: float, pause_us: int | None = None) -> Launch:
    """Runs the program on 2 ranks here; stops it once rank 0 has printed
    nothing for ``silence_s`` (``hung``). ``pause_us`` sets the patched
    progress thread's pause (None: the build's default)."""
    root, binary = prefix(build), program(build)
    env = {k: v for k, v in os.environ.items() if k != PAUSE_VARIABLE}
    env["PATH"] = os.pathsep.join(
        [str(REPO / "envs" / "local-ssh"), str(root / "bin"), env["PATH"]]
    )
    env["LD_LIBRARY_PATH"] = str(root / "lib")
    if pause_us is not None:
        env[PAUSE_VARIABLE] = str(pause_us)
    with tempfile.TemporaryDirectory() as tmp:
        machines = Path(tmp) / "machinefile"
        machines.write_text(f"{os.uname().nodename}\n" * RANKS)
        argv = ["gaspi_run", "-m", str(machines), "-n", str(RANKS), str(binary), *args]
        with gpi2_lock():  # taken before the watch starts: a wait for it is no hang
            return _watched(argv, env, silence_s, Path(tmp) / "stderr")


@contextlib.contextmanager
def gpi2_lock():
    """GPI-2 listens on fixed ports: one job a machine at a time (the lock
    Tarantella's runs take); says once that it waits."""
    with GPI2_LOCK.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {GPI2_LOCK} (another GPI-2 job)", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _watched(argv: list[str], env: dict, silence_s: float, stderr_path: Path) -> Launch:
    result, started = Launch(), time.monotonic()
    with stderr_path.open("w+") as stderr:
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=stderr, bufsize=0, start_new_session=True
        )
        result.lines, result.hung = _lines_until_silent(child.stdout.fileno(), silence_s)
        _stop(child, at_once=result.hung)
        stderr.seek(0)
        result.stderr = stderr.read()[-2000:]
    result.returncode, result.seconds = child.returncode, time.monotonic() - started
    return result


def _lines_until_silent(fd: int, silence_s: float) -> tuple[list[str], bool]:
    """The lines read from ``fd`` until its end, and whether it fell silent
    for ``silence_s`` first. Unbuffered reads: a line read is counted at
    once, never held in a buffer the watch cannot see."""
    watch, pending = selectors.DefaultSelector(), b""
    watch.register(fd, selectors.EVENT_READ)
    lines: list[str] = []
    while True:
        if not watch.select(timeout=silence_s):
            return lines, True
        chunk = os.read(fd, 65536)
        if not chunk:
            return lines + ([pending.decode()] if pending else []), False
        *complete, pending = (pending + chunk).split(b"\n")
        lines += [line.decode() for line in complete]


def _stop(child: subprocess.Popen, at_once: bool) -> None:
    """Ends the launch's process group (gaspi_run and the ranks it started),
    at once for a hung launch, else once gaspi_run has returned (its ranks
    may linger). SIGKILL: gaspi_run's own trap would kill by program name."""
    if not at_once:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
    child.stdout.close()
