# Each run's traces (our OTF2 archive, Score-P's, Horovod's Timeline, PyTorch
# profiler traces) -> one phase table per run, once the run is done. A run
# without a trace gives an empty table; an unreadable trace gives an error
# line in the log and in the table's metadata, and the workflow goes on.


# Converting a run's traces is light and reads files the run left on the
# shared file system: where snakemake runs, not as a cluster job.
localrules:
    phases,


rule phases:
    input:
        RESULTS / "{path}" / "done.json",
    output:
        RESULTS / "{path}" / "phases.parquet",
    log:
        RESULTS / "{path}" / "phases.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        run_dir=lambda wc: RESULTS / wc.path,
    shell:
        "{params.python:q} -m traces {params.run_dir:q} -o {output:q} --keep-going"
        " > {log:q} 2>&1"
