"""No scheduler: every node of the design is this machine."""

from __future__ import annotations

from ddlcompare.run.schedulers import Host, Scheduler, register


@register
class Local(Scheduler):
    name = "local"
    one_machine = True
    this_host = True
    fallback = True

    @staticmethod
    def detected(env) -> bool:
        return True

    def hosts(self, nodes, procs_per_node, env) -> list[Host]:
        # One host whose slots are all the processes, so that launchers
        # start them all here.
        return [Host("localhost", procs_per_node * nodes)]

    def lbann_run_args(self, env, hosts=()) -> dict:
        # Root and oversubscription are normal in containers and on small
        # test machines (as base_env allows for the other launchers).
        args = super().lbann_run_args(env, hosts)
        return {
            **args,
            "launcher_args": args["launcher_args"] + ["--oversubscribe", "--allow-run-as-root"],
        }
