"""TensorFlow's MultiWorkerMirroredStrategy: one process per worker, each
with its own TF_CONFIG (launcher 'tf-workers')."""

from __future__ import annotations

import json
import os

import numpy as np

from runfiles import variables
from frameworks import common, knobs
from frameworks.registry import AdapterInfo, register
from frameworks.tf_family import Dist, TFAdapter, pin_device
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="tf-mwms",
        family="tensorflow",
        launcher="tf-workers",
        notes="A custom loop: forward (compiled) and backward (tape.gradient) run in one "
        "eager strategy.run; the gradient all-reduce (collective ops, RING on CPU, "
        "NCCL on GPU) and the optimizer are compiled strategy.run calls of their own. "
        "Keras' fused fit step would hide all four phases in one.",
        batch_splits=("even", "calibrated"),
        knobs=("fusion_threshold_kib", "mwms_implementation"),
    )
)


class Adapter(TFAdapter):
    def init(self, config: RunConfig) -> Dist:
        import tensorflow as tf

        cluster = _tf_config()
        local_rank = int(
            variables.number("DDLC_LOCAL_RANK", variables.get("DDLC_LOCAL_RANK") or "0")
        )
        pin_device(tf, config, local_rank)
        kib = config["fusion_threshold_kib"]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_implementation(tf, config),
            bytes_per_pack=0 if kib is None else kib * knobs.KIB,
        )
        # The strategy must exist before any other TensorFlow op.
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        self.tf = tf
        return Dist(
            rank=cluster["task"]["index"],
            world=len(cluster["cluster"]["worker"]),
            local_rank=local_rank,
        )

    def scope(self):
        return self.strategy.scope()

    def replica(self, fn, *args):
        return self.strategy.run(fn, args=args)

    def gradient_allreduce(self):
        tf, strategy = self.tf, self.strategy

        def average(grads):
            # identity: graph tensors need a device for the collective to target
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, [tf.identity(g) for g in grads]
            )

        @tf.function
        def allreduce(grads):
            return strategy.run(average, args=(grads,))

        phases = self.phases

        def allreduce_and_count(grads):
            # what each replica hands to the collective: its gradients' sizes
            # (one replica's part where a process drives several: tf-mirrored)
            local = [strategy.experimental_local_results(g)[0] for g in grads]
            phases.count_bytes(sum(g.shape.num_elements() * g.dtype.size for g in local))
            if self.reads_packs and self.collectives is None:  # the knobs' evidence
                self.grad_bytes = [g.shape.num_elements() * g.dtype.size for g in local]
                self.collectives = _collectives(allreduce.get_concrete_function(grads).graph)
            return allreduce(grads)

        phases.measures_bytes = True
        return allreduce_and_count

    def apply_gradients(self, optimizer, variables: list):
        tf, strategy = self.tf, self.strategy

        def apply(grads):
            # Already averaged: no second aggregation inside the optimizer.
            optimizer.apply_gradients(zip(grads, variables), skip_gradients_aggregation=True)

        # Compiled around strategy.run: the optimizer's cross-replica merge
        # is refused inside a nested tf.function.
        @tf.function
        def apply_all(grads):
            strategy.run(apply, args=(grads,))

        return apply_all

    collectives: list | None = None
    # its knobs' evidence is the compiled collective ops (tf-mirrored's
    # reduction between its devices has none)
    reads_packs = True
    knobs_read_from = "the compiled all-reduce and TensorFlow's threading settings"

    def knobs_found(self) -> dict:
        """TensorFlow's (the family's), and the all-reduce TensorFlow
        compiled for the gradients: the implementation each collective op is
        hinted with, and its packs, which must be the groups that
        bytes_per_pack gives the gradients."""
        found = super().knobs_found()
        if not self.collectives:
            return found
        hints = sorted({hint for hint, _ in self.collectives})
        packs = [size for _, size in self.collectives]
        found["mwms_implementation"] = hints[0] if len(hints) == 1 else ",".join(hints)
        found["mwms_pack_bytes"] = packs
        kib = self.config["fusion_threshold_kib"]
        if kib is not None:
            # TensorFlow packs the gradients last first (as backward makes them)
            expected = knobs.packs(self.grad_bytes[::-1], kib * knobs.KIB)
            found["fusion_threshold_kib"] = (
                kib if packs == expected else f"packs {packs}, not {expected}"
            )
        return found

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        tf = self.tf

        def gather(v):
            return tf.distribute.get_replica_context().all_gather(v[None], axis=0)

        gathered = self.strategy.run(gather, args=(tf.constant(values),)).numpy()
        return {"sum": gathered.sum, "max": gathered.max}[op](axis=0)


def _implementation(tf, config: RunConfig):
    """mwms_implementation, or (null) NCCL on GPUs and RING on CPUs."""
    name = config["mwms_implementation"] or ("nccl" if config["device"] == "gpu" else "ring")
    return getattr(tf.distribute.experimental.CommunicationImplementation, name.upper())


def _collectives(graph) -> list[tuple[str, int]]:
    """(communication hint, bytes) of every all-reduce op in a traced graph
    and in the functions it calls."""
    found = []
    for op in graph.get_operations():
        if op.type.startswith("CollectiveReduce"):
            tensor = op.inputs[0]
            size = tensor.shape.num_elements() * tensor.dtype.size
            found.append((op.get_attr("communication_hint").decode(), size))
    for function in graph._functions.values():  # noqa: SLF001 (nested functions)
        if getattr(function, "graph", None) is not None:
            found += _collectives(function.graph)
    return found


def _tf_config() -> dict:
    try:
        return json.loads(os.environ["TF_CONFIG"])
    except KeyError:
        raise common.RunError(
            "tf-mwms: TF_CONFIG is not set; start tf-mwms runs with the "
            "'tf-workers' launcher (ddlc run / snakemake do)"
        ) from None
    except ValueError as exc:
        raise common.RunError(f"tf-mwms: TF_CONFIG is not valid JSON ({exc})") from None
