"""What reading Tarantella's step phases back costs its step
(``fit_step_phases``, frameworks/adapters/tarantella.py): one real 2-rank Tarantella
fit whose steps alternate, in pairs of a seeded random order, between
Keras' own compiled step and the same step with our timestamps, each
stamped step followed by its reading (the stamps read back, the phases and
all-reduces recorded). Same model, communicator and data. Goal: at most
1 % of the step.

Per pair, the slower rank's stamped step over its plain one, minus 1; the
figure is the median of those with its 95 % interval from the sign test
(bench/tracing_overhead.py's). Where the interval holds both sides of the
goal, it says "cannot be shown at this noise" and claims neither.

    .venv/bin/python bench/tarantella_stamps.py [--pairs 300] [--warmup 10] [--seed 1]
Needs the Tarantella build (bash envs/build-tarantella.sh; DDLC_VENV_TARANTELLA,
or the patched build's prefix). Last line: key=value pairs.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

GOAL = 0.01
BATCH = 32  # per process, as the tests' tiny design


def child(out: Path, pairs: int, seed: int) -> None:
    """One rank, under Tarantella's launcher: its step times and which were stamped."""
    import numpy as np

    from frameworks import data, keras_models, models, tf_family
    from frameworks.adapters import tarantella
    from frameworks.recorder import PhaseRecorder

    config = json.loads((out / "config.json").read_text())
    tf = tf_family.configure_tensorflow(config)
    adapter = tarantella.Adapter()
    adapter.config = config  # as the harness's loop sets it before init
    dist = adapter.init(config)
    dataset = data.load(config["dataset"])
    spec = models.MODELS[config["model"]]
    model = adapter.wrap_for_fit(
        keras_models.build(spec, dataset.info, config["seed"]),
        keras_models.optimizer(config, config["learning_rate"]),
        keras_models.per_example_loss(spec, "sum_over_batch_size"),
        ["accuracy"],
    )
    phases = PhaseRecorder()
    record = adapter.fit_step_phases(phases)
    stepper = model.model  # the Keras model inside tnt.Model
    functions = {}
    for stamped in (False, True):
        stepper.stamping = stamped  # read when the function is traced (its first call)
        functions[stamped] = stepper.make_train_function(force=True)
    draw = random.Random(seed)  # the same order on every rank
    order = [s for _ in range(pairs) for s in draw.sample([True, False], 2)]
    times: list[int] = []
    reading: list[int] = []

    def alternating(iterator):
        stamped = order[len(times)]
        stepper.stamping = stamped
        phases.begin_step(1, len(times))
        start = time.perf_counter_ns()
        logs = functions[stamped](iterator)
        if stamped:
            before = time.perf_counter_ns()
            record(start, before)
            reading.append(time.perf_counter_ns() - before)
        times.append(time.perf_counter_ns() - start)
        phases.end_step()
        return logs

    stepper.train_function = alternating  # fit takes the one it finds
    global_batch = BATCH * dist.world
    take = np.arange(len(order) * global_batch) % len(dataset.train_y)
    images = tf.data.Dataset.from_tensor_slices(
        (keras_models.images(dataset.train_x[take], dataset.info), dataset.train_y[take])
    )
    model.fit(images.batch(global_batch), epochs=1, verbose=0, shuffle=False)
    parts = {"reading_ns": statistics.median(reading), "stamps_ns": stamps_ns(tf, adapter)}
    (out / f"pairs.rank{dist.rank}.json").write_text(
        json.dumps({"ns": times, "stamped": order, **parts})
    )


def stamps_ns(tf, adapter, calls: int = 2000) -> float:
    """The graph's part from its parts: a compiled function of as many
    timestamps as a step takes and their write, against an empty one
    (medians of many calls; the call itself cancels)."""
    slots = adapter.stamps

    @tf.function
    def empty(x):
        return x

    @tf.function
    def stamped(x):
        values = []
        for _ in range(slots.shape[0]):
            with tf.control_dependencies([x]):
                values.append(tf.timestamp())
        slots.assign(tf.stack(values))
        return x

    def median_ns(function) -> float:
        x = tf.constant(1.0)
        function(x)  # traced
        found = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            function(x)
            found.append(time.perf_counter_ns() - start)
        return statistics.median(found)

    return median_ns(stamped) - median_ns(empty)


def launch(out: Path, pairs: int, seed: int) -> None:
    """Both ranks under Tarantella's launcher, as the harness starts them."""
    from ddlcompare.plan import design
    from ddlcompare.run import launch as launching
    from ddlcompare.run import schedulers

    doc = {
        "name": "bench",
        "factors": {"framework": ["tarantella"], "procs_per_node": [2], "batch_size": [BATCH]},
        "fixed": {"tracer": "none", "fit_step_phases": True},  # the stamped step is built
    }
    config = {**design.parse(doc, "bench").runs()[0].config, "run_id": "bench"}
    (out / "config.json").write_text(json.dumps(config))
    hosts = [schedulers.Host("localhost", 2)]
    argv, env = launching.command("tarantella", hosts, config, out, "local")
    argv = argv[: argv.index("--") + 1] + [
        *(str(Path(__file__).resolve()), "child", str(out), str(pairs), str(seed)),
    ]
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def overhead(out: Path, warmup: int) -> dict:
    """The median stamped/plain ratio over the pairs, with its interval."""
    from tracing_overhead import sign_interval, verdict

    ranks = [json.loads((out / f"pairs.rank{r}.json").read_text()) for r in (0, 1)]
    slower = [max(values) for values in zip(*(r["ns"] for r in ranks))]
    stamped = ranks[0]["stamped"]
    ratios = []
    for i in range(2 * warmup, len(slower) - 1, 2):
        on, off = (i, i + 1) if stamped[i] else (i + 1, i)
        ratios.append(slower[on] / slower[off] - 1)
    interval = sign_interval(ratios)
    plain = [s for s, on in zip(slower[2 * warmup :], stamped[2 * warmup :]) if not on]
    step_ns = statistics.median(plain)
    parts_ns = max(r["reading_ns"] + r["stamps_ns"] for r in ranks)
    return {
        "pairs": len(ratios),
        "overhead": statistics.median(ratios),
        "low": interval[0] if interval else float("nan"),
        "high": interval[1] if interval else float("nan"),
        "verdict": verdict(interval, GOAL),
        "step_ms_plain": step_ns / 1e6,
        "parts_us": parts_ns / 1e3,
        "parts_share": parts_ns / step_ns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10, help="pairs left out first")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from measuring import figures_line, holding_the_machine, load

    with holding_the_machine("tarantella stamps"), tempfile.TemporaryDirectory() as tmp:
        launch(Path(tmp), args.pairs + args.warmup, args.seed)
        found = overhead(Path(tmp), args.warmup)
    print(
        f"tarantella_stamps: {found['pairs']} pairs, plain step {found['step_ms_plain']:.1f} ms, "
        f"overhead {found['overhead']:+.2%} [95 %: {found['low']:+.2%}, {found['high']:+.2%}]: "
        f"{found['verdict']}; from its parts (stamps and their reading) "
        f"{found['parts_us']:.0f} us, {found['parts_share']:.3%} of the step; {load()}"
    )
    found["verdict"] = found["verdict"].replace(" ", "_")  # one key=value each
    print(figures_line({**found, "goal": GOAL}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
