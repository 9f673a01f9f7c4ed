"""Stopping what a launcher leaves: a process that has exited and only waits
to be reaped (a zombie) has ended. Its parent may never reap it, and an
orphan's new parent, PID 1, reaps it when it gets to it: 1-2 s later on
some machines (a VM's own init), which every run paid while its launcher's
session was cleared."""

import signal
import subprocess
import sys
import time

import psutil

from ddlcompare.run import stopping
from runfiles import ownership

# A parent that forks a child which exits at once, says the child's pid, and
# sleeps without reaping it: the child stays a zombie while the parent lives.
NEGLECTFUL_PARENT = (
    "import os, sys, time\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    os._exit(0)\n"
    "print(child, flush=True)\n"
    "time.sleep(60)\n"
)


def neglectful_parent() -> tuple[subprocess.Popen, psutil.Process]:
    parent = subprocess.Popen(
        [sys.executable, "-c", NEGLECTFUL_PARENT], stdout=subprocess.PIPE, start_new_session=True
    )
    child = psutil.Process(int(parent.stdout.readline()))
    deadline = time.monotonic() + 10
    while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.status() == psutil.STATUS_ZOMBIE
    return parent, child


def test_a_zombie_has_ended_though_nobody_reaps_it():
    parent, child = neglectful_parent()
    try:
        start = time.monotonic()
        assert ownership.wait_ended([child], timeout=5) == []
        assert time.monotonic() - start < 1  # psutil.wait_procs waited the whole 5 s
        assert ownership.ended(child) and not ownership.ended(psutil.Process(parent.pid))
    finally:
        parent.kill()
        parent.wait()


def test_a_session_left_with_a_zombie_is_cleared_at_once():
    parent, child = neglectful_parent()
    start = time.monotonic()
    stopping.stop_session(parent.pid)  # kills the parent; its child is PID 1's to reap
    assert time.monotonic() - start < 1
    assert parent.wait(timeout=5) == -signal.SIGKILL
    assert ownership.ended(child)
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE


def test_a_running_process_is_still_waited_for():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = time.monotonic()
        assert ownership.wait_ended([psutil.Process(sleeper.pid)], timeout=0.5) != []
        assert time.monotonic() - start >= 0.5
    finally:
        sleeper.kill()
        sleeper.wait()
