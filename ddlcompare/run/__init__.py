"""How a run is executed: the runner and what it leans on (launch with its
launchers, the schedulers with their *_as_ssh shims, spawn, tracers,
provenance, netem, machine_lock, machine_load), the checks of this machine
before runs start (plan_checks, preflight, diskspace), the same-model gate
and the network probe (model_gate, probe), finished runs found again when a
design's layout changes (refile), and the clusters (cluster on this machine, oar's
commands). It builds on ddlcompare.plan, never the other way round
(tests/test_layers.py)."""
