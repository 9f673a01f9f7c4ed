"""The one vocabulary of run parameters.

Every key a design may set, as a fixed setting or as a factor, is declared
here once, with its type, default and allowed values. The same names are the
keys of ``config.json``, the columns of the results table and the labels of
the report's plots.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from runfiles.run_config import RunConfig
from runfiles.strict_json import LIMIT, strict_validator

JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


# Values end up in directory names and process arguments: keep them to a
# character set that needs no quoting anywhere. Match it with fullmatch (or
# is_safe_text): "$" alone lets a trailing newline through.
SAFE_TEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def is_safe_text(value: str) -> bool:
    return SAFE_TEXT.fullmatch(value) is not None


def text_problem(value: str) -> str | None:
    """What breaks the name rule (SAFE_TEXT) in ``value``, said of the part
    at fault: its length, its first character, or the first character not
    allowed; None when it holds."""
    if is_safe_text(value):
        return None
    if not value:
        return "is empty; give a name of letters, digits, '.', '_', '+', '-'"
    if len(value) > 64:
        return f"is {len(value)} characters long; at most 64"
    if not re.fullmatch(r"[A-Za-z0-9]", value[0]):
        return f"begins with {_char(value[0])}; begin it with a letter or a digit"
    bad = next(c for c in value[1:] if not re.fullmatch(r"[A-Za-z0-9._+-]", c))
    return f"has the character {_char(bad)}; use letters, digits, '.', '_', '+', '-'"


def _char(c: str) -> str:
    # a character beside its value, which shown() prints with the names of odd ones
    return repr(c) if c.isascii() else f"U+{ord(c):04X}"


def shown(value: Any) -> str:
    """A value echoed in a message: quoted and escaped, and each character
    that looks like another or like nothing named (a trailing space, a
    Cyrillic letter, a zero-width space, a non-ASCII hyphen), so that the
    message never names what looks like a known key. A long value is cut
    (its length said), so that one refusal stays one readable line."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= SHOWN_CHARACTERS else _cut(text[:SHOWN_CHARACTERS], text)
    text = (
        ascii(value)
        if len(value) <= SHOWN_CHARACTERS
        else _cut(ascii(value[:SHOWN_CHARACTERS]), value)
    )
    odd = [c for c in dict.fromkeys(value) if not (c.isascii() and c.isprintable())]
    notes = [f"U+{ord(c):04X} {unicodedata.name(c, 'a control character')}" for c in odd]
    if value != value.strip():
        notes.append("a space at the start or end")
    return text + (f" (odd: {', '.join(notes)})" if notes else "")


SHOWN_CHARACTERS = 60


def _cut(start: str, whole: str) -> str:
    return f"{start}... ({len(whole):,} characters)"


