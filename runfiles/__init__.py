"""The bottom layer: what a run leaves and how it is written.

The names of the files a run folder holds (names.py), atomic writes
(atomic.py), the ownership of a run folder by one live attempt
(ownership.py), the energy meters and their records (energy.py), the phase
vocabulary every table and trace carries (phases.py), a process's rank as
its launcher tells it (ranks.py), every ``DDLC_*`` variable, declared once
(variables.py), and the one registry of backends of every kind
(backends.py); and the readers of what a run leaves, checked: its JSON
records (records.py) and its tables (tables.py), the columns of each in
names.py; a run's configuration as a type (run_config.py, generated
from the design's settings). The training side, the harness and the analysis all build on
these; nothing here imports them.
"""
