"""Tarantella (GPI-2): tnt.Model around the shared Keras model, trained with
fit on the global batch; launched with the 'tarantella' launcher.

Runs in its own environment (TensorFlow <= 2.10 on Python <= 3.10, GPI-2,
GaspiCxx with pygpi, Tarantella): envs/build-tarantella.sh builds it
(notes: envs/tarantella.md).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from frameworks import common, knobs
from frameworks.registry import AdapterInfo, register
from frameworks.tf_family import Dist, TFAdapter
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="tarantella",
        family="tensorflow",
        launcher="tarantella",
        env="tarantella",
        probe="tarantella",
        gate_builder="tarantella",
        also_exposes=("other",),
        notes="tnt.Model owns the training step (Keras fit, one compiled graph): "
        "whole steps are timed, as 'other', unless the design asks for its phases "
        "(fit_step_phases: true; what that costs: docs/tracing.md). Then the graph "
        "is Keras' own step with timestamps taken in it (tf.timestamp "
        "after the loss, after every gradient, after each of Tarantella's "
        "all-reduces and after the optimizer), read back after each step: "
        "data_load is the step's start to its batch in hand, then forward, "
        "backward (the all-reduces of early gradients overlap it), grad_comm "
        "(the last gradient's to the last all-reduce's end), optimizer; 'other' "
        "is Keras' metrics and callbacks after it. Each all-reduce is kept "
        "with its bytes (a gradient ready to its reduced copy). "
        "Tarantella 0.8.0 does not distribute evaluation (every rank scores "
        "the whole test set), so the harness scores each rank's test shard "
        "with the Keras model itself.",
        knobs=("fusion_threshold_kib",),
        whole_nodes=True,
        owns_step=True,
    )
)

# The phases a fit step's timestamps close, in order; 'other' follows.
PHASE_ENDS = ("data_load", "forward", "backward", "grad_comm", "optimizer")
ALLREDUCE = "allreduce"  # the collective's name in traces (Tarantella's SynchCommunicator)


class StepStamps:
    """One step's timestamps as the step graph wrote them (seconds on the
    wall clock): the ends of PHASE_ENDS, then when each gradient was ready,
    then when each was reduced; converted to ``perf_counter_ns`` by
    ``offset`` (wall minus perf counter, in ns) and kept within the step and
    in order (float64 seconds of the wall clock are about 0.24 us apart)."""

    def __init__(self, seconds: np.ndarray, offset: int, start_ns: int, end_ns: int):
        ns = np.clip(np.rint(seconds * 1e9).astype(np.int64) - offset, start_ns, end_ns)
        ends = np.maximum.accumulate(ns[: len(PHASE_ENDS)])
        n = (len(ns) - len(PHASE_ENDS)) // 2
        self.ends = ends.tolist()
        self.ready = ns[len(PHASE_ENDS) : len(PHASE_ENDS) + n].tolist()
        self.reduced = np.maximum(
            ns[len(PHASE_ENDS) + n :], ns[len(PHASE_ENDS) : len(PHASE_ENDS) + n]
        ).tolist()

    @staticmethod
    def size(n_gradients: int) -> int:
        return len(PHASE_ENDS) + 2 * n_gradients


def in_backward_order(makers: list) -> list:
    """Each maker called, the last first; the results in the makers' order."""
    made = [maker() for maker in reversed(makers)]
    return made[::-1]


