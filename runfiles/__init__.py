"""The bottom layer: what a run leaves and how it is written.

Atomic writes (atomic.py), the ownership of a run folder by one live
attempt (ownership.py), the energy meters and their records (energy.py),
and the names of the files a run folder holds (names.py). The training side,
the harness and the analysis all build on these; nothing here imports them.
"""