def shown_key(name: Any) -> str:
    """A key in a message's 'where' part: as it is when plain, else shown()."""
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        return name
    return shown(name)


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # int, float, str or bool
    default: Any
    help: str
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    minimum: float | None = None
    maximum: float | None = None  # numbers are capped at LIMIT unless set
    nullable: bool = False
    path_like: bool = False  # free text allowed (a directory), never a factor
    # Read by the analysis only: never a factor, and left out of the settings
    # hash, so that changing it re-analyses the runs instead of redoing them.
    analysis_only: bool = False

    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def value_schema(self) -> dict[str, Any]:
        """The JSON Schema of one non-null value (design.schema.json is built
        from these)."""
        schema: dict[str, Any] = {"type": JSON_TYPES[self.kind]}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.kind in (int, float):
            schema["maximum"] = self.maximum if self.maximum is not None else LIMIT
        if (allowed := self.allowed()) is not None:
            schema["enum"] = list(allowed)
        elif self.kind is str and not self.path_like:
            schema["pattern"] = SAFE_TEXT.pattern
        return schema

    def check(self, value: Any) -> str | None:
        """Return a problem description, or None when the value is valid.
        The type is checked through JSON Schema (the one design.schema.json
        states); what a schema cannot say (NaN, a path the file system would
        refuse) and the hints here, in this project's words."""
        if value is None:
            return None if self.nullable else f"must be set ({self.describe()})"
        if not strict_validator(json.dumps({"type": JSON_TYPES[self.kind]})).is_valid(value):
            return f"must be {self.describe()}, got {value!r} ({type(value).__name__})" + yaml_hint(
                value, self.kind
            )
        if self.kind in (int, float):
            return self._check_number(value) or self._check_choice(value)
        return self._check_choice(value)

    def _check_number(self, value) -> str | None:
        # NaN passes every comparison, inf every minimum: refuse both first.
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum:g}, got {value!r}"
        top = self.maximum if self.maximum is not None else LIMIT
        if value > top:
            return f"must be <= {top:g}, got {value!r}"
        return None

    def _check_choice(self, value) -> str | None:
        allowed = self.allowed()
        if allowed is not None and value not in allowed:
            return f"unknown value {shown(value)} (allowed: {', '.join(allowed)})"
        if self.path_like:
            return path_problem(value)
        if self.kind is str and (problem := text_problem(value)):
            return f"{shown(value)} {problem}"
        return None

    def normalise(self, value: Any) -> Any:
        """One spelling per value, so that 1 and 1.0 are one level and hash alike."""
        if self.kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) + 0.0  # + 0.0: -0.0 is 0.0, one level and one folder
        return value

    def describe(self) -> str:
        names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
        text = names[self.kind]
        if self.minimum is not None:
            text += f" >= {self.minimum:g}"
        allowed = self.allowed()
        if allowed is not None:
            text = "one of " + ", ".join(allowed)
        return text + (" or null" if self.nullable else "")


def path_problem(text: str) -> str | None:
    """What the file system would refuse in a path, said before any run."""
    if "\0" in text:
        return "has a NUL character; give a plain path"
    if control := next((c for c in text if not c.isprintable()), None):
        return (
            f"{shown(text)} has a control character (U+{ord(control):04X}, a line "
            "break?); give the path on one line"
        )
    try:
        path = Path(text).expanduser()
    except RuntimeError:
        return f"{text.split('/')[0]!r}: no such user here; give the full path (e.g. /home/me/data)"
    too_long = [part for part in path.parts if len(part.encode()) > 255]
    if too_long:
        return (
            f"has a folder name of {len(too_long[0].encode())} bytes (at most 255): "
            f"{too_long[0][:40]!r}...; check the path"
        )
    if len(str(path).encode()) > 4095:
        return "is longer than 4095 bytes; check the path"
    return None


def yaml_hint(value: Any, kind: type) -> str:
    """How to write what the user probably meant, when YAML read it otherwise."""
    if isinstance(value, bool) and kind is str:
        return (
            "; YAML reads yes/no/on/off/true/false as true or false: put the value in "
            "quotes, e.g. 'no'"
        )
    if isinstance(value, (int, float)) and kind is str:
        return "; YAML reads it as a number: put it in quotes, e.g. '2024'"
    if isinstance(value, str) and kind in (int, float):
        try:
            float(value)
        except ValueError:
            return ""
        import yaml

        if isinstance(yaml.safe_load(value), (int, float)):
            return (
                f"; it is in quotes, so YAML reads it as text: write {value.strip()} without quotes"
            )
        if "e" not in value.lower() or "inf" in value.lower():
            return ""
        return (
            "; YAML 1.1 reads a number like 1e-3 as text: write 1.0e-3 (a dot before the exponent)"
        )
    return ""


def _framework_names() -> tuple[str, ...]:
    from frameworks import registry

    return tuple(sorted(registry.FRAMEWORKS))


def _dataset_names() -> tuple[str, ...]:
    from frameworks import data

    return tuple(sorted(data.DATASETS))


def _compression_names() -> tuple[str, ...]:
    from frameworks import compression

    return compression.NAMES


def _model_names() -> tuple[str, ...]:
    from frameworks import models

    return tuple(sorted(models.MODELS))


