"""The emulated network of ddlcompare/netem.py: its nodes are network
namespaces of this machine, named by their addresses, reached through the
``netns_as_ssh`` shim."""

from __future__ import annotations

from ddlcompare import netem
from ddlcompare.schedulers import Scheduler, register
from ddlcompare.schedulers.local import Local


@register
class Netns(Scheduler):
    name = "netns"
    rsh_agent = str(netem.NETNS_SSH)
    ssh_dir = netem.NETNS_SSH.parent
    one_machine = True
    lbann_run_args = Local.lbann_run_args

    @staticmethod
    def detected(env) -> bool:
        return bool(env.get(netem.HOSTS_MAP))

    def host_names(self, env) -> list[str]:
        return [pair.split("=")[0] for pair in env[netem.HOSTS_MAP].split()]

    def horovodrun_args(self) -> list[str]:
        return ["--network-interface", netem.IFACE]  # else Horovod probes every node's NICs
