"""OAR (Grid'5000), seen from its jobs: $OAR_NODEFILE names the hosts, and
nodes are reached with oarsh (``oarsh_as_ssh`` for launchers that run plain
ssh); and the job end command of the OAR executor plugin
(snakemake-executor-plugin-oar, profiles/grid5000 sets
``oar-job-end-command``), which records what OAR's kills leave unsaid:

    python -m ddlcompare.run.schedulers.oar JOBID success|failed WORDS OUTPUT...

OAR ends a job by SIGKILL to all its processes (a walltime, an oardel, a lost
node), so the run cannot record that itself: this records it in the run's
run.json, in OAR's words (its state, lost nodes and events, as the plugin
gives them). A failed job whose run left no done marker is recorded
interrupted and its folder released (unless the record is another job's
attempt, which this job's runner found running); a run that failed inside
a job OAR has more to say of (a node lost under it: the run saw only its
ranks die) gets OAR's words beside its own. Standard library only (and runfiles/, and the
schedulers' registry): it runs with any python3 from 3.9.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ddlcompare.run.schedulers import Scheduler, register
from runfiles import files
from runfiles.atomic import write_json
from runfiles.names import DONE, OWNER, RANK_RECORD_GLOB, RUN_RECORD


@register
class Oar(Scheduler):
    name = "oar"
    job_variable = "OAR_JOB_ID"
    rsh_agent = "oarsh"
    # An ``ssh`` that calls oarsh, for launchers that run plain ssh (Gloo).
    ssh_dir = Path(__file__).resolve().parent / "oarsh_as_ssh"

    @staticmethod
    def detected(env) -> bool:
        return bool(env.get("OAR_NODEFILE"))

    def host_names(self, env) -> list[str]:
        return distinct_hosts(Path(env["OAR_NODEFILE"]).read_text())

    def lbann_run_args(self, env, hosts=()) -> dict:
        args = super().lbann_run_args(env, hosts)
        return {
            **args,
            "launcher_args": args["launcher_args"]
            + ["--hostfile", env["OAR_NODEFILE"], "--mca", "plm_rsh_agent", "oarsh"],
        }


def distinct_hosts(nodefile_text: str) -> list[str]:
    """$OAR_NODEFILE lists one line per core: the distinct hosts, in order."""
    return list(dict.fromkeys(nodefile_text.split()))


# --- the job end command ---
USAGE = "usage: python -m ddlcompare.run.schedulers.oar JOBID success|failed WORDS OUTPUT..."


def record_stop(marker: str, reason: str) -> None:
    """The run's record says it was stopped, and why, where its runner was
    killed before it could (status still running); its folder is released,
    so that the next attempt, on any node, may claim it at once."""
    run_dir = Path(marker).parent
    try:
        record = files.read_json(run_dir / RUN_RECORD)
    except (OSError, ValueError):
        return  # the run never started: nothing to correct
    if not isinstance(record, dict) or record.get("status") != "running":
        return  # ended, or not a record the runner wrote: nothing to correct
    record.update(
        status="interrupted",
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        reason=f"stopped by OAR ({reason}); the next workflow run starts it again",
        ranks=ranks(run_dir),  # as the runner records them when it can
    )
    try:
        write_json(run_dir / RUN_RECORD, record)
        (run_dir / OWNER).unlink(missing_ok=True)
    except OSError as exc:  # the job's status matters more to Snakemake than the record
        print(f"oar job end: cannot record the stop in {run_dir}: {exc}", file=sys.stderr)


def ranks(run_dir: Path) -> list[dict]:
    """Each rank's record that is whole (one cut short by the kill is left out)."""
    found = []
    for path in sorted(run_dir.glob(RANK_RECORD_GLOB)):
        try:
            found.append(files.read_json(path))
        except (OSError, ValueError):
            pass
    return found


def note_failure(marker: str, reason: str) -> None:
    """A run that failed inside a job OAR has more to say of (a node lost
    under it: the run saw only its ranks die) gets OAR's words beside its
    own, in its done marker and its record."""
    for path in (Path(marker), Path(marker).with_name(RUN_RECORD)):
        try:
            doc = files.read_json(path)
            if (
                isinstance(doc, dict)
                and doc.get("status") == "failed"
                and "OAR job " not in str(doc.get("reason"))
            ):
                write_json(path, {**doc, "reason": f"{doc.get('reason')}; {reason}"})
        except (OSError, ValueError) as exc:
            print(f"oar job end: cannot note OAR's words in {path}: {exc}", file=sys.stderr)


def another_jobs(marker: Path, job: str) -> bool:
    """Whether the run's record is another job's attempt: this job's runner
    found it still running and left it (a workflow started again while its
    earlier job ran on), and its failure is no stop of that attempt."""
    try:
        record = files.read_json(marker.with_name(RUN_RECORD))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("job") not in (None, job)


def record(job: str, verdict: str, words: str, outputs: list[str]) -> None:
    """Only a run's job (the one whose outputs hold its done marker) is
    recorded, in the attempt that job ran."""
    for marker in (Path(o) for o in outputs if Path(o).name == DONE):
        if another_jobs(marker, job):
            continue
        if verdict == "failed" and not marker.exists():
            record_stop(str(marker), words)
        elif marker.exists():
            note_failure(str(marker), words)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] not in ("success", "failed"):
        print(USAGE, file=sys.stderr)
        return 2
    record(args[0], args[1], args[2], args[3:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
