"""ddlc: the harness's command line (the workflow calls the same commands).

    ddlc plan [--design design.yaml]     the run table and its size
    ddlc run-one --path P                one run (what each workflow job does)
    ddlc collect / ddlc report           results tables; the HTML report
    ddlc check [--rerun]                 damaged run files, listed (and queued again)
    ddlc fetch-data cifar10              download CIFAR-10 (needs internet)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ddlcompare import design as design_mod
from ddlcompare import plan_checks, preflight, yaml_safe


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""


def load_design(path: str, check_ready: bool = True) -> design_mod.Design:
    try:
        design = design_mod.load(path)
    except design_mod.DesignError as exc:
        raise UserError(str(exc)) from None
    if check_ready and (found := preflight.problems(design)):
        raise UserError("\n".join(f"{path}: {p}" for p in found))
    if check_ready:
        for text in plan_checks.warnings(design):
            print(f"warning: {path}: {text}", file=sys.stderr)
    return design


def cmd_plan(args) -> int:
    design = load_design(args.design, check_ready=not args.no_check)
    runs = design.runs()
    factors = design.path_factors()
    widths = {f: max(len(f), *(len(str(r.factors[f])) for r in runs)) for f in factors}
    header = ["order"] + [f.ljust(widths[f]) for f in factors] + ["rep", "run_id"]
    print("  ".join(header))
    for r in runs:
        print("  ".join([str(r.order).rjust(5)] + [str(r.factors[f]).ljust(widths[f])
                        for f in factors] + [str(r.rep).rjust(3), r.run_id]))
    cells = len({tuple(r.factors.values()) for r in runs})
    print(f"{len(runs)} runs ({cells} cells x {design.replications} replications) "
          f"in results/{design.root}/")
    return 0


def cmd_run_one(args) -> int:
    from ddlcompare import ownership, runner
    try:
        design = load_design(args.design, check_ready=False)
    except UserError as exc:
        raise UserError(design_changed(args.design) or str(exc)) from None
    by_path = {r.path: r for r in design.runs()}
    if args.path not in by_path:
        raise UserError(design_changed(args.design) or f"{args.path}: not a run of {args.design}")
    try:
        return runner.execute(by_path[args.path], Path(args.results),
                              kill_orphans=args.kill_orphans)
    except ownership.Busy as exc:
        raise UserError(str(exc)) from None


def design_changed(path: str) -> str | None:
    """The message for a job whose design file was edited after its workflow
    planned the campaign (the workflow records the file's digest)."""
    planned = os.environ.get(yaml_safe.DIGEST_ENV)
    if not planned or yaml_safe.file_digest(path) == planned:
        return None
    return (f"{path}: the design changed since this campaign started (it was edited while "
            "the workflow ran); this run is no longer in it. Let the workflow end, then "
            "start it again to plan the new design")


def cmd_collect(args) -> int:
    from analysis import collect
    design = load_design(args.design, check_ready=False)
    collect.write_tables(design, Path(args.results), Path(args.out))
    return 0


def cmd_report(args) -> int:
    from analysis import report
    design = load_design(args.design, check_ready=False)
    out = report.build(design, Path(args.tables), Path(args.out))
    print(f"report: {out.resolve()}")
    return 0


def cmd_check(args) -> int:
    """Every finished run's files checked; --rerun moves the damaged ones'
    files to attempts/ so that the next workflow run does them again."""
    from ddlcompare import runner
    design = load_design(args.design, check_ready=False)
    results = Path(args.results)
    damaged = runner.damaged_runs(design.runs(), results)
    for row, problem in damaged:
        print(f"damaged: {row.path}: {problem}")
        if args.rerun:
            runner.archive_attempt(results / row.path)
    done = sum((results / r.path / runner.DONE).exists() for r in design.runs())
    print(f"{done} finished run(s) checked, {len(damaged)} damaged"
          + ("; moved to attempts/, the next workflow run does them again" if args.rerun and
             damaged else "; ddlc check --rerun queues them again" if damaged else ""))
    return 1 if damaged and not args.rerun else 0


def cmd_fetch_data(args) -> int:
    from frameworks import data
    folder = data.fetch_cifar10(args.data_dir)
    print(f"cifar10: verified and unpacked in {folder}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddlc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, fn, help_text):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--design", default="design.yaml", help="design file (design.yaml)")
        s.set_defaults(fn=fn)
        return s

    plan = command("plan", cmd_plan, "print the run table and its size")
    plan.add_argument("--no-check", action="store_true", help="skip data/environment checks")
    one = command("run-one", cmd_run_one, "execute one run of the design")
    one.add_argument("--path", required=True, help="the run's path under the results folder")
    one.add_argument("--results", default="results")
    one.add_argument("--kill-orphans", action="store_true",
                     help="stop an earlier attempt still training in the run folder")
    col = command("collect", cmd_collect, "gather every run into the results tables")
    col.add_argument("--results", default="results")
    col.add_argument("--out", required=True, help="folder for the tables")
    rep = command("report", cmd_report, "build the HTML report from the tables")
    rep.add_argument("--tables", required=True)
    rep.add_argument("--out", required=True)
    chk = command("check", cmd_check, "check every finished run's files; list the damaged")
    chk.add_argument("--results", default="results")
    chk.add_argument("--rerun", action="store_true", help="queue the damaged runs again")
    fetch = sub.add_parser("fetch-data", help="download and verify CIFAR-10")
    fetch.add_argument("dataset", choices=["cifar10"])
    fetch.add_argument("--data-dir", default=None)
    fetch.set_defaults(fn=cmd_fetch_data)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
