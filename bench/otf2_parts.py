"""Where ``tracer: otf2`` (our own tracer) spends its time, part by part, as
bench/scorep_parts.py does for Score-P: each call our tracer adds, timed in
this process with the OTF2 sink and without it (``tracer: none``, the
baseline), times the calls a real step makes, against that step's time.

- phase: one ``with recorder(phase)`` inside a step (every adapter's phase
  hook); the sink keeps the interval;
- step: ``begin_step`` / ``end_step``; the sink is told the step after the
  step's end stamp, so its call is in no step's time (counted anyway);
- collective: ``recorder.collective`` as the communication hook calls it for
  each all-reduce (DDP's hook, Horovod's compressor; it runs with every
  tracer, ``none`` included: only the sink's share is tracing's);
- gc: one full ``gc.collect()`` with the run's records held, against none;
- hand-over: the end of the run (each rank's part written, the last rank
  assembles the archive), per recorded step. It runs after the last step
  (``phases.write`` in ``frameworks/common.finish``): it is in the run's wall
  time, never in its steps' times.

Calls per step and the step time come from a real traced run (torch-ddp, 2
processes, the CNN): its archive read back (phase rows and collectives per
step) and its steps tables (median step, slower rank). Each call is timed in
CPU time of this thread (other jobs' preemption does not count), the minimum
over repeats, with and without the sink alternately.

Then the sum, measured whole: ``--pairs`` pairs of real training steps
(torch-ddp's adapter with its communication hook, 2 processes over gloo, the
CNN, batch 64 of Fashion-MNIST), one step of each pair with the OTF2 sink
attached and one without, in an order drawn per pair (seeded, the same on
both ranks). Both steps of a pair see the same machine, so the pair's ratio
(traced / untraced, the slower rank's step) cancels the drift that whole
runs cannot; the figure is the median ratio with its sign-test 95 %
interval (bench/tracing_overhead.py), "cannot be shown at this noise" where
the interval holds both sides of the goal.

    .venv/bin/python bench/otf2_parts.py [--calls 100000] [--steps 60] [--no-run]
        [--pairs 1000] [--seed 1] [--pairs-framework torch-ddp --pairs-framework horovod-torch]
Last line: key=value pairs (each part, its baseline, the share of a step).
"""

import argparse
import statistics
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from frameworks import registry  # noqa: E402
from traces import readers  # noqa: E402
from frameworks.otf2_writer import Otf2Sink, archive_anchor  # noqa: E402
from runfiles.phases import STEP, STEP_PHASES  # noqa: E402
from frameworks.recorder import PhaseRecorder  # noqa: E402
from traces.rules import PhaseRules  # noqa: E402
from measuring import figures_line, holding_the_machine, load  # noqa: E402

GOAL = 0.01  # otf2 over none
REPEATS = 7
LOOP = ("data_load", "forward", "backward", "grad_comm", "optimizer")  # a CPU step's phases


def recorder(folder: Path | None, rank: int = 0, world: int = 1) -> PhaseRecorder:
    phases = PhaseRecorder()
    phases.measures_bytes = True
    if folder is not None:
        phases.attach([Otf2Sink(folder, rank, world, "bench")])
    return phases


def cpu_ns_per_call(body, calls: int) -> float:
    start = time.thread_time_ns()
    body(calls)
    return (time.thread_time_ns() - start) / calls


def paired(make_body, calls: int, tmp: Path) -> dict:
    """ns per call with the sink and without, alternating, minimum of each."""
    best = {"none": float("inf"), "otf2": float("inf")}
    for _ in range(REPEATS):
        for tracer in best:
            body = make_body(recorder(tmp if tracer == "otf2" else None))
            best[tracer] = min(best[tracer], cpu_ns_per_call(body, calls))
    return best


def phase_body(phases: PhaseRecorder):
    phases.begin_step(1, 0)

    def body(calls):
        for _ in range(calls):
            with phases("forward"):
                pass

    return body


def step_body(phases: PhaseRecorder):
    def body(calls):
        for step in range(calls):
            phases.begin_step(1, step)
            phases.end_step()

    return body


def collective_body(phases: PhaseRecorder):
    phases.begin_step(1, 0)

    def body(calls):
        for _ in range(calls):
            now = time.perf_counter_ns()
            phases.collective("allreduce", 1 << 20, now, now + 1000)

    return body


def record_steps(phases: PhaseRecorder, steps: int, collectives: int) -> None:
    for step in range(steps):
        phases.begin_step(1, step)
        for name in LOOP:
            with phases(name):
                if name == "backward":
                    for _ in range(collectives):
                        now = time.perf_counter_ns()
                        phases.collective("allreduce", 1 << 20, now, now + 1000)
        phases.end_step()


def gc_part(steps: int, collectives: int, tmp: Path) -> dict:
    """A full collection with a run's records held: tuples of ints are
    untracked by the collector once it has seen them."""
    out = {}
    for tracer in ("none", "otf2"):
        phases = recorder(tmp if tracer == "otf2" else None)
        record_steps(phases, steps, collectives)
        gc.collect()
        start = time.thread_time_ns()
        gc.collect()
        out[tracer] = (time.thread_time_ns() - start) / 1e6
    return out


