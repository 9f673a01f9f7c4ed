"""Horovod on TensorFlow/Keras: horovodrun with the Gloo or MPI controller."""

from __future__ import annotations

import numpy as np

from frameworks.registry import AdapterInfo, register
from frameworks.tf_family import Dist, TFAdapter, pin_device
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="horovod-keras",
        family="tensorflow",
        launcher="horovodrun",
        probe="horovod.tensorflow",
        notes="A custom GradientTape loop: 'backward' is tape.gradient, 'grad_comm' the "
        "grouped all-reduce (average) that hvd.DistributedGradientTape issues after it "
        "in eager mode, called on its own so that it is timed on its own. "
        "fp16 is hvd.Compression.fp16 in that all-reduce; comm_bytes are the sizes of "
        "the tensors handed to it, recorded when the compiled all-reduce is traced "
        "(its shapes are fixed). int8 and bf16 are not offered here.",
        compressions=("none", "fp16"),
        batch_splits=("even", "calibrated"),
    )
)


class Adapter(TFAdapter):
    def init(self, config: RunConfig) -> Dist:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        pin_device(tf, config, hvd.local_rank())
        self.hvd = hvd
        self.compression = config["compression"]
        return Dist(rank=hvd.rank(), world=hvd.size(), local_rank=hvd.local_rank())

    def broadcast_initial_state(self, variables: list) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)

    def gradient_allreduce(self):
        import tensorflow as tf

        hvd, phases = self.hvd, self.phases
        inner = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[self.compression]
        handed: list[int] = []  # bytes of each tensor handed to the all-reduce

        class Recording(inner):
            @staticmethod
            def compress(tensor):
                compressed, ctx = inner.compress(tensor)
                handed.append(compressed.shape.num_elements() * compressed.dtype.size)
                return compressed, ctx

        @tf.function
        def average(grads):
            handed.clear()  # Python here runs only while tracing: the graph's sizes
            return hvd.grouped_allreduce(grads, op=hvd.Average, compression=Recording)

        def average_and_count(grads):
            averaged = average(grads)
            phases.count_bytes(sum(handed))
            return averaged

        phases.measures_bytes = True
        return average_and_count

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        reduce_op = {"sum": self.hvd.Sum, "max": self.hvd.Max}[op]
        return self.hvd.allreduce(values, op=reduce_op, name=f"metrics.{op}").numpy()

    def versions(self) -> dict:
        import horovod

        return {"horovod": horovod.__version__}

    def shutdown(self) -> None:
        self.hvd.shutdown()
