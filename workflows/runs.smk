# One job per run of the design. The runner always leaves a done marker with
# the run's status (ok or failed) unless it was interrupted, so one failed run
# never stops the others, and the report shows it.


wildcard_constraints:
    path=ws.PATH_PATTERN,


rule run:
    output:
        RESULTS / "{path}" / "done.json",
    log:
        RESULTS / "{path}" / "runner.log",
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        results=RESULTS,
    resources:
        # Runs take the machine one at a time locally, so that no two
        # measurements share its cores; cluster profiles ignore this.
        benchmark_slot=1,
        nodes=lambda wc: RUN_BY_PATH[wc.path].config["nodes"],
        tasks_per_node=lambda wc: RUN_BY_PATH[wc.path].config["procs_per_node"],
        runtime=lambda wc: ws.runtime_minutes(RUN_BY_PATH[wc.path]),
    conda:
        "../envs/torch.yaml"
    shell:
        "{params.python:q} -m ddlcompare.cli run-one --design {params.design:q}"
        " --results {params.results:q} --path {wildcards.path:q} > {log:q} 2>&1"
