"""The TensorFlow training loops shared by every TensorFlow adapter.

Two loops, one set of outputs (the same as the PyTorch family's):
- ``train``: a custom loop (GradientTape) where the framework allows one,
  so that forward, backward, gradient communication and optimizer are
  separate phases, timed like the PyTorch adapters' (horovod-keras, tf-mwms);
- ``train_fit``: ``model.fit`` for frameworks that own the step
  (Tarantella); the adapter records each step's phases
  (``fit_step_phases``), by default the whole step under ``other``.

Adapters subclass :class:`TFAdapter` and override only their framework's
own calls. The model (frameworks/keras_models.py), the data shards, the
learning-rate rule, the phases and the figures are the same for all of them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from pathlib import Path

import numpy as np

from runfiles import energy
from frameworks import balance, common, data, epoch_loop, keras_models, knobs, models
from frameworks.common import Dist
from frameworks import tracing
from frameworks.recorder import PhaseRecorder
from runfiles.run_config import RunConfig


class TFAdapter:
    """Defaults follow plain single-process TensorFlow; adapters override."""

    uses_fit = False  # True: the framework owns the training step (train_fit)
    config: RunConfig  # the run's, set by the loop before init
    phases: PhaseRecorder | None = None  # the run's recorder (comm_bytes), set by train
    replicas = 1  # model replicas this process drives (MirroredStrategy: its devices)

    def init(self, config: RunConfig) -> Dist:
        """Start the framework; runs before any other TensorFlow op."""
        raise NotImplementedError

    def scope(self):
        """Where the model's and optimizer's variables are created."""
        return contextlib.nullcontext()

    def broadcast_initial_state(self, variables: list) -> None:
        """Make every rank start from rank 0's weights."""

    def replica(self, fn, *args):
        """Run per-replica work (forward, backward) in the replica context."""
        return fn(*args)

    def per_replica(self, values: np.ndarray):
        """This process's batch (its replicas' slices, in order) as the input of ``replica``."""
        import tensorflow as tf

        return tf.constant(values)

    def local_results(self, value) -> list:
        """The values of a ``replica`` result on this process's replicas."""
        return [value]

    def gradient_allreduce(self):
        """A function averaging a list of gradients over all ranks."""
        return lambda grads: grads

    def apply_gradients(self, optimizer, variables: list):
        """A function applying (already averaged) gradients."""
        import tensorflow as tf

        @tf.function
        def apply(grads):
            optimizer.apply_gradients(zip(grads, variables))

        return apply

    def allreduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """Sum or max of a small float64 vector over all ranks (metrics)."""
        raise NotImplementedError

    def wrap_for_fit(self, model, optimizer, loss, metrics):
        """train_fit only: the distributed model, compiled."""
        raise NotImplementedError

    def versions(self) -> dict:
        """Versions of the framework's own packages, for the rank records."""
        return {}

    def fit_callback(self, timer):
        """train_fit only: the step timer as the framework's fit should get it."""
        return timer

    def fit_dataset(self, dataset):
        """train_fit only: the epoch's batched images as fit gets them, with
        tf.data's autotuner off. The pipeline (in-memory slices, batched;
        Tarantella shards each global batch by rank) has no stage for it to
        tune, but its model thread sleeps between
        optimizations for up to a minute, and TensorFlow 2.7 waits for that
        sleep to end when fit drops the epoch's iterator: 0 to 22 s after
        the last step of each epoch (issue 42)."""
        import tensorflow as tf

        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.with_options(options)

    def fit_step_phases(self, phases: PhaseRecorder):
        """train_fit only: a function recording one fit step's phases, given
        its start and end (``perf_counter_ns``). Here the whole step as
        'other'; an adapter that reads the step's parts back overrides it."""
        return lambda start_ns, end_ns: phases.add("other", start_ns, end_ns)

    # where knobs_found reads the knobs, for the message of one not in effect
    knobs_read_from = "TensorFlow's threading settings"

    def knobs_in_effect(self) -> dict:
        """The framework knobs in effect (frameworks/knobs.py), read back
        from the framework; one the run asked for that is not in effect
        fails the run."""
        return knobs.confirm(self.config, self.knobs_found(), self.knobs_read_from)

    def knobs_found(self) -> dict:
        """The family's knob, TensorFlow's inter-op pool, as TensorFlow
        holds it; adapters whose framework takes knobs add theirs."""
        import tensorflow as tf

        return {"inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}

    def shutdown(self) -> None:
        pass


def configure_tensorflow(config: RunConfig):
    """Import TensorFlow quietly and set its thread pools. Thread settings
    must come before TensorFlow starts its runtime (the first op)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(config["threads"])
    # A second inter-op thread unless the design asks for one (a core free
    # beside threads: 1). One did not hang a collective: 2-rank runs of every
    # TensorFlow framework trained with it, and Tarantella's finish ops,
    # which block their thread, run only after a barrier op on all of the
    # step's starts (tests/test_knobs.py trains 2 Tarantella ranks so).
    inter_op = config.get("inter_op_threads") or max(2, config["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    return tf


def pin_device(tf, config: RunConfig, local_rank: int) -> None:
    """One GPU per process (the local rank's), or none on device: cpu.
    Must run before TensorFlow initialises its devices."""
    gpus = tf.config.list_physical_devices("GPU")
    if config["device"] == "cpu":
        tf.config.set_visible_devices([], "GPU")
        return
    if local_rank >= len(gpus):
        raise common.RunError(
            f"device: gpu was asked for, but TensorFlow sees {len(gpus)} GPU(s) "
            f"here and local rank {local_rank} needs one of its own"
        )
    tf.config.set_visible_devices(gpus[local_rank], "GPU")


def _start(tf, adapter: TFAdapter, config: RunConfig, run_dir: Path):
    """What both loops do first, inside the init phase: the framework's init,
    the seed, the run clock, the data, the global batch and its learning rate."""
    adapter.config = config
    dist = adapter.init(config)
    energy.start_sampling(config, run_dir, dist)
    tf.random.set_seed(config["seed"])
    clock = common.RunClock()
    dataset = data.load(config["dataset"], config["data_dir"])
    plan = balance.even_plan(config, dist, adapter.replicas)
    return dist, clock, dataset, plan, models.scaled_learning_rate(config, plan.global_batch)


def train(adapter: TFAdapter, config: RunConfig, run_dir: Path) -> None:
    if adapter.uses_fit:
        return train_fit(adapter, config, run_dir)
    tf = configure_tensorflow(config)
    phases = tracing.recorder(config)
    adapter.phases = phases
    init_start = time.perf_counter()
    with phases("init"):
        dist, clock, dataset, plan, lr = _start(tf, adapter, config, run_dir)
        phases.one_rank = plan.world == 1
        with adapter.scope():
            model = keras_models.build(models.MODELS[config["model"]], dataset.info, config["seed"])
            optimizer = keras_models.optimizer(config, lr)
            optimizer.build(model.trainable_variables)
        variables = model.trainable_variables
        adapter.broadcast_initial_state(model.variables + _optimizer_variables(optimizer))
        loss_fn = keras_models.per_example_loss(models.MODELS[config["model"]])
        if balance.calibrates(config):  # the same global batch, cut by speed
            plan = _calibrated_plan(tf, adapter, config, dist, model, dataset, loss_fn)
        step_fns = _StepFunctions(
            tf,
            model,
            loss_fn,
            adapter.gradient_allreduce(),
            adapter.apply_gradients(optimizer, variables),
            plan,
        )
    init_s = time.perf_counter() - init_start
    tracing.attach(phases, config, run_dir, dist.rank, dist.world)

    n_train, n_test, steps = common.epoch_sizes(config, dataset, plan.world)
    evaluate = functools.partial(
        _evaluate, step_fns.evaluate, dataset, dist, batch=config["batch_size"], n_test=n_test
    )
    steps_of = _TFSteps(tf, adapter, step_fns, dataset, config, phases, evaluate)
    rows = epoch_loop.run(steps_of, config, plan, dist, phases, clock, run_dir, n_train, steps)
    _finish(adapter, phases, run_dir, dist, model, rows, plan, lr, steps, init_s, clock)


class _TFSteps:
    """The TensorFlow family's part of the epoch loop (frameworks/epoch_loop.py)."""

    def __init__(
        self,
        tf,
        adapter: TFAdapter,
        step_fns: _StepFunctions,
        dataset,
        config: RunConfig,
        phases: PhaseRecorder,
        evaluate,
    ):
        self.tf, self.adapter, self.step_fns, self.dataset = tf, adapter, step_fns, dataset
        self.phases, self.evaluate = phases, evaluate
        self.device_kind = "gpu" if config["device"] == "gpu" else "cpu"
        self.allreduce = adapter.allreduce
        self.forward_backward = step_fns.forward_backward(phases)

    def begin_epoch(self) -> None:
        self.loss_sum = self.tf.zeros((), self.tf.float64)
        self.correct = self.tf.zeros((), self.tf.int64)

    def step(self, take) -> None:
        tf, adapter, phases, info = self.tf, self.adapter, self.phases, self.dataset.info
        with phases("data_load"):
            x = adapter.per_replica(keras_models.images(self.dataset.train_x[take], info))
            y = adapter.per_replica(self.dataset.train_y[take])
        loss, hits, grads = adapter.replica(self.forward_backward, x, y)
        with phases("grad_comm"):
            grads = self.step_fns.allreduce(grads)
        with phases("optimizer"):
            self.step_fns.apply(grads)
            images = len(take) // adapter.replicas  # each replica's mean loss is over these
            for replica_loss in adapter.local_results(loss):
                self.loss_sum += tf.cast(replica_loss, tf.float64) * images
            for replica_hits in adapter.local_results(hits):
                self.correct += replica_hits

    def after_step(self) -> None:
        pass

    def train_sums(self) -> tuple[float, float]:
        return float(self.loss_sum), float(self.correct)


class _StepFunctions:
    """The compiled pieces of one step. Forward and backward are separate
    calls (a compiled forward under an eager tape, then tape.gradient), so
    that each is its own phase."""

    def __init__(self, tf, model, loss_fn, allreduce, apply, plan: balance.BatchPlan | None):
        self.tf, self.model, self.loss_fn = tf, model, loss_fn
        self.allreduce, self.apply = allreduce, apply
        # a calibrated split weighs each rank's gradient by its images
        self.weight, self.rank = (plan.loss_weight, plan.rank) if plan else (1.0, 0)
        self.forward = tf.function(self._forward)
        self.evaluate = tf.function(self._evaluate)

    def _forward(self, x, y):
        logits = self.model(x, training=True)
        loss = self.tf.reduce_mean(self.loss_fn(y, logits))
        return loss, self._hits(logits, y)

    def _evaluate(self, x, y):
        logits = self.model(x, training=False)
        return self.tf.reduce_sum(self.loss_fn(y, logits)), self._hits(logits, y)

    def _hits(self, logits, y):
        tf = self.tf
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int64))

    def forward_backward(self, phases: PhaseRecorder):
        def run(x, y):
            with phases("forward"):
                with self.tf.GradientTape() as tape:
                    loss, hits = self.forward(x, y)
                    weighted = loss * self.weight if self.weight != 1 else loss
                balance.slow_down(self.rank, len(y))
            with phases("backward"):
                grads = tape.gradient(weighted, self.model.trainable_variables)
            return loss, hits, grads

        return run


