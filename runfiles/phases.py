"""The phase vocabulary: the names every adapter times, every trace and
table carries (the ``phase`` column) and every plot labels."""

PHASES = (
    "init",
    "data_load",
    "h2d",
    "forward",
    "backward",
    "grad_comm",
    "other_comm",
    "optimizer",
    "eval",
    "other",
)
STEP_PHASES = ("data_load", "h2d", "forward", "backward", "grad_comm", "other_comm", "optimizer")
# Communication that is not the exchange of gradients: a collective outside
# the backward pass and the optimizer (DLRM's forward all-to-alls, a serving
# engine's tensor-parallel all-reduces, an evaluation's all-reduce); see
# docs/tracing.md. Younger than some runs' own tables (steps.tsv): a table
# without its column took none of it.
LATER_PHASES = ("other_comm",)
# The region that encloses one training step's phases in traces and in the
# phase table (phase column "step"); it is not a phase of its own.
STEP = "step"
# The region that encloses one epoch: its steps, its evaluation and its
# all-reduced epoch row (Score-P user regions and profiler annotations; the
# phase column "epoch"). Not a phase either.
EPOCH = "epoch"
MARKERS = (STEP, EPOCH)
