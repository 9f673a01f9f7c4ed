"""How a run is executed: the runner and what it leans on (launch and its
launchers, the schedulers, the emulated network, the machine's lock and load,
tracers, environments, provenance), the checks made before runs start
(plan_checks, preflight, model_gate, probe) and after (validate, refile), and
the cluster helpers (cluster, oar, spawn, the *_as_ssh shims). It builds on
ddlcompare.plan, never the other way round (tests/test_layers.py)."""
