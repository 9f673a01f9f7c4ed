"""The framework adapters, one module each (frameworks/registry.py scans
this folder): the design's framework level, what its family's loop needs
of it, and the few calls that differ between frameworks."""
