"""The same-model gate, run by the harness: asks every builder in its own
environment (frameworks/model_gate.py gives the rows) and judges them
against the shared specification.

    python -m ddlcompare.run.model_gate [--out FILE]     # the gate of every model, as JSON
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ddlcompare.plan import envs
from ddlcompare.run import stopping
from ddlcompare.run.launch import LOCAL_SSH
from ddlcompare.run.launchers.tarantella import GPI2_LOCK
from ddlcompare.run.provenance import REPO
from frameworks import data, models
from frameworks.model_gate import (
    BUILDERS,
    COMPARED,
    builder_rows,
    compare,
    frameworks_of,
    reference_rows,
)
from runfiles.atomic import write_text
from runfiles import variables
from runfiles import files


# Builders' answers, kept by what they depend on (answer_key): each
# workflow gates every builder, and starting TensorFlow or Tarantella again
# for the same code and the same environments only costs time.
CACHE = variables.cache("model-gate")
# Starting TensorFlow and Tarantella and building ResNet-34 takes a minute on
# a loaded machine; ten is a builder that hangs.
BUILDER_TIMEOUT_S = 600


def answer_key(builder: str, model: str, datasets: tuple[str, ...]) -> str:
    """The training side's code, the builder's environment (its interpreter,
    when its packages last changed, the versions its build recorded) and
    the question."""
    digest = hashlib.sha256(f"{builder}|{model}|{','.join(datasets)}".encode())
    digest.update(_training_code_digest())
    env_dir = envs.env_dir(BUILDERS[builder])
    python = envs.python_for(BUILDERS[builder])
    digest.update(f"{python}|{python.resolve() if python.exists() else ''}".encode())
    for site in sorted(env_dir.glob("lib/python*/site-packages")):
        digest.update(str(site.stat().st_mtime_ns).encode())
    for record in (env_dir / "versions.json", env_dir.parent / "versions.json"):
        if record.is_file():
            digest.update(record.read_bytes())
    return digest.hexdigest()[:24]


# What a builder can import of ours: the training side and the layer below
# it (tests/test_layers.py: frameworks/ imports only itself and runfiles/).
TRAINING_PACKAGES = ("frameworks", "runfiles")


def training_code_files(root: Path = REPO) -> list[Path]:
    """Every module a builder may run, sub-folders included (an adapter
    moved into a folder of its own stays in the key)."""
    return sorted(path for package in TRAINING_PACKAGES for path in (root / package).rglob("*.py"))


@functools.cache
def _training_code_digest() -> bytes:
    """The builders' code, read once per gate (every question asks it): each
    file's path and content."""
    digest = hashlib.sha256()
    for path in training_code_files():
        digest.update(f"{path.relative_to(REPO)}\0".encode())
        digest.update(path.read_bytes())
    return digest.digest()


def ask(builder: str, model: str, datasets: tuple[str, ...], cache: bool = True) -> dict:
    """One builder's answer per data set: from the cache where the same
    question met the same code and environment, else from the interpreter of
    its environment (one start-up for all data sets)."""
    kept = CACHE / f"{answer_key(builder, model, datasets)}.json" if cache else None
    if kept is not None and kept.is_file():
        try:
            return files.read_json(kept)
        except ValueError:
            pass  # a damaged entry: asked again, and written anew
    answer = _ask_builder(builder, model, datasets)
    if kept is not None and not any("error" in a for a in answer.values()):
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_text(kept, json.dumps(answer))
    return answer