def _calibrated_plan(
    tf, adapter: TFAdapter, config: RunConfig, dist: Dist, model, dataset, loss_fn
) -> balance.BatchPlan:
    """Shares from timing a few local steps of a copy of the model, made
    outside the strategy's scope so that no step communicates."""
    probe = tf.keras.models.clone_model(model)
    take = slice(0, config["batch_size"])
    x = tf.constant(keras_models.images(dataset.train_x[take], dataset.info))
    y = tf.constant(dataset.train_y[take])

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, probe(x, training=True)))
        return tape.gradient(loss, probe.trainable_variables)

    def one_step():
        gradients()[0].numpy()  # waits for the step (device work is asynchronous)
        balance.slow_down(dist.rank, config["batch_size"])

    return balance.calibrated_plan(config, dist, one_step, adapter.allreduce)


def _optimizer_variables(optimizer) -> list:
    found = optimizer.variables
    return list(found() if callable(found) else found)


def _evaluate(
    evaluate, dataset: data.Dataset, dist: Dist, sums: common.EpochSums, batch: int, n_test: int
) -> None:
    """Distributed evaluation: each rank scores every world-th of the first
    ``n_test`` test images."""
    import tensorflow as tf

    ids = np.arange(dist.rank, n_test, dist.world)
    eval_batch = max(batch, 256)
    loss, correct = 0.0, 0
    for start in range(0, len(ids), eval_batch):
        take = ids[start : start + eval_batch]
        batch_loss, hits = evaluate(
            tf.constant(keras_models.images(dataset.test_x[take], dataset.info)),
            tf.constant(dataset.test_y[take]),
        )
        loss += float(batch_loss)
        correct += int(hits)
    sums.test_loss, sums.test_correct, sums.test_images = loss, correct, len(ids)


