"""Which framework adapters exist, found by scanning frameworks/adapters/

An adapter is one module in ``frameworks/adapters/`` that registers its
:class:`AdapterInfo` (``ADAPTER = register(AdapterInfo(...))``, the one
mechanism of runfiles/backends.py). It states what it is (``name``, its
``family``, its ``launcher``) and only where it differs from its family
(:data:`FAMILIES`). Importing an adapter module must stay cheap (its
framework is imported inside its functions), so the planner can list and
check frameworks without torch or TensorFlow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from runfiles.backends import Registry
from runfiles.phases import PHASES


@dataclass(frozen=True)
class Family:
    """A training loop that runs several frameworks, and what it gives
    each of them where its adapter does not say otherwise."""

    loop: str  # the module whose train(adapter, config, run_dir) runs it
    gate_builder: str  # the same-model gate's builder of its model (frameworks/model_gate.py)
    env: str  # the environment (envs/<env>.txt) its frameworks run in
    probe: str  # a module whose import proves that environment is built
    exposes: tuple[str, ...]  # the phases its loop times for every framework
    # the framework knobs (frameworks/knobs.py) its loop applies and reads
    # back for every framework it runs
    knobs: tuple[str, ...] = ()


# The phases every loop times; each family adds its own.
EVERY_LOOP = ("init", "data_load", "forward", "backward", "optimizer", "eval")

FAMILIES = {
    "torch": Family(
        loop="frameworks.torch_family",
        gate_builder="pytorch",
        env="torch",
        probe="torch",
        exposes=(*EVERY_LOOP, "h2d"),
    ),
    "tensorflow": Family(
        loop="frameworks.tf_family",
        gate_builder="keras",
        env="tensorflow",
        probe="tensorflow",
        exposes=(*EVERY_LOOP, "grad_comm"),
        knobs=("inter_op_threads",),
    ),
    "lbann": Family(
        loop="frameworks.lbann_family",
        gate_builder="lbann",
        env="lbann",
        probe="lbann",
        exposes=EVERY_LOOP,
    ),
}


@dataclass(frozen=True)
class AdapterInfo:
    name: str  # the design's framework level
    family: str  # which shared training loop runs it (a key of FAMILIES)
    launcher: str  # ddlcompare.run.launch name: how its processes start
    notes: str = ""  # what it cannot expose, said in the report
    # Empty: its family's (FAMILIES). The environment (envs/<env>.txt) it
    # runs in, a module whose import proves that environment is built, and
    # the same-model gate's builder of its model (tnt.Model wraps the Keras
    # model, and the gate checks the wrapped one).
    env: str = ""
    probe: str = ""
    gate_builder: str = ""
    # the phases it times beyond its family's (see exposes)
    also_exposes: tuple[str, ...] = ()
    # the gradient compressions (frameworks/compression.py) it can run
    compressions: tuple[str, ...] = ("none",)
    # the device levels it can run (params 'device')
    devices: tuple[str, ...] = ("cpu", "gpu")
    # the batch splits it can run (frameworks/balance.py)
    batch_splits: tuple[str, ...] = ("even",)
    # one process drives every local device (DataParallel, MirroredStrategy):
    # procs_per_node counts its replicas, and it runs on one node
    one_process: bool = False
    # the framework knobs (params declared in frameworks/knobs.py) it honours
    # beyond its family's (FAMILIES); after init, its family's and its own
    knobs: tuple[str, ...] = ()
    # two of its runs cannot share a node (GPI-2 listens on fixed ports, 19000
    # and 10840, on each node): on a cluster its jobs ask for whole nodes
    whole_nodes: bool = False
    # it writes a steps file per rank (LBANN's own loop writes one for the run)
    rank_steps: bool = True
    # its own fit runs the training step (Tarantella's tnt.Model.fit): the
    # harness times whole steps, and the step's phases only where the design
    # asks for them (fit_step_phases)
    owns_step: bool = False
    # the framework this one is a changed build of (tarantella-patched: the
    # plain tarantella): the report compares the levels of its own knobs
    # against it where a design runs both (analysis/levels.py)
    baseline: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"framework {self.name!r}: no family {self.family!r} "
                f"(known: {', '.join(FAMILIES)}); frameworks/registry.py declares them"
            )
        family = FAMILIES[self.family]
        for field in ("env", "probe", "gate_builder"):
            if not getattr(self, field):
                object.__setattr__(self, field, getattr(family, field))  # frozen
        # once each: replace() on an adapter's info passes its knobs in again
        object.__setattr__(self, "knobs", tuple(dict.fromkeys((*family.knobs, *self.knobs))))

    @property
    def exposes(self) -> tuple[str, ...]:
        """The phases it can time separately, in the vocabulary's order."""
        timed = {*FAMILIES[self.family].exposes, *self.also_exposes}
        return tuple(phase for phase in PHASES if phase in timed)

    @property
    def loop(self) -> str:
        """The module whose train(adapter, config, run_dir) runs it."""
        return FAMILIES[self.family].loop


FRAMEWORKS: Registry[AdapterInfo] = Registry("frameworks.adapters", "framework")
register = FRAMEWORKS.register


def load_adapter(name: str):
    """The adapter class of a framework (imports the framework itself)."""
    return importlib.import_module(FRAMEWORKS.module(name)).Adapter()
