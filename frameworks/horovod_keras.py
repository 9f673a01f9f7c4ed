"""Horovod on TensorFlow/Keras: horovodrun with the Gloo or MPI controller."""
from __future__ import annotations

import numpy as np

from frameworks.registry import AdapterInfo
from frameworks.tf_family import Dist, TFAdapter, pin_device

ADAPTER = AdapterInfo(
    name="horovod-keras", module=__name__, family="tensorflow", launcher="horovodrun",
    env="tensorflow", probe="horovod.tensorflow",
    exposes=("init", "data_load", "forward", "backward", "grad_comm", "optimizer", "eval"),
    notes="A custom GradientTape loop: 'backward' is tape.gradient, 'grad_comm' the "
          "grouped all-reduce (average) that hvd.DistributedGradientTape issues after it "
          "in eager mode, called on its own so that it is timed on its own.",
)


class Adapter(TFAdapter):
    def init(self, config: dict) -> Dist:
        import horovod.tensorflow as hvd
        import tensorflow as tf
        hvd.init()
        pin_device(tf, config, hvd.local_rank())
        self.hvd = hvd
        return Dist(rank=hvd.rank(), world=hvd.size(), local_rank=hvd.local_rank())

    def broadcast_initial_state(self, variables: list) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)

    def gradient_allreduce(self):
        import tensorflow as tf
        hvd = self.hvd

        @tf.function
        def average(grads):
            return hvd.grouped_allreduce(grads, op=hvd.Average)
        return average

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        reduce_op = {"sum": self.hvd.Sum, "max": self.hvd.Max}[op]
        return self.hvd.allreduce(values, op=reduce_op, name=f"metrics.{op}").numpy()

    def versions(self) -> dict:
        import horovod
        return {"horovod": horovod.__version__}

    def shutdown(self) -> None:
        self.hvd.shutdown()
