"""What a design is and how it is planned, from the design file alone: the
settings (params), the file read safely (yaml_safe), its JSON Schema and
settings page (schema), the runs it expands to (design, with fractional and
sampling), what the design alone says about them (devices, traceable;
devices also counts this machine's GPUs, for preflight), which environment
runs each framework and how it is built (envs), and what a finished run of
the design must have left (design.check_run, reading through
runfiles.records). Nothing here starts a run: that is ddlcompare.run, the
layer above (tests/test_layers.py)."""
