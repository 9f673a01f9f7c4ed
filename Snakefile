# ddl-compare: design.yaml -> one job per run -> results tables -> HTML report.
#   snakemake --profile profiles/local            (this machine)
#   snakemake --profile profiles/local -n         (the plan: which runs are left)
#   snakemake ... --config design=other.yaml results=elsewhere
import sys

from snakemake.utils import min_version

from front import workflow_support as ws

# The version envs/torch.txt pins, the one the workflow is tested with.
min_version("9.27.1")

DESIGN_FILE, RESULTS = ws.workflow_paths(config)
DESIGN, RUNS, REQUEUED = ws.prepare(
    DESIGN_FILE,
    RESULTS,
    main=workflow.is_main_process,
    dryrun=ws.is_dry_run(workflow),
    options=config,
)
# Every run the plan may hold (replications: auto adds some as it goes).
RUN_BY_PATH = {r.path: r for r in DESIGN.runs(most=True)}
TABLES = RESULTS / DESIGN.root / "tables"
REPORT = RESULTS / DESIGN.root / "report.html"
PYTHON = sys.executable
# Traces from elsewhere to convert and show in the report (a list, or a
# comma-separated string): --config import_traces=path/a,path/b
IMPORTED = ws.imported_traces(config)
# Every job holds the machine shared while it runs, measurements hold it
# alone (ddlcompare/run/machine_lock.py); each job's held interval goes to
# JOBS_JOURNAL.
JOBS_JOURNAL = TABLES / "logs" / "jobs.log"
shell.prefix(ws.job_prefix(JOBS_JOURNAL))


rule all:
    default_target: True
    input:
        REPORT,
        # In a dry run, the runs it leaves to queue again (workflows/runs.smk).
        [RESULTS / path / "attempts" / "queued-again" for path in REQUEUED],


include: "workflows/runs.smk"
include: "workflows/traces.smk"
include: "workflows/replication.smk"
include: "workflows/analysis.smk"


ws.check_rules(workflow.rules, RESULTS, written=[JOBS_JOURNAL])


onstart:
    ws.relay_stop_requests(TABLES)
    ws.warn_of_shared_cores(DESIGN_FILE, DESIGN, workflow)


onsuccess:
    ws.forget_stop_request()
    print(f"report: {REPORT.resolve()}")
    ws.finish(RUNS, RESULTS, TABLES, REPORT, config, workflow_ok=True)


onerror:
    ws.forget_stop_request()
    ws.finish(RUNS, RESULTS, TABLES, REPORT, config, workflow_ok=False)
