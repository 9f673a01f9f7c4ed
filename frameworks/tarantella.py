"""Tarantella (GPI-2): tnt.Model around the shared Keras model, trained with
fit on the global batch; launched with the 'tarantella' launcher.

Runs in its own environment (TensorFlow <= 2.10 on Python <= 3.10, GPI-2,
GaspiCxx with pygpi, Tarantella): envs/build-tarantella.sh builds it
(notes: envs/tarantella.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from frameworks import common, knobs
from frameworks.registry import AdapterInfo, register
from frameworks.tf_family import Dist, TFAdapter

ADAPTER = register(
    AdapterInfo(
        name="tarantella",
        module=__name__,
        family="tensorflow",
        launcher="tarantella",
        env="tarantella",
        probe="tarantella",
        exposes=("init", "other", "eval"),
        notes="tnt.Model owns the training step (Keras fit): forward, backward, gradient "
        "all-reduce and optimizer are fused in one step, timed whole as 'other'. "
        "Tarantella does not distribute evaluation, so the harness scores each "
        "rank's test shard with the Keras model itself.",
        knobs=("fusion_threshold_kib",),
        whole_nodes=True,
    )
)

HOW_TO_BUILD = (
    "Tarantella is not installed in this environment; build the 'tarantella' "
    "environment with 'bash envs/build-tarantella.sh' (TensorFlow 2.7, GPI-2, "
    "GaspiCxx with pygpi, Tarantella v0.8.0 from source; notes: envs/tarantella.md) "
    "and point DDLC_VENV_TARANTELLA at it"
)


def import_tarantella():
    try:
        import tarantella
    except ImportError as exc:
        raise common.RunError(f"tarantella: {HOW_TO_BUILD} ({exc})") from None
    return tarantella


def require_gpus(per_node: int) -> None:
    import tensorflow as tf

    found = len(tf.config.list_physical_devices("GPU"))
    if found < per_node:
        raise common.RunError(
            f"tarantella: device: gpu asks for {per_node} GPU(s) per node "
            f"(procs_per_node) and this node has {found}; Tarantella would "
            "silently train on the CPU. Use device: cpu or fewer processes"
        )


def tarantella_version() -> str:
    """Tarantella has no __version__: tnt_version, in tarantella.version
    (master) or in the version.py installed next to the package (v0.8.0)."""
    try:
        from tarantella.version import tnt_version

        return str(tnt_version)
    except ImportError:
        pass
    import tarantella

    found = Path(tarantella.__file__).resolve().parents[1] / "version.py"
    match = (
        re.search(r"tnt_version\s*=\s*[\"']([^\"']+)", found.read_text())
        if found.exists()
        else None
    )
    return match.group(1) if match else "unknown (no tnt_version found)"


class Adapter(TFAdapter):
    uses_fit = True

    def init(self, config: dict) -> Dist:
        # Importing Tarantella starts GPI-2 and picks this rank's GPU (or
        # none: the launcher passes --no-gpu on device: cpu). With too few
        # GPUs it only warns and trains on the CPU: refuse that first.
        if config["device"] == "gpu":
            require_gpus(config["procs_per_node"])
        tnt = import_tarantella()
        self.tnt, self.config = tnt, config
        rank = tnt.get_rank()
        return Dist(rank=rank, world=tnt.get_size(), local_rank=rank % config["procs_per_node"])

    def wrap_for_fit(self, model, optimizer, loss, metrics):
        model = self.tnt.Model(model)
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        self.tnt_model = model
        return model

    def knobs_in_effect(self) -> dict:
        """The fusion threshold Tarantella's configuration holds (from its
        launcher's --fusion-threshold) and the one its distributed optimizer
        built the gradient communicator with (SynchCommunicator.threshold,
        handed to GPICommLib.SynchDistCommunicator), in KiB."""
        optimizer = getattr(getattr(self, "tnt_model", None), "dist_optimizer", None)
        communicator = getattr(optimizer, "comm", None)
        if communicator is None or communicator.comm is None:
            found = {"fusion_threshold_kib": "no gradient communicator was built"}
        else:
            found = {"fusion_threshold_kib": communicator.threshold // knobs.KIB}
        found["tarantella_config_fusion_kib"] = (
            self.tnt.global_tnt_config.fusion_threshold // knobs.KIB
        )
        return knobs.confirm(self.config, found, "Tarantella's gradient communicator")

    def fit_callback(self, timer):
        """Tarantella wraps a plain Keras callback so that every batch's logs
        are first averaged over the ranks: one blocking all-reduce per step
        that a run without our timer would not make. One of Tarantella's own
        callbacks is used as it is (keras/model.py, _to_tnt_callbacks): the
        timer goes in one that passes the training hooks straight through,
        without logs, and ignores the rest."""
        from tarantella.keras.callbacks import Callback

        class DirectTimer(Callback):
            def __init__(self):
                super().__init__(keras_callback=timer, aggregate_logs=False)

            def on_train_begin(self, logs=None):
                timer.on_train_begin()

            def on_train_batch_begin(self, batch, logs=None):
                timer.on_train_batch_begin(batch)

            def on_train_batch_end(self, batch, logs=None):
                timer.on_train_batch_end(batch)

            def on_train_end(self, logs=None):
                timer.on_train_end()

        for hook in (
            "on_epoch_begin",
            "on_epoch_end",
            "on_batch_begin",
            "on_batch_end",
            "on_test_begin",
            "on_test_end",
            "on_test_batch_begin",
            "on_test_batch_end",
            "on_predict_begin",
            "on_predict_end",
            "on_predict_batch_begin",
            "on_predict_batch_end",
        ):
            setattr(DirectTimer, hook, lambda self, *args, **kwargs: None)
        return DirectTimer()

    def versions(self) -> dict:
        return {"tarantella": tarantella_version(), **common.built_versions("tarantella_build")}

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        if op == "sum":
            return np.asarray(self.tnt.TensorAllreducer(values).allreduce(values))
        # Tarantella's all-reducer only sums: the max of non-negative values
        # (times) via a gather-by-sum, one slot per rank.
        slots = np.zeros((self.tnt.get_size(), len(values)))
        slots[self.tnt.get_rank()] = values
        return np.asarray(self.tnt.TensorAllreducer(slots).allreduce(slots)).max(axis=0)
