"""Start this node's processes of a run, each with its own TF_CONFIG, and
wait for them (the 'tf-workers' launcher's process starter):

    python -m ddlcompare.run.spawn --per-node K --workers h1:p1,h1:p2,h2:p1,... -- CMD...

MultiWorkerMirroredStrategy reads its place in the cluster from TF_CONFIG,
which differs per process, so no plain per-node starter (srun, mpirun) can
set it. Each node runs one spawner; its index comes from that starter
(srun --ntasks-per-node=1: SLURM_PROCID; mpirun --npernode 1:
OMPI_COMM_WORLD_RANK; alone: 0), and its j-th process is worker
``index * K + j``. When a process fails, the
others are stopped (they would wait for it forever in a collective) and the
spawner exits with the failed process's status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

# Set by the per-node starters, which start one task per node: the task's
# rank is the node's index in the host list.
NODE_INDEX_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def tf_config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def node_index(env: dict) -> int:
    for name in NODE_INDEX_VARIABLES:
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


def process_envs(workers: list[str], per_node: int, env: dict) -> list[dict]:
    """The environment of each process this node starts."""
    first = node_index(env) * per_node
    if first + per_node > len(workers):
        raise SystemExit(
            f"spawn: node {node_index(env)} with {per_node} processes per node "
            f"is beyond the {len(workers)} workers listed"
        )
    return [
        {**env, "TF_CONFIG": tf_config(workers, first + j), "DDLC_LOCAL_RANK": str(j)}
        for j in range(per_node)
    ]


def run(command: list[str], envs: list[dict]) -> int:
    children = [subprocess.Popen(command, env=e) for e in envs]
    ranks = {c.pid: json.loads(e["TF_CONFIG"])["task"]["index"] for c, e in zip(children, envs)}

    def stop(signum, _frame):
        _terminate(children)
        sys.exit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    pending = {c.pid: c for c in children}
    while pending:
        pid, status = os.wait()
        if pid not in pending:
            continue
        pending.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            print(
                f"spawn: rank {ranks[pid]} (pid {pid}) killed by signal {-code}",
                file=sys.stderr,
                flush=True,
            )
        if code != 0:
            _terminate(list(pending.values()))
            return code if code > 0 else 128 - code
    return 0


def _terminate(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-node", type=int, required=True)
    parser.add_argument("--workers", required=True, help="host:port of every worker, in order")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    envs = process_envs(args.workers.split(","), args.per_node, dict(os.environ))
    sys.exit(run(command, envs))


if __name__ == "__main__":
    main()
