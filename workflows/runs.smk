# One job per run of the design. The runner always leaves a done marker with
# the run's status (ok or failed) unless it was interrupted, so one failed run
# never stops the others, and the report shows it.


USERS_SLURM_EXTRA = ws.users_slurm_extra(workflow.resource_settings.default_resources)


wildcard_constraints:
    path=ws.PATH_PATTERN,


# A dry run (-n) moves nothing, so a run that the real invocation queues
# again (ws.prepare: failed, or damaged with rerun_damaged=1) still has its
# done marker there. In the plan its job waits on that move (its attempt
# to attempts/), so that Snakemake's job stats count it with the rest.
if REQUEUED:

    rule requeue:
        output:
            RESULTS / "{path}" / "attempts" / "queued-again",
        shell:
            "true"


rule run:
    input:
        lambda wc: (
            [RESULTS / wc.path / "attempts" / "queued-again"]
            if wc.path in REQUEUED
            else []
        ),
    output:
        RESULTS / "{path}" / "done.json",
    log:
        RESULTS / "{path}" / "runner.log",
    # The design's (randomized) order, not the workflow's: of the runs ready,
    # the one earliest in the design starts first, so that drifting load
    # falls on the levels alike (docs/design.md, "Order").
    priority: lambda wc: len(RUN_BY_PATH) - RUN_BY_PATH[wc.path].order
    conda:
        "../envs/torch.yaml"
    resources:
        # One measurement at a time per invocation (the host-wide lock,
        # ddlcompare/run/machine_lock.py, does it across invocations);
        # cluster profiles ignore this.
        benchmark_slot=1,
        # What each run's job asks a cluster for (ws.job_resources explains);
        # partition, account and the like come from the cluster's profile.
        nodes=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["nodes"],
        tasks_per_node=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])[
            "tasks_per_node"
        ],
        tasks=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["tasks"],
        mpi=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["mpi"],
        cpus_per_task=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["cpus_per_task"],
        mem_mb=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["mem_mb"],
        runtime=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["runtime"],
        gpus_per_node=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["gpus_per_node"],
        gres=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["gres"],
        tasks_per_gpu=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["tasks_per_gpu"],
        # The run's own sbatch options beside the user's --default-resources ones.
        slurm_extra=lambda wc: ws.slurm_extra(RUN_BY_PATH[wc.path], USERS_SLURM_EXTRA),
        oar_resources=lambda wc: ws.job_resources(RUN_BY_PATH[wc.path])["oar_resources"],
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        results=RESULTS,
    # fd 3: the console, for the run's start line (ddlcompare/run/progress.py)
    shell:
        "{params.python:q} -m front.cli run-one --design {params.design:q}"
        " --results {params.results:q} --path {wildcards.path:q} 3>&2 > {log:q} 2>&1"
