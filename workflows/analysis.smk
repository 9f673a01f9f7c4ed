# Collect every run into tables once; every figure and the report read only
# those tables.


rule collect:
    input:
        [RESULTS / r.path / "done.json" for r in RUNS],
    output:
        runs=TABLES / "runs.parquet",
        runs_csv=TABLES / "runs.csv",
        epochs=TABLES / "epochs.parquet",
        steps=TABLES / "step_stats.parquet",
    params:
        design=DESIGN_FILE,
        results=RESULTS,
    shell:
        "{PYTHON:q} -m ddlcompare.cli collect --design {params.design:q}"
        " --results {params.results:q} --out {TABLES:q}"


rule figures:
    input:
        runs=rules.collect.output.runs,
        epochs=rules.collect.output.epochs,
    output:
        throughput=report(TABLES / "figures" / "throughput.png", category="Throughput"),
        accuracy=report(TABLES / "figures" / "accuracy.png", category="Accuracy"),
    params:
        tables=TABLES,
    shell:
        "{PYTHON:q} -m analysis.figures {params.tables:q}"


rule report:
    input:
        rules.collect.output,
        rules.figures.output,
    output:
        REPORT,
    params:
        design=DESIGN_FILE,
    shell:
        "{PYTHON:q} -m ddlcompare.cli report --design {params.design:q}"
        " --tables {TABLES:q} --out {output:q}"
