# replications: auto (analysis/replication.py): round 0 is every cell's
# min_replications; once a round's runs are done, its decision (a checkpoint)
# lists the next round's runs: more replications for the cells whose interval
# is still too wide, until none gets more. Decisions already taken are files
# and are not taken again; nor is any finished run redone.
import json
from pathlib import Path

from analysis import replication


# A decision is light: where snakemake runs, not as a cluster job.
localrules:
    replicate,


checkpoint replicate:
    input:
        lambda wc: [RESULTS / r.path / "done.json" for r in runs_through(int(wc.round))],
    output:
        RESULTS / DESIGN.root / replication.FOLDER / "round-{round}.json",
    log:
        RESULTS / DESIGN.root / replication.FOLDER / "round-{round}.log",
    wildcard_constraints:
        round=r"\d+",
    conda:
        "../envs/torch.yaml"
    params:
        python=PYTHON,
        design=DESIGN_FILE,
        results=RESULTS,
        # a change of target or caps decides again (the runs done are kept)
        rule=replication.rule_of(DESIGN) if DESIGN.adaptive else {},
    shell:
        "{params.python:q} -m front.cli replicate --design {params.design:q}"
        " --results {params.results:q} --round {wildcards.round} --out {output:q} > {log:q} 2>&1"


def runs_through(k):
    """The runs planned through round k: round 0's and those the decisions
    of rounds 0..k-1 added (each decision waited for)."""
    for j in range(k):
        checkpoints.replicate.get(round=j)
    return replication.planned(DESIGN, RESULTS, upto=k)


def planned_runs(wildcards=None):
    """Every run the design plans: a fixed design's, or under replications:
    auto those of every round, the rounds decided one after the other."""
    if not DESIGN.adaptive:
        return RUNS
    k = 0
    while json.loads(Path(checkpoints.replicate.get(round=k).output[0]).read_text())[
        "add"
    ]:
        k += 1
    return replication.planned(DESIGN, RESULTS)
