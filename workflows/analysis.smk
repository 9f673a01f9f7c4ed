# Collect every run into tables once; every figure and the report read only
# those tables.


# Cheap: on a cluster they run where snakemake runs, not as jobs.
localrules:
    collect,
    figures,
    report,


rule collect:
    input:
        [RESULTS / r.path / "done.json" for r in RUNS],
    output:
        runs=TABLES / "runs.parquet",
        runs_csv=TABLES / "runs.csv",
        epochs=TABLES / "epochs.parquet",
        steps=TABLES / "step_stats.parquet",
    log:
        TABLES / "logs" / "collect.log",
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        results=RESULTS,
        tables=TABLES,
    conda:
        "../envs/torch.yaml"
    shell:
        "{params.python:q} -m ddlcompare.cli collect --design {params.design:q}"
        " --results {params.results:q} --out {params.tables:q} > {log:q} 2>&1"


rule figures:
    input:
        runs=rules.collect.output.runs,
        epochs=rules.collect.output.epochs,
    output:
        throughput=report(TABLES / "figures" / "throughput.png", category="Throughput"),
        accuracy=report(TABLES / "figures" / "accuracy.png", category="Accuracy"),
    log:
        TABLES / "logs" / "figures.log",
    params:
        python=PYTHON,
        tables=TABLES,
    conda:
        "../envs/torch.yaml"
    shell:
        "{params.python:q} -m analysis.figures {params.tables:q} > {log:q} 2>&1"


rule report:
    input:
        rules.collect.output,
        rules.figures.output,
    output:
        REPORT,
    log:
        TABLES / "logs" / "report.log",
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        tables=TABLES,
    conda:
        "../envs/torch.yaml"
    shell:
        "{params.python:q} -m ddlcompare.cli report --design {params.design:q}"
        " --tables {params.tables:q} --out {output:q} > {log:q} 2>&1"