PARAMS: dict[str, Param] = {
    p.name: p
    for p in [
        # The factors every design varies or fixes.
        Param("framework", str, None, "framework adapter", choices=_framework_names),
        Param("nodes", int, 1, "number of nodes", minimum=1),
        Param(
            "procs_per_node",
            int,
            1,
            "processes per node (one per GPU when device is gpu)",
            minimum=1,
        ),
        Param(
            "batch_size",
            int,
            64,
            "mini-batch size PER PROCESS; the global batch is batch_size * nodes * procs_per_node",
            minimum=1,
        ),
        Param("dataset", str, "fashion-mnist", "training data set", choices=_dataset_names),
        Param(
            "device",
            str,
            "cpu",
            "where each process computes; hybrid: hybrid_gpus processes on GPUs and the "
            "others on CPU cores, in one job (docs/devices.md)",
            choices=("cpu", "gpu", "hybrid"),
        ),
        # Fixed settings (any of them may be made a factor).
        Param("model", str, "cnn", "network architecture", choices=_model_names),
        Param("epochs", int, 2, "training epochs", minimum=1),
        Param("max_steps", int, None, "cap on optimizer steps per epoch", minimum=1, nullable=True),
        Param(
            "train_images",
            int,
            None,
            "use only the first N training images (null: all)",
            minimum=1,
            nullable=True,
        ),
        Param(
            "test_images",
            int,
            None,
            "evaluate on only the first N test images (null: all)",
            minimum=1,
            nullable=True,
        ),
        Param("warmup_steps", int, 10, "first steps of the run left out of throughput", minimum=0),
        Param(
            "learning_rate",
            float,
            0.02,
            "learning rate at the base global batch",
            minimum=0,
            maximum=100,
        ),
        Param("lr_base_batch", int, 64, "global batch that learning_rate is tuned for", minimum=1),
        Param(
            "lr_scaling",
            str,
            "linear",
            "how the learning rate follows the global batch",
            choices=("none", "linear", "sqrt"),
        ),
        Param("momentum", float, 0.9, "SGD momentum", minimum=0, maximum=1),
        Param("eval_every", int, 1, "evaluate on the test set every N epochs", minimum=1),
        Param("horovod_controller", str, "gloo", "Horovod's controller", choices=("gloo", "mpi")),
        Param(
            "compression",
            str,
            "none",
            "gradient compression on the wire (frameworks/compression.py)",
            choices=_compression_names,
        ),
        Param(
            "tracer",
            str,
            "otf2",
            "event tracer of the training phases",
            choices=("none", "otf2", "scorep"),
        ),
        Param("horovod_timeline", bool, False, "also write Horovod's own timeline (Horovod runs)"),
        Param("torch_profiler", bool, False, "also write a PyTorch profiler (Kineto) trace"),
        Param(
            "fit_step_phases",
            bool,
            False,
            "where the framework's own fit runs the step (Tarantella): read each step's "
            "phases back from timestamps taken in its graph, at a cost to the step "
            "(docs/tracing.md); false: time whole steps only, as 'other'",
        ),
        Param(
            "batch_split",
            str,
            "even",
            "how the global batch is cut between the ranks: even, or calibrated (in proportion "
            "to each rank's speed, timed at start; always so under device: hybrid)",
            choices=("even", "calibrated"),
        ),
        Param(
            "hybrid_gpus",
            int,
            1,
            "under device: hybrid, the processes per node that take a GPU each",
            minimum=1,
        ),
        Param(
            "threads",
            int,
            1,
            "compute threads per process, for every framework: PyTorch's intra-op "
            "threads, TensorFlow's intra-op pool (its inter-op pool keeps at least 2, "
            "so at 1 two kernels may run at once, unless inter_op_threads says 1), "
            "OMP_NUM_THREADS, Slurm's cpus_per_task (torchrun's own default is 1)",
            minimum=1,
        ),
        Param(
            "energy_interval_s",
            float,
            1.0,
            "seconds between two readings of each node's energy meters (RAPL, NVML)",
            minimum=0.05,
            maximum=3600,
        ),
        Param(
            "timeout_s",
            int,
            None,
            "kill a run after this many seconds (null: derived from the design)",
            minimum=1,
            nullable=True,
        ),
        Param(
            "target_accuracy",
            float,
            None,
            "test accuracy whose first reach times the run (time and energy to "
            "accuracy; null: not measured)",
            minimum=0,
            maximum=1,
            nullable=True,
            analysis_only=True,
        ),
        # Each framework's own knobs (docs/knobs.md): null is the framework's own
        # default; a knob set for a framework it does not apply to is refused at
        # plan time, and each run reads back that its knobs took effect.
        Param(
            "fusion_threshold_kib",
            int,
            None,
            "gradient fusion buffer or bucket, in KiB: Horovod's HOROVOD_FUSION_THRESHOLD "
            "(default 131072), DDP's bucket_cap_mb (25600), Tarantella's --fusion-threshold "
            "(32), MWMS's bytes_per_pack (automatic); null: the framework's default",
            minimum=0,
            maximum=4194304,
            nullable=True,
        ),
        Param(
            "horovod_cycle_time_ms",
            float,
            None,
            "Horovod's cycle time, HOROVOD_CYCLE_TIME (null: its default, 1 ms)",
            minimum=0.01,
            maximum=10000,
            nullable=True,
        ),
        Param(
            "horovod_hierarchical_allreduce",
            bool,
            False,
            "Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE (Horovod 0.28 has one for NCCL "
            "with MPI only: device gpu, horovod_controller mpi)",
        ),
        Param(
            "ddp_gradient_as_bucket_view",
            bool,
            False,
            "DDP's gradient_as_bucket_view: gradients are views into its buckets",
        ),
        Param(
            "mwms_implementation",
            str,
            None,
            "MultiWorkerMirroredStrategy's all-reduce (CommunicationOptions.implementation; "
            "null: ring on CPU, nccl on GPU)",
            choices=("auto", "ring", "nccl"),
            nullable=True,
        ),
        Param(
            "lbann_io_threads",
            int,
            None,
            "LBANN's I/O threads per process, --num_io_threads (null: its default)",
            minimum=1,
            maximum=1024,
            nullable=True,
        ),
        Param(
            "inter_op_threads",
            int,
            None,
            "the TensorFlow family's inter-op pool per process, the threads that run "
            "kernels side by side (tf.config.threading; null: max(2, threads)); 1 runs "
            "one kernel at a time, which leaves a core free beside threads: 1",
            minimum=1,
            maximum=1024,
            nullable=True,
        ),
        Param(
            "gaspi_sweep_pause_us",
            int,
            None,
            "tarantella-patched: the pause of GaspiCxx's progress thread between sweeps "
            "while a collective runs, in microseconds, DDLC_GASPI_SWEEP_PAUSE_US (0: "
            "upstream's spinning; null: the build's default, 50)",
            minimum=0,
            maximum=1000000,
            nullable=True,
        ),
        # Slow-network emulation between the nodes of one machine (ddlcompare/run/netem.py).
        Param(
            "net_rate_mbit",
            int,
            None,
            "emulate a network of this rate (Mbit/s) between the nodes, on this machine "
            "(null: the machine's own network)",
            minimum=1,
            nullable=True,
        ),
        Param(
            "net_delay_ms",
            float,
            0,
            "one-way delay each node adds to what it sends, with net_rate_mbit",
            minimum=0,
            maximum=60000,
        ),
        Param(
            "cores_per_node",
            int,
            None,
            "give each node of this machine cores of its own: node i runs on the runner's "
            "cores i*c to (i+1)*c-1, read back from every rank (nodes > 1 need "
            "net_rate_mbit; null: the nodes share every core)",
            minimum=1,
            nullable=True,
        ),
        Param(
            "data_dir",
            str,
            None,
            "directory holding the data set files (null: the default place)",
            nullable=True,
            path_like=True,
        ),
    ]
}

# Settings that were renamed: a design naming the old one is told the new.
RENAMED = {"torch_threads": "threads"}

# Factors that every run has, whether varied or fixed: they always appear in
# run paths and in the results table, in this order.
CORE_FACTORS = ("framework", "nodes", "procs_per_node", "batch_size", "dataset")


@dataclass
class RunRow:
    """One run of the expanded design."""

    run_id: str
    path: str  # relative to the results root
    factors: dict[str, Any]
    rep: int
    order: int  # position in the (possibly shuffled) execution order
    config: RunConfig

    @property
    def world_size(self) -> int:
        return self.config["nodes"] * self.config["procs_per_node"]


def cell_of(row: RunRow) -> str:
    """A cell's name: its run folder without the replication."""
    return row.path.rsplit("/rep~", 1)[0]
