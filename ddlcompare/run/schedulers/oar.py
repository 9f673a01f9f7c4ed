"""OAR (Grid'5000): $OAR_NODEFILE; nodes are reached with oarsh."""

from __future__ import annotations

from pathlib import Path

from ddlcompare.run.schedulers import Scheduler, register


@register
class Oar(Scheduler):
    name = "oar"
    rsh_agent = "oarsh"
    # An ``ssh`` that calls oarsh, for launchers that run plain ssh (Gloo).
    ssh_dir = Path(__file__).resolve().parent.parent / "oarsh_as_ssh"

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
