"""Tarantella (GPI-2): tnt.Model around the shared Keras model, trained with
fit on the global batch; launched with the 'tarantella' launcher.

Cannot run on the development machines (no Tarantella there, and it needs
TensorFlow <= 2.10): build its environment on a cluster (envs/tarantella.md).
"""
from __future__ import annotations

import numpy as np

from frameworks import common
from frameworks.registry import AdapterInfo
from frameworks.tf_family import Dist, TFAdapter

ADAPTER = AdapterInfo(
    name="tarantella", module=__name__, family="tensorflow", launcher="tarantella",
    env="tarantella", probe="tarantella",
    exposes=("init", "other", "eval"),
    notes="tnt.Model owns the training step (Keras fit): forward, backward, gradient "
          "all-reduce and optimizer are fused in one step, timed whole as 'other'. "
          "Tarantella does not distribute evaluation, so the harness scores each "
          "rank's test shard with the Keras model itself.",
)

HOW_TO_BUILD = ("Tarantella is not installed in this environment; build the 'tarantella' "
                "environment (TensorFlow <= 2.10, GPI-2, GaspiCxx, Tarantella from source) "
                "as envs/tarantella.md says, and point DDLC_VENV_TARANTELLA at it")


def import_tarantella():
    try:
        import tarantella
    except ImportError as exc:
        raise common.RunError(f"tarantella: {HOW_TO_BUILD} ({exc})") from None
    return tarantella


class Adapter(TFAdapter):
    uses_fit = True

    def init(self, config: dict) -> Dist:
        # Importing Tarantella starts GPI-2 and picks this rank's GPU (or
        # none: the launcher passes --no-gpu on device: cpu).
        tnt = import_tarantella()
        self.tnt = tnt
        rank = tnt.get_rank()
        return Dist(rank=rank, world=tnt.get_size(), local_rank=rank % config["procs_per_node"])

    def wrap_for_fit(self, model, optimizer, loss, metrics):
        model = self.tnt.Model(model)
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        return model

    def versions(self) -> dict:
        return {"tarantella": getattr(self.tnt, "__version__", "unknown")}

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        if op == "sum":
            return np.asarray(self.tnt.TensorAllreducer(values).allreduce(values))
        # Tarantella's all-reducer only sums: the max of non-negative values
        # (times) via a gather-by-sum, one slot per rank.
        slots = np.zeros((self.tnt.get_size(), len(values)))
        slots[self.tnt.get_rank()] = values
        return np.asarray(self.tnt.TensorAllreducer(slots).allreduce(slots)).max(axis=0)