def _ask_builder(builder: str, model: str, datasets: tuple[str, ...]) -> dict:
    env = BUILDERS[builder]
    python = envs.python_for(env)
    if not python.exists():
        if builder == "lbann":  # its graph needs no LBANN: check it here
            return {
                d: dict(zip(("rows", "checked_on"), builder_rows(builder, model, d)))
                for d in datasets
            }
        error = {
            "error": f"environment '{env}' is not built ({envs.env_dir(env)}); "
            f"{envs.how_to_build(env)}"
        }
        return {d: error for d in datasets}
    argv: list[str] = [str(python)]
    # The builder runs in a scratch folder, never the checkout: Tarantella's
    # launcher writes its rank script into its working folder, and leaves it
    # there when it is killed. The harness reaches the builder by PYTHONPATH.
    launch_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if builder == "tarantella":  # one rank, started by Tarantella's launcher
        argv = [
            "flock",
            str(GPI2_LOCK),
            str(python.parent / "tarantella"),
            "-n",
            "1",
            "--no-gpu",
            "--",
        ]
        launch_env["PATH"] = f"{LOCAL_SSH}:{python.parent}:{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="ddlc-gate-") as scratch:
        argv += ["-m", "frameworks.model_gate", "rows", builder, model, *datasets]
        done = run_builder(argv, Path(scratch), launch_env, BUILDER_TIMEOUT_S)
    if done is None:
        error = {
            "error": f"the {builder} builder gave no answer in {BUILDER_TIMEOUT_S} s; "
            "it was stopped with every process it started"
        }
        return {d: error for d in datasets}
    if done.returncode != 0:
        error = {"error": f"the {builder} builder failed: {done.stderr.strip()[-500:]}"}
        return {d: error for d in datasets}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_builder(
    argv: list[str], cwd: Path, env: dict, timeout_s: float
) -> subprocess.CompletedProcess | None:
    """The builder's outcome, or None when it ran past ``timeout_s``: then it
    is stopped with every process it started. It runs in a session of its
    own, as its direct child is flock and Tarantella's launcher starts the
    ranks under it (gaspi_run, in the background): stopping flock alone
    would leave them running."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stopping.kill_tree(proc)
            stopping.stop_session(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)  # one that left the session may hold the pipes
            return None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def gate_all(
    names: tuple[str, ...] = tuple(models.MODELS),
    datasets: tuple[str, ...] = tuple(data.DATASETS),
    cache: bool = True,
) -> dict:
    """The gate of every model: each model's ``gate`` result under
    ``models``; ``status`` is the worst of theirs (fail, incomplete, pass)."""
    results = {name: gate(name, datasets, cache) for name in names}
    statuses = {r["status"] for r in results.values()}
    status = next(s for s in ("fail", "incomplete", "pass") if s in statuses)
    return {"status": status, "compared": list(COMPARED), "models": results}


def gate(
    model: str = "cnn", datasets: tuple[str, ...] = tuple(data.DATASETS), cache: bool = True
) -> dict:
    """The gate's result for one model: per data set, per builder, what was
    checked and what differs; ``status`` is 'pass' only when every builder
    was checked and none differs."""
    datasets_found: dict[str, dict] = {}
    result = {"model": model, "compared": list(COMPARED), "datasets": datasets_found}
    status = "pass"
    answers = {builder: ask(builder, model, datasets, cache) for builder in BUILDERS}
    for dataset in datasets:
        reference = reference_rows(model, dataset)
        entry = {
            "total_params": sum(r["params"] for r in reference),
            "total_running_stats": sum(r["running_stats"] for r in reference),
            "builders": {},
        }
        for builder in BUILDERS:
            answer = answers[builder][dataset]
            if "error" in answer:
                entry["builders"][builder] = {"status": "not checked", "reason": answer["error"]}
                status = "fail" if status == "fail" else "incomplete"
                continue
            problems = compare(reference, answer["rows"])
            entry["builders"][builder] = {
                "status": "fail" if problems else "pass",
                "problems": problems,
                "total_params": sum(int(r["params"]) for r in answer["rows"]),
                "total_running_stats": sum(int(r.get("running_stats", 0)) for r in answer["rows"]),
                "checked_on": answer["checked_on"],
                "frameworks": frameworks_of(builder),
            }
            if problems:
                status = "fail"
        datasets_found[dataset] = entry
    result["status"] = status
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write the gate's JSON here too")
    args = parser.parse_args(argv)
    result = gate_all()
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.out, text + "\n")
    print(text)
    sys.exit(0 if result["status"] != "fail" else 1)


if __name__ == "__main__":
    main()
