"""Checks that cost nothing and save a campaign: are the data sets there,
are the frameworks' environments built? One message per problem."""

from __future__ import annotations

from ddlcompare.plan import devices
from ddlcompare.plan import envs
from ddlcompare.run import netem, plan_checks, schedulers, tracers
from ddlcompare.plan.design import Design
from frameworks import data, registry


def levels(design: Design, name: str) -> list:
    return design.factors.get(name, [design.fixed.get(name)])


def problems(design: Design) -> list[str]:
    found = []
    data_dir = design.fixed.get("data_dir")
    for name in levels(design, "dataset"):
        missing = data.missing_files(name, data_dir)
        if missing:
            found.append(
                f"dataset {name}: {missing[0]} not found"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
                f"{data.DATASETS[name].how_to_get}"
            )
    for name in levels(design, "framework"):
        info = registry.FRAMEWORKS[name]
        if not envs.has_module(info.env, info.probe):
            found.append(
                f"framework {name}: its environment '{info.env}' is not built here "
                f"({info.probe} not found in {envs.env_dir(info.env)}); "
                f"{envs.how_to_build(info.env)}"
            )
    configs = [{**design.fixed, **cell} for cell in design._cells()]
    return (
        found
        + devices.machine_problems(configs)
        + network_problems(design)
        + plan_checks.problems(design)
        + tracers.problems(envs.python_for, configs)
    )


def network_problems(design: Design) -> list[str]:
    """An emulated network is asked for: can this machine make it?"""
    rates = [r for r in levels(design, "net_rate_mbit") if r is not None]
    if not rates:
        if any(levels(design, "net_delay_ms")):
            return [
                "net_delay_ms: delays the emulated network, which only net_rate_mbit "
                "sets up; set net_rate_mbit (e.g. 1000) or net_delay_ms: 0"
            ]
        return []
    return netem.problems(schedulers.detect(1, 1)[0])