def stamped_model(tf, model, stamps):
    """The Keras model with Keras' own training step (TF 2.7's train_step,
    its optimizer.minimize said in its two documented parts) plus
    timestamps: the same layers and weights, the same ops in the same
    graph, Tarantella's distributed optimizer aggregating the gradients as
    minimize would have it do. A timestamp depends on what it marks and
    nothing depends on it but the slot it is written to, so the graph's
    schedule is kept (its all-reduces still start while backward runs)."""

    def stamp(after):
        with tf.control_dependencies(after):
            return tf.timestamp()

    class Stamped(tf.keras.Model):
        stamping = True  # False: Keras' step unchanged (bench/tarantella_stamps.py)

        def train_step(self, data):
            if not self.stamping:
                return super().train_step(data)
            x, y, weight = tf.keras.utils.unpack_x_y_sample_weight(data)
            loaded = stamp(tf.nest.flatten(x))
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred, weight, regularization_losses=self.losses)
            forward = stamp([loss])
            grads_and_vars = self.optimizer._compute_gradients(
                loss, var_list=self.trainable_variables, tape=tape
            )
            grads = [g for g, _ in grads_and_vars]
            # TensorFlow runs a function's stateful ops (a timestamp is one) in
            # the order they were made: made in the order backward yields the
            # gradients (the last layer's first), each is taken when it is due.
            ready = in_backward_order([lambda g=g: stamp([g]) for g in grads])
            backward = stamp(grads)
            # Tarantella's SynchDistributedOptimizer: start, barrier, finish ops
            reduced = self.optimizer._aggregate_gradients(grads_and_vars)
            done = in_backward_order([lambda g=g: stamp([g]) for g, _ in reduced])
            exchanged = stamp([g for g, _ in reduced])
            applied = self.optimizer.apply_gradients(
                reduced, experimental_aggregate_gradients=False
            )
            optimized = stamp([applied])
            self.compiled_metrics.update_state(y, y_pred, weight)
            stamps.assign(
                tf.stack([loaded, forward, backward, exchanged, optimized, *ready, *done])
            )
            return {m.name: m.result() for m in self.metrics}

    return Stamped(inputs=model.inputs, outputs=model.outputs, name=model.name)


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
    uses_fit = ADAPTER.owns_step

    def init(self, config: RunConfig) -> Dist:
        # Importing Tarantella starts GPI-2 and picks this rank's GPU (or
        # none: the launcher passes --no-gpu on device: cpu). With too few
        # GPUs it only warns and trains on the CPU: refuse that first.
        if config["device"] == "gpu":
            require_gpus(config["procs_per_node"])
        tnt = import_tarantella()
        self.tnt = tnt
        rank = tnt.get_rank()
        return Dist(rank=rank, world=tnt.get_size(), local_rank=rank % config["procs_per_node"])

    def wrap_for_fit(self, model, optimizer, loss, metrics):
        import tensorflow as tf

        if self.config["fit_step_phases"]:
            # one slot per timestamp of the step graph (StepStamps)
            self.stamps = tf.Variable(
                tf.zeros(StepStamps.size(len(model.trainable_variables)), tf.float64),
                trainable=False,
            )
            model = stamped_model(tf, model, self.stamps)
        model = self.tnt.Model(model)
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        self.tnt_model = model
        return model

    def fit_step_phases(self, phases):
        """Each fit step's phases from the timestamps its graph took, and
        each gradient's all-reduce with its bytes (whole steps where the
        design says fit_step_phases: false)."""
        if not self.config["fit_step_phases"]:
            return super().fit_step_phases(phases)
        sizes = [v.shape.num_elements() * v.dtype.size for v in self.tnt_model.trainable_variables]
        phases.measures_bytes = True
        phases.one_rank = self.tnt.get_size() == 1
        stamps = self.stamps

        def record(start_ns: int, end_ns: int) -> None:
            # wall clock (the graph's) to this process's perf_counter_ns
            offset = time.time_ns() - time.perf_counter_ns()
            found = StepStamps(stamps.numpy(), offset, start_ns, end_ns)
            previous = start_ns
            for phase, at in zip(PHASE_ENDS, found.ends):
                phases.add(phase, previous, at)
                previous = at
            phases.add("other", previous, end_ns)
            for nbytes, ready, done in zip(sizes, found.ready, found.reduced):
                phases.collective(ALLREDUCE, nbytes, ready, done)

        return record

    knobs_read_from = "Tarantella's gradient communicator and TensorFlow's threading settings"

    def knobs_found(self) -> dict:
        """TensorFlow's (the family's), the fusion threshold Tarantella's
        configuration holds (from its launcher's --fusion-threshold) and the
        one its distributed optimizer built the gradient communicator with
        (SynchCommunicator.threshold, handed to
        GPICommLib.SynchDistCommunicator), in KiB."""
        found = super().knobs_found()
        optimizer = getattr(getattr(self, "tnt_model", None), "dist_optimizer", None)
        communicator = getattr(optimizer, "comm", None)
        if communicator is None or communicator.comm is None:
            found["fusion_threshold_kib"] = "no gradient communicator was built"
        else:
            found["fusion_threshold_kib"] = communicator.threshold // knobs.KIB
        found["tarantella_config_fusion_kib"] = (
            self.tnt.global_tnt_config.fusion_threshold // knobs.KIB
        )
        return found

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

    def fit_dataset(self, dataset):
        """The family's (autotuner off). Tarantella rebuilds the pipeline
        for each rank from its transformations, taking an options step's
        options from ``_options``, which TensorFlow 2.7 made a method (v0.8.0
        and master, data/ops_helpers.py): the step carries its options
        there as an attribute, so that they are applied again."""
        dataset = super().fit_dataset(dataset)
        dataset._options = dataset._options_attr
        return dataset

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
