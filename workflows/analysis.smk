# Collect every run into tables once; every figure and the report read only
# those tables.
from ddlcompare.run import probe


# Cheap: on a cluster they run where snakemake runs, not as jobs.
localrules:
    collect,
    figures,
    model_gate,
    import_traces,
    timeline,
    report,


# The network's own limit: one MPI all-reduce probe (ddlcompare/run/probe.py) per
# scale and network of two processes or more, at the model's gradient sizes,
# in a job of the same shape as that scale's runs.
PROBES = probe.scales(RUNS)


# update(): a collect that fails leaves the previous tables in place.
rule collect:
    input:
        lambda wc: [RESULTS / r.path / "done.json" for r in planned_runs()],
        lambda wc: [RESULTS / r.path / "phases.parquet" for r in planned_runs()],
        # run files changed since the tables were built (ws.note_changed_results)
        [p for p in [TABLES / ws.CHANGED] if p.exists()],
    output:
        runs=update(TABLES / "runs.parquet"),
        runs_csv=update(TABLES / "runs.csv"),
        epochs=update(TABLES / "epochs.parquet"),
        steps=update(TABLES / "step_stats.parquet"),
        step_phases=update(TABLES / "step_phases.parquet"),
        phases=update(TABLES / "phases.parquet"),
    log:
        TABLES / "logs" / "collect.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        results=RESULTS,
        tables=TABLES,
    shell:
        "{params.python:q} -m front.cli collect --design {params.design:q}"
        " --results {params.results:q} --out {params.tables:q} > {log:q} 2>&1"


rule figures:
    input:
        runs=rules.collect.output.runs,
        epochs=rules.collect.output.epochs,
        step_phases=rules.collect.output.step_phases,
    output:
        throughput=report(TABLES / "figures" / "throughput.png", category="Throughput"),
        scaling=report(TABLES / "figures" / "scaling.png", category="Scaling"),
        phases=report(TABLES / "figures" / "phases.png", category="Phases"),
        timeline=report(TABLES / "figures" / "timeline.png", category="Phases"),
        waterfall=report(TABLES / "figures" / "waterfall.png", category="Scaling"),
        accuracy=report(TABLES / "figures" / "accuracy.png", category="Accuracy"),
        time_to_accuracy=report(
            TABLES / "figures" / "time_to_accuracy.png", category="Accuracy"
        ),
        energy=report(TABLES / "figures" / "energy.png", category="Energy"),
        step_times=report(TABLES / "figures" / "step_times.png", category="Spread"),
    log:
        TABLES / "logs" / "figures.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        tables=TABLES,
    shell:
        "{params.python:q} -m analysis.figures {params.tables:q} > {log:q} 2>&1"


rule model_gate:
    output:
        TABLES / "model_gate.json",
    log:
        TABLES / "logs" / "model_gate.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
    shell:
        "{params.python:q} -m ddlcompare.run.model_gate --out {output:q} > {log:q} 2>&1"


rule import_traces:
    input:
        IMPORTED,
    output:
        TABLES / "imported.parquet",
    log:
        TABLES / "logs" / "import_traces.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
    shell:
        "{params.python:q} -m traces {input:q} -o {output:q} --keep-going > {log:q} 2>&1"


rule probe:
    output:
        TABLES / "probe" / "{name}.json",
    log:
        TABLES / "logs" / "{name}.log",
    wildcard_constraints:
        name=r"probe-[^/]+",
    conda:
        "../envs/torch.yaml"
    resources:
        benchmark_slot=1,  # not while a run measures
        nodes=lambda wc: ws.job_resources(PROBES[wc.name])["nodes"],
        tasks_per_node=lambda wc: ws.job_resources(PROBES[wc.name])["tasks_per_node"],
        tasks=lambda wc: ws.job_resources(PROBES[wc.name])["tasks"],
        mpi=lambda wc: ws.job_resources(PROBES[wc.name])["mpi"],
        runtime=5,
    params:
        python=PYTHON,
        options=lambda wc: probe.arguments(PROBES[wc.name]),
    shell:
        "{params.python:q} -m ddlcompare.run.probe {params.options} --out {output:q}"
        " > {log:q} 2>&1"


# One merged Chrome/Perfetto trace of each framework's largest run (first
# replication), its critical path marked (analysis/timeline.py).
LARGEST = {}
for _r in sorted(RUNS, key=lambda r: (-r.world_size, r.rep)):
    LARGEST.setdefault(_r.config["framework"], _r)


rule timeline:
    input:
        [RESULTS / r.path / "phases.parquet" for r in LARGEST.values()],
    output:
        TABLES / "timeline.json",
    log:
        TABLES / "logs" / "timeline.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        runs=[RESULTS / r.path for r in LARGEST.values()],
    shell:
        "{params.python:q} -m front.cli timeline {params.runs:q} -o {output:q} --keep-going"
        " > {log:q} 2>&1"


rule report:
    input:
        rules.collect.output,
        [TABLES / "probe" / f"{name}.json" for name in PROBES],
        rules.timeline.output,
        rules.figures.output,
        rules.model_gate.output,
        [rules.import_traces.output] if IMPORTED else [],
    output:
        REPORT,
    log:
        TABLES / "logs" / "report.log",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        tables=TABLES,
    shell:
        "{params.python:q} -m front.cli report --design {params.design:q}"
        " --tables {params.tables:q} --out {output:q} > {log:q} 2>&1"