def _finish(adapter, phases, run_dir, dist, model, rows, plan, lr, steps, init_s, clock) -> None:
    digests = replica_digests(model)
    versions = framework_versions(adapter)
    if len(digests) > 1:  # one process's several replicas: each one's weights
        versions["replica_params_digests"] = digests
    common.finish(
        adapter,
        run_dir,
        phases,
        dist,
        versions,
        digests[0],
        common.summary(rows, plan.world, plan.global_batch, lr, steps, init_s, clock),
    )


def replica_digests(model) -> list[str]:
    """SHA-256 of every trainable weight's bytes, one per local replica (a
    strategy's mirrored variable holds one copy per device): equal on all
    ranks and replicas iff they hold the same weights. BN moving statistics
    are left out: they are per process (the spec's plain BN)."""
    copies = [getattr(variable, "values", (variable,)) for variable in model.trainable_weights]
    digests = []
    for replica in range(len(copies[0])):
        digest = hashlib.sha256()
        for variable in copies:
            digest.update(np.ascontiguousarray(variable[replica].numpy()).tobytes())
        digests.append(digest.hexdigest())
    return digests


def framework_versions(adapter: TFAdapter) -> dict:
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": tf.keras.__version__, **adapter.versions()}


def train_fit(adapter: TFAdapter, config: RunConfig, run_dir: Path) -> None:
    """The loop for frameworks that own the step: one ``fit`` per epoch on
    the epoch's images in the shared order, batched by the GLOBAL batch (the
    framework splits each global batch between the ranks: the same images
    per global step as the custom loop's round-robin shards)."""
    tf = configure_tensorflow(config)
    phases = tracing.recorder(config)
    init_start = time.perf_counter()
    with phases("init"):
        dist, clock, dataset, plan, lr = _start(tf, adapter, config, run_dir)
        global_batch = plan.global_batch
        spec = models.MODELS[config["model"]]
        keras_model = keras_models.build(spec, dataset.info, config["seed"])
        model = adapter.wrap_for_fit(
            keras_model,
            keras_models.optimizer(config, lr),
            keras_models.per_example_loss(spec, "sum_over_batch_size"),
            ["accuracy"],
        )
        evaluate = _StepFunctions(
            tf, keras_model, keras_models.per_example_loss(spec), None, None, None
        ).evaluate
    init_s = time.perf_counter() - init_start
    tracing.attach(phases, config, run_dir, dist.rank, dist.world)

    n_train, n_test, steps = common.epoch_sizes(config, dataset, dist.world)
    batch = config["batch_size"]
    timer = _fit_step_timer(phases, config["warmup_steps"], adapter.fit_step_phases(phases))
    rows = []
    for epoch in range(1, config["epochs"] + 1):
        epoch_start = time.perf_counter()
        phases.begin_epoch(epoch)
        order = np.random.default_rng([config["seed"], epoch]).permutation(n_train)
        take = order[: steps * global_batch]
        images = tf.data.Dataset.from_tensor_slices(
            (keras_models.images(dataset.train_x[take], dataset.info), dataset.train_y[take])
        )
        timer.state.epoch = epoch
        history = model.fit(
            adapter.fit_dataset(images.batch(global_batch)),
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[adapter.fit_callback(timer)],
        )
        # fit reports epoch means (this rank's or already global: weighting
        # by this rank's images gives the global mean after the sum either way).
        sums = common.EpochSums(
            train_loss=history.history["loss"][-1] * steps * batch,
            train_correct=history.history["accuracy"][-1] * steps * batch,
            train_images=steps * batch,
            measured_images=batch * timer.state.measured_steps,
        )
        measured_s = timer.state.measured_s
        if common.evaluates(config, epoch):
            with phases.evaluation():
                _evaluate(evaluate, dataset, dist, sums, batch, n_test)
        rows.append(epoch_loop.epoch_row(adapter, epoch, epoch_start, sums, measured_s, clock))
        phases.end_epoch()
        if dist.rank == 0:
            common.write_epochs(run_dir, rows)
    _finish(adapter, phases, run_dir, dist, keras_model, rows, plan, lr, steps, init_s, clock)


