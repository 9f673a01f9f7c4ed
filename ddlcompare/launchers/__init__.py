"""One launcher per file (see ddlcompare/launch.py): torchrun, horovodrun,
tf-workers, tarantella, one-process, lbann-driver."""
