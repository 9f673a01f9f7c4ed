"""Which rank a process is, as its launcher tells it through the
environment, before any framework is imported (the framework's own answer
comes later, and not at all from a process that dies first)."""

from __future__ import annotations

import os
from collections.abc import Mapping

# torchrun, mpirun (Open MPI), horovodrun, PMI (MPICH, srun --mpi=pmi2),
# srun, gaspi_run (Tarantella): the first one set wins.
RANK_VARIABLES = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "HOROVOD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
    "GASPI_RANK",
)


def launcher_rank(environ: Mapping[str, str] = os.environ) -> str:
    """The rank the launcher gave this process, or "?"."""
    for name in RANK_VARIABLES:
        if environ.get(name, "").isdigit():
            return environ[name]
    return "?"