def handover_part(steps: int, collectives: int, tmp: Path) -> dict:
    """Two ranks' parts and the archive, wall time per recorded step."""
    ranks = [recorder(tmp, rank, 2) for rank in (0, 1)]
    for phases in ranks:
        record_steps(phases, steps, collectives)
    start = time.perf_counter()
    for phases in ranks:  # the sink's share of phases.write (the tables are every tracer's)
        for sink in phases.sinks:
            sink.close()
    elapsed = time.perf_counter() - start
    assert archive_anchor(tmp).exists()
    return {"per_step_us": elapsed / steps * 1e6, "total_ms": elapsed * 1e3}


def real_run(steps: int, warmup: int) -> dict:
    """Calls per step and the step time of a real traced torch-ddp run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tracing_overhead import traced_run

    with tempfile.TemporaryDirectory() as tmp:
        folder, step_s = traced_run("otf2", "torch-ddp", steps, warmup, Path(tmp))
        table, problems = readers.read(archive_anchor(folder), PhaseRules(), "bench")
        df = table.to_pandas()
    if problems:
        sys.exit(f"the run's trace reads with problems: {problems}")
    in_steps = df[(df["step"] >= 0) & df["step"].notna()]
    n = in_steps[in_steps["phase"] == STEP].groupby("rank").size().min()
    comm = in_steps[in_steps["collective"].notna()]
    phase_rows = in_steps[in_steps["collective"].isna() & in_steps["phase"].isin(STEP_PHASES)]
    return {
        "steps": int(n),
        "phases_per_step": len(phase_rows) / df["rank"].nunique() / n,
        "collectives_per_step": len(comm) / df["rank"].nunique() / n,
        "step_ms": step_s["median"] * 1e3,
    }


def child_pairs(framework: str, pairs: int, seed: int, out: str) -> None:
    """One rank of the interleaved run (started by torchrun or horovodrun):
    its step times and which were traced."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from frameworks import data, models
    from frameworks.torch_family import build_model

    torch.set_num_threads(1)  # the harness's default (threads: 1)
    adapter, phases = registry.load_adapter(framework), recorder(None)
    adapter.phases = phases
    dist = adapter.init({"device": "cpu", "compression": "none"})
    rank, world = dist.rank, dist.world
    adapter.device = torch.device("cpu")
    torch.manual_seed(0)
    dataset = data.load("fashion-mnist")
    model = build_model(models.MODELS["cnn"], dataset.info)
    mean = torch.tensor(dataset.info.mean).view(1, -1, 1, 1)  # as the harness normalises
    std = torch.tensor(dataset.info.std).view(1, -1, 1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model, optimizer = adapter.wrap(model, optimizer)
    sink = Otf2Sink(Path(out), rank, world, "pairs")
    draw = random.Random(seed)  # the same draws on every rank
    traced = [t for _ in range(pairs) for t in draw.sample([True, False], 2)]
    batch, n = 64, len(dataset.train_y)
    for step, on in enumerate(traced):
        phases.sinks = [sink] if on else []
        take = (
            np.arange(batch) + (step * world + rank) * batch
        ) % n  # a copy, as the harness takes
        phases.begin_step(1, step)
        with phases("data_load"):
            x = (torch.from_numpy(dataset.train_x[take]).float().div_(255) - mean) / std
            y = torch.from_numpy(dataset.train_y[take])
        with phases("forward"):
            loss = F.cross_entropy(model(x), y)
        with phases("backward"):
            adapter.backward(loss, optimizer)
        with phases("grad_comm"):
            adapter.sync_gradients(optimizer)
        with phases("optimizer"):
            adapter.step(optimizer)
        phases.end_step()
    times = [end - start for _, _, start, end, *_ in phases.steps]
    Path(out, f"pairs.rank{rank}.json").write_text(json.dumps({"ns": times, "traced": traced}))
    adapter.shutdown()


LAUNCHERS = {
    "torch-ddp": ["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python"],
    "horovod-torch": ["horovodrun", "--mpi", "-np", "2", "-H", "localhost:2"],
}


def pairs_part(framework: str, pairs: int, seed: int, warmup: int, tmp: Path) -> dict:
    """Median traced/untraced ratio over the pairs, with its interval."""
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tracing_overhead import sign_interval, verdict

    launcher = LAUNCHERS[framework]
    argv = [str(Path(sys.executable).parent / launcher[0]), *launcher[1:], sys.executable]
    argv += [str(Path(__file__).resolve()), "child-pairs", framework, str(pairs), str(seed)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run([*argv, str(tmp)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    ranks = [json.loads(Path(tmp, f"pairs.rank{r}.json").read_text()) for r in (0, 1)]
    slower = [max(values) for values in zip(*(r["ns"] for r in ranks))]
    traced = ranks[0]["traced"]
    ratios = []
    for i in range(2 * warmup, len(slower), 2):
        on, off = (i, i + 1) if traced[i] else (i + 1, i)
        ratios.append(slower[on] / slower[off] - 1)
    interval = sign_interval(ratios) or (float("nan"), float("nan"))
    return {
        "pairs": len(ratios),
        "overhead": statistics.median(ratios),
        "low": interval[0],
        "high": interval[1],
        "verdict": verdict(sign_interval(ratios), GOAL),
        "step_ms_untraced": statistics.median(
            s for s, t in zip(slower[2 * warmup :], traced[2 * warmup :]) if not t
        )
        / 1e6,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child-pairs":
        framework, pairs, seed, out = sys.argv[2:6]
        child_pairs(framework, int(pairs), int(seed), out)
        return

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100000)
    parser.add_argument("--steps", type=int, default=60, help="of the real run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-run", action="store_true", help="5 phases, 2 collectives, 32 ms")
    parser.add_argument("--pairs", type=int, default=1000, help="interleaved step pairs; 0: none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--pairs-framework", action="append", choices=sorted(LAUNCHERS), default=None
    )
    args = parser.parse_args()
    if args.no_run:
        run = {"steps": 0, "phases_per_step": 5.0, "collectives_per_step": 2.0, "step_ms": 32.0}
    else:
        run = real_run(args.steps, args.warmup)
    print(
        f"real run (torch-ddp, 2 processes, tracer otf2): {run['phases_per_step']:.2f} phases "
        f"and {run['collectives_per_step']:.2f} collectives per step, median step "
        f"{run['step_ms']:.2f} ms",
        flush=True,
    )
    figures = {f"run_{k}": v for k, v in run.items()}
    added = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for sub in ("gc", "handover"):
            (tmp / sub).mkdir()
        per_step = {
            "phase": run["phases_per_step"],
            "step": 1,
            "collective": run["collectives_per_step"],
        }
        for part, make_body in (
            ("phase", phase_body),
            ("step", step_body),
            ("collective", collective_body),
        ):
            best = paired(make_body, args.calls, tmp)
            extra = max(best["otf2"] - best["none"], 0.0)
            in_step = part != "step"  # the sink's step call is after the step's end
            added += extra * per_step[part] if in_step else 0.0
            figures[f"{part}_ns_otf2"] = best["otf2"]
            figures[f"{part}_ns_baseline"] = best["none"]
            print(
                f"{part}: {best['otf2']:.0f} ns a call with the OTF2 sink, {best['none']:.0f} ns "
                f"without (tracer none); {per_step[part]:.2f} a step"
                + ("" if in_step else ", outside the step's time"),
                flush=True,
            )
        steps = max(run["steps"], 1000)
        collectives = round(run["collectives_per_step"])
        held = gc_part(steps * 10, collectives, tmp / "gc")
        print(
            f"gc: a full collection {held['otf2']:.1f} ms with {steps * 10} steps recorded by "
            f"the sink, {held['none']:.1f} ms without",
            flush=True,
        )
        hand = handover_part(steps, collectives, tmp / "handover")
        print(
            f"hand-over (2 ranks' parts, the archive): {hand['per_step_us']:.0f} us per step "
            f"recorded ({hand['total_ms']:.0f} ms for {steps} steps), after the last step",
            flush=True,
        )
    share = added / (run["step_ms"] * 1e6)
    print(
        f"in the steps: {added / 1e3:.2f} us a step = {share * 100:.4f} % of a "
        f"{run['step_ms']:.1f} ms step (goal < {GOAL * 100:.0f} %); {load()}"
    )
    for framework in (args.pairs_framework or ["torch-ddp"]) if args.pairs else []:
        with tempfile.TemporaryDirectory() as tmp:
            whole = pairs_part(
                framework, args.pairs + args.warmup, args.seed, args.warmup, Path(tmp)
            )
        print(
            f"whole steps, interleaved ({whole['pairs']} pairs, {framework}, 2 processes): the "
            f"traced step {whole['overhead']:+.2%} [{whole['low']:+.2%}, {whole['high']:+.2%}] "
            f"over its untraced twin (untraced median {whole['step_ms_untraced']:.2f} ms), "
            f"goal < {GOAL:.0%}: {whole['verdict']}; {load()}",
            flush=True,
        )
        key = framework.replace("-", "_")
        figures.update(
            {
                f"pairs_{key}": whole["pairs"],
                f"pair_step_ms_baseline_{key}": whole["step_ms_untraced"],
                f"pair_overhead_otf2_{key}": whole["overhead"],
                f"pair_overhead_otf2_low_{key}": whole["low"],
                f"pair_overhead_otf2_high_{key}": whole["high"],
                f"pair_verdict_otf2_{key}": whole["verdict"].replace(" ", "_"),
            }
        )
    figures.update(
        gc_ms_otf2=held["otf2"],
        gc_ms_baseline=held["none"],
        handover_us_per_step=hand["per_step_us"],
        in_step_us_otf2=added / 1e3,
        in_step_share_otf2=share,
        goal_overhead_otf2=GOAL,
    )
    print(figures_line(figures))


if __name__ == "__main__":
    with holding_the_machine("OTF2 tracer's parts"):
        main()