class _Shared:
    """State that deep copies share instead of copying."""

    def __deepcopy__(self, memo):
        return self


def _fit_step_timer(phases: PhaseRecorder, warmup_steps: int, record):
    """A Keras callback recording each fit step as one step, its phases by
    ``record(start_ns, end_ns)``, and the epoch's measured steps and seconds
    (after warm-up), in its ``state``.

    Tarantella wraps each user callback at every fit, deep-copying each of
    its attributes (v0.8.0 and master, keras/callbacks.py): the state is one
    _Shared object, and the callback keeps no model (a Keras model cannot be
    deep-copied with Tarantella's optimizer in it)."""
    import tensorflow as tf

    class FitStepTimer(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.state = _Shared()
            self.state.epoch, self.state.step, self.state.start = 0, 0, 0
            self.state.record = record

        def set_model(self, model):
            pass  # not needed, and not deep-copyable under Tarantella

        def on_train_begin(self, logs=None):  # each fit call is one epoch
            state = self.state
            state.measured_steps, state.measured_s, state.measured_start = 0, 0.0, None

        def on_train_batch_begin(self, batch, logs=None):
            state = self.state
            if state.step >= warmup_steps and state.measured_start is None:
                state.measured_start = time.perf_counter()
            phases.begin_step(state.epoch, state.step)
            state.start = time.perf_counter_ns()

        def on_train_batch_end(self, batch, logs=None):
            state = self.state
            end = time.perf_counter_ns()
            state.record(state.start, end)
            phases.end_step(end)
            state.measured_steps += state.measured_start is not None
            state.step += 1

        def on_train_end(self, logs=None):
            state = self.state
            if state.measured_start is not None:
                state.measured_s = time.perf_counter() - state.measured_start

    return FitStepTimer()
