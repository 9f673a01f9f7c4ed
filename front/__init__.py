"""The front, on top of every layer: the command line (``python -m front.cli``,
``./ddlc``) and the helpers the Snakemake workflow calls (``workflow_support``)."""
