"""One launcher per file (see ddlcompare/run/launch.py): torchrun, horovodrun,
tf-workers, tarantella, one-process, lbann-driver."""
