"""Which framework adapters exist, found by scanning frameworks/adapters/

An adapter is one module in ``frameworks/adapters/`` that registers its
:class:`AdapterInfo` (``ADAPTER = register(AdapterInfo(...))``, the one
mechanism of runfiles/backends.py). Importing an adapter module must stay
cheap (its framework is imported inside its functions), so the planner can
list and check frameworks without torch or TensorFlow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from runfiles.backends import Registry


@dataclass(frozen=True)
class AdapterInfo:
    name: str  # the design's framework level
    module: str  # frameworks.<module>, which defines the adapter class
    family: str  # which shared training loop runs it (torch, tensorflow...)
    launcher: str  # ddlcompare.run.launch name: how its processes start
    env: str  # the environment (envs/<env>.txt) it runs in
    probe: str  # a module whose import proves the env is built
    exposes: tuple[str, ...]  # the phases it can time separately
    notes: str = ""  # what it cannot expose, said in the report
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
    knobs: tuple[str, ...] = ()
    # two of its runs cannot share a node (GPI-2 listens on fixed ports, 19000
    # and 10840, on each node): on a cluster its jobs ask for whole nodes
    whole_nodes: bool = False
    # it writes a steps file per rank (LBANN's own loop writes one for the run)
    rank_steps: bool = True
    # the same-model gate's builder of its model, where not its family's
    # (frameworks/model_gate.py's FAMILY_BUILDERS): tnt.Model wraps the Keras
    # model, and the gate checks the wrapped one
    gate_builder: str = ""
    # its own fit runs the training step (Tarantella's tnt.Model.fit): the
    # harness times whole steps, and the step's phases only where the design
    # asks for them (fit_step_phases)
    owns_step: bool = False


FRAMEWORKS: Registry[AdapterInfo] = Registry("frameworks.adapters", "framework")
register = FRAMEWORKS.register


def load_adapter(name: str):
    """The adapter class of a framework (imports the framework itself)."""
    info = FRAMEWORKS[name]
    return importlib.import_module(info.module).Adapter()
