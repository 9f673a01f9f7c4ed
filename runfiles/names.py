"""The files of a run folder, named once.

Every layer that writes or reads a run's files uses these names: the
training side (frameworks/), the runner, the validation of what was read
back, the analysis.
"""

CONFIG = "config.json"  # the resolved configuration of the run
RUN_RECORD = "run.json"  # provenance, hosts, command, status and reason
DONE = "done.json"  # the done marker, written whether the run succeeded or failed
OWNER = "owner.json"  # the live attempt that owns the folder
METRICS = "metrics.json"  # the run's figures
EPOCHS = "epochs.tsv"  # one row per epoch
ENERGY = "energy.json"  # the run's energy, or why it was not measured
NETWORK = "network.json"  # the emulated network's rate and byte counters
BALANCE = "balance.json"  # calibrated shares, speeds and idle times
PHASE_TABLE = "phases.parquet"  # the run's converted traces
TRAIN_LOG = "train.log"  # the processes' output
RUNNER_LOG = "runner.log"  # the runner's own output


def steps(rank: int) -> str:
    """Every step's phase times on one rank."""
    return f"steps.rank{rank}.tsv"


def intervals(rank: int) -> str:
    """Phases outside steps (init, eval) on one rank."""
    return f"intervals.rank{rank}.tsv"
