"""The phase vocabulary: the names every adapter times, every trace and
table carries (the ``phase`` column) and every plot labels."""

PHASES = (
    "init",
    "data_load",
    "h2d",
    "forward",
    "backward",
    "grad_comm",
    "optimizer",
    "eval",
    "other",
)
STEP_PHASES = ("data_load", "h2d", "forward", "backward", "grad_comm", "optimizer")
# The region that encloses one training step's phases in traces and in the
# phase table (phase column "step"); it is not a phase of its own.
STEP = "step"
# The region that encloses one epoch: its steps, its evaluation and its
# all-reduced epoch row (Score-P user regions and profiler annotations; the
# phase column "epoch"). Not a phase either.
EPOCH = "epoch"
MARKERS = (STEP, EPOCH)
