"""TensorFlow's MultiWorkerMirroredStrategy: one process per worker, each
with its own TF_CONFIG (launcher 'tf-workers')."""

from __future__ import annotations

import json
import os

import numpy as np

from runfiles import variables
from frameworks import common
from frameworks.registry import AdapterInfo
from frameworks.tf_family import Dist, TFAdapter, pin_device

ADAPTER = AdapterInfo(
    name="tf-mwms",
    module=__name__,
    family="tensorflow",
    launcher="tf-workers",
    env="tensorflow",
    probe="tensorflow",
    exposes=("init", "data_load", "forward", "backward", "grad_comm", "optimizer", "eval"),
    notes="A custom loop: forward (compiled) and backward (tape.gradient) run in one "
    "eager strategy.run; the gradient all-reduce (collective ops, RING on CPU, "
    "NCCL on GPU) and the optimizer are compiled strategy.run calls of their own. "
    "Keras' fused fit step would hide all four phases in one.",
    batch_splits=("even", "calibrated"),
)


class Adapter(TFAdapter):
    def init(self, config: dict) -> Dist:
        import tensorflow as tf

        cluster = _tf_config()
        local_rank = int(variables.get("DDLC_LOCAL_RANK") or 0)
        pin_device(tf, config, local_rank)
        implementation = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if config["device"] == "gpu"
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        # The strategy must exist before any other TensorFlow op.
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation
            )
        )
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

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        tf = self.tf

        def gather(v):
            return tf.distribute.get_replica_context().all_gather(v[None], axis=0)

        gathered = self.strategy.run(gather, args=(tf.constant(values),)).numpy()
        return {"sum": gathered.sum, "max": gathered.max}[op](axis=0)


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
