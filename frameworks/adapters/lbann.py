"""LBANN: its own training loop (frameworks/lbann_family.py) drives LBANN's
launcher, which starts the ranks; the harness starts one driver process."""

from __future__ import annotations

from frameworks.registry import AdapterInfo, register

ADAPTER = register(
    AdapterInfo(
        name="lbann",
        family="lbann",
        launcher="lbann-driver",
        notes="LBANN runs its own training loop. Its timeline callback times every "
        "layer's forward and backward pass and every weight update on every rank: "
        "data_load is the input layers' forward pass. The gradient all-reduces have no "
        "phase of their own: LBANN keeps one in flight, so most of their time is in "
        "backward and the last one's wait in optimizer. Its timer's epoch run times and mini-batch statistics fill "
        "epochs.tsv and lbann_batch_times.tsv; LBANN keeps its weights to itself.",
        knobs=("lbann_io_threads",),
        rank_steps=False,
    )
)


class Adapter:
    """LBANN needs no per-rank hooks: its family's driver does everything."""
