"""TensorFlow's MirroredStrategy: one process mirrors the model over its
local devices (launcher 'one-process'): the GPUs, or on CPU logical CPU
devices; procs_per_node is the number of replicas."""

from __future__ import annotations

import numpy as np

from frameworks.common import Dist, RunError
from frameworks.registry import AdapterInfo, register
from frameworks.adapters.tf_mwms import Adapter as StrategyAdapter
from runfiles.run_config import RunConfig

ADAPTER = register(
    AdapterInfo(
        name="tf-mirrored",
        family="tensorflow",
        launcher="one-process",
        one_process=True,
        notes="One process, one replica per device, the replicas' forward and backward run "
        "in turn by the strategy's replica threads in eager mode, so 'forward' and "
        "'backward' add up every replica's. 'grad_comm' is the strategy's all-reduce "
        "(MEAN) of the gradients between the replicas, a compiled strategy.run of its "
        "own: NCCL all-reduce on GPUs, reduction to one device and broadcast on "
        "logical CPU devices. Evaluation runs on the first device.",
    )
)


class Adapter(StrategyAdapter):
    reads_packs = False

    def init(self, config: RunConfig) -> Dist:
        import tensorflow as tf

        self.replicas, on_gpus = config["procs_per_node"], config["device"] == "gpu"
        self.tf = tf
        # The strategy must exist before any other TensorFlow op.
        self.strategy = tf.distribute.MirroredStrategy(
            _devices(tf, on_gpus, self.replicas),
            cross_device_ops=tf.distribute.NcclAllReduce()
            if on_gpus
            else tf.distribute.ReductionToOneDevice(),
        )
        return Dist(rank=0, world=1, local_rank=0)

    def per_replica(self, values: np.ndarray):
        """Replica k gets the k-th slice of batch_size, on its own device."""
        tf = self.tf
        parts = np.split(values, self.replicas)

        def on_device(context):
            return tf.constant(parts[context.replica_id_in_sync_group])

        return self.strategy.experimental_distribute_values_from_function(on_device)

    def local_results(self, value) -> list:
        return list(self.strategy.experimental_local_results(value))

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        return values  # one process: its figures are the run's


def _devices(tf, on_gpus: bool, replicas: int) -> list[str]:
    """The replicas' devices: the first GPUs, or logical CPU devices split
    from the one physical CPU device (they share its thread pools)."""
    gpus = tf.config.list_physical_devices("GPU")
    if on_gpus and len(gpus) < replicas:
        raise RunError(
            f"tf-mirrored mirrors over procs_per_node={replicas} GPUs and "
            f"TensorFlow sees {len(gpus)} here"
        )
    tf.config.set_visible_devices(gpus[:replicas] if on_gpus else [], "GPU")
    if on_gpus:
        return [f"/gpu:{k}" for k in range(replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
    )
    return [f"/cpu:{k}" for k in range(replicas)]
