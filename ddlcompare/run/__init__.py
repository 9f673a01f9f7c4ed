"""How a run is executed: the runner and what it leans on (launch with its
launchers, the schedulers with their job side: *_as_ssh shims and OAR's job
end; spawn, tracers, provenance, netem, machine_lock, machine_load), the
checks of this machine before runs start (plan_checks, preflight,
diskspace), the same-model gate and the network probe (model_gate, probe),
finished runs found again when a design's layout changes (refile), and the
cluster on this machine (cluster). It builds on ddlcompare.plan, never the
other way round (tests/test_layers.py)."""
