"""What a design is and how it is planned: the settings (params), the design
file read safely (yaml_safe) and checked against its schema, the runs it
expands to (design, fractional, sampling), and what the design alone says
about them (devices, traceable). Nothing here starts, runs or reads a run:
that is ddlcompare.run, the layer above (tests/test_layers.py)."""
