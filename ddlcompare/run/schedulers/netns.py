"""The emulated network of ddlcompare/run/netem.py: its nodes are network
namespaces of this machine, named by their addresses, reached through the
``netns_as_ssh`` shim."""

from __future__ import annotations

from ddlcompare.run import netem
from ddlcompare.run.schedulers import Scheduler, register
from ddlcompare.run.schedulers.local import Local


@register
class Netns(Scheduler):
    name = "netns"
    rsh_agent = str(netem.NETNS_SSH)
    ssh_dir = netem.NETNS_SSH.parent
    one_machine = True

    @staticmethod
    def detected(env) -> bool:
        return bool(env.get(netem.HOSTS_MAP))

    def host_names(self, env) -> list[str]:
        return [pair.split("=")[0] for pair in env[netem.HOSTS_MAP].split()]

    def lbann_run_args(self, env, hosts=()) -> dict:
        # Local's (root, oversubscription), started on the namespaces
        # through the shim; LBANN's mpiexec maps ppr:N:node over these hosts.
        args = Local().lbann_run_args(env, hosts)
        where = ["--host", ",".join(h.name for h in hosts), *self.mpirun_args()]
        return {**args, "launcher_args": args["launcher_args"] + where}

    def horovodrun_args(self) -> list[str]:
        return ["--network-interface", netem.IFACE]  # else Horovod probes every node's NICs
