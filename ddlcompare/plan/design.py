"""design.yaml: load, validate and expand into the full-factorial run table.

A design has factors (each a list of levels), fixed settings, replications,
a seed, whether to randomize the run order, ``exclude`` rules that prune
combinations and ``zip`` groups of factors whose levels vary together.
Validation collects every problem and reports each with the key it concerns;
nothing here raises anything but :class:`DesignError`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, cast

import yaml

from ddlcompare.plan import fractional, sampling, traceable, yaml_safe
from ddlcompare.plan.params import (
    CORE_FACTORS,
    PARAMS,
    RENAMED,
    RunRow,
    text_problem,
    shown,
    shown_key,
)
from frameworks import registry
from runfiles import records
from runfiles.run_config import RunConfig

# A plan larger than this is a typo more often than a campaign; a design
# that means it says so with max_runs.
MAX_RUNS = 10_000
# The most runs max_runs may allow: the plan, its checks and the workflow's
# jobs are held in memory (the plan alone takes about 1.5 kB a run).
MAX_PLANNABLE = 100_000
# One problem is one line: a value repeated by YAML aliases is cut short.
MAX_PROBLEM_CHARS = 1000
TOP_LEVEL_KEYS = {
    "name": "the design's name, used as results/<name>/",
    "factors": "a mapping of factor -> list of levels",
    "fixed": "a mapping of setting -> value",
    "replications": "runs per design cell (an integer >= 1), or auto: as many as each "
    "cell's interval needs (target_half_width, min_replications, max_replications)",
    "target_half_width": "replications auto: the relative half-width of the 95 % interval of "
    "each cell's mean throughput to reach (default 0.05)",
    "min_replications": "replications auto: runs per cell first (default 3)",
    "max_replications": "replications auto: at most this many runs per cell (default 10)",
    "seed": "seed for weights, data order and the run order (an integer)",
    "randomize": "shuffle the run order with the seed (true/false)",
    "exclude": "a list of rules {factor: level or [levels]} removing matching runs",
    "zip": "a list of factor groups whose levels vary together",
    "max_runs": f"refuse a plan of more runs than this (default {MAX_RUNS})",
    **fractional.KEYS,
    **sampling.KEYS,
    "follow_up": "the first-stage study this design follows up (written by ddlc follow-up)",
}


# Problems listed at most for one design (the rest counted).
MAX_PROBLEMS = 20


class DesignError(Exception):
    """A design that cannot run; ``problems`` holds one message per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        shown_problems = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:  # 20,000 unknown keys: not 12 MB of messages
            shown_problems.append(
                f"and {len(problems) - MAX_PROBLEMS} more problems; fix these first"
            )
        self.problems = [
            p if len(p) <= MAX_PROBLEM_CHARS else p[:MAX_PROBLEM_CHARS] + "..."
            for p in shown_problems
        ]
        problems = self.problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


@dataclass(frozen=True)
class Adaptive:
    """replications: auto. Every cell runs ``least`` times first; then cells
    whose 95 % interval of the mean throughput is wider than
    ``target_half_width`` of the mean get more, up to ``most``
    (analysis/replication.py decides)."""

    target_half_width: float = 0.05
    least: int = 3
    most: int = 10


@dataclass
class Design:
    name: str
    factors: dict[str, list[Any]]
    fixed: dict[str, Any]
    replications: int
    seed: int
    randomize: bool
    exclude: list[dict[str, list[Any]]]
    zip_groups: list[list[str]]
    source: str = "design.yaml"
    fraction: fractional.Fraction | None = None  # None: the full factorial
    sample: sampling.Sample | None = None  # a Latin hypercube's points
    follow_up: dict | None = None  # the first stage's design, tables and selection rule
    adaptive: Adaptive | None = None  # replications: auto (then replications is its least)

    @functools.cached_property
    def settings_hash(self) -> str:
        """Hash of everything held fixed: results are keyed by it, so that
        changing a setting never mixes old and new results, while adding a
        factor level reuses every run already done. Settings at their
        default are left out, so that a new setting (a harness upgrade)
        leaves the runs already done where they are. Settings that act on
        some runs only (devices.ONLY_WHERE) are filed in those runs' paths
        instead (``_row``)."""
        from ddlcompare.plan.devices import ONLY_WHERE

        run_settings = {
            k: v
            for k, v in self.fixed.items()
            if not PARAMS[k].analysis_only and v != PARAMS[k].default and k not in ONLY_WHERE
        }
        blob = json.dumps({"fixed": run_settings, "seed": self.seed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:8]

    @property
    def root(self) -> str:
        """Directory of this design's runs, relative to the results folder."""
        return f"{self.name}/cfg~{self.settings_hash}"

    def path_factors(self) -> list[str]:
        """Factors named in run paths: the core ones, then the other varied ones."""
        extra = [f for f in self.factors if f not in CORE_FACTORS]
        return list(CORE_FACTORS) + extra

    def runs(self, most: bool = False) -> list[RunRow]:
        """The plan's runs in execution order. Under replications: auto,
        the first ``least`` replications of every cell; ``most`` adds every
        replication auto may add, ordered after them and shuffled on their
        own, so that those added later run interleaved across cells."""
        cells = self._cells()
        rows = [self._row(cell, rep) for cell in cells for rep in range(1, self.replications + 1)]
        self._order(rows, self.seed, 0)
        if most and self.adaptive:
            extra = [
                self._row(cell, rep)
                for cell in cells
                for rep in range(self.replications + 1, self.adaptive.most + 1)
            ]
            self._order(extra, self.seed + 1, len(rows))
            rows += extra
        return sorted(rows, key=lambda r: r.order)

    def _order(self, rows: list[RunRow], seed: int, first: int) -> None:
        order = list(range(len(rows)))
        if self.randomize:
            random.Random(seed).shuffle(order)
        for position, index in enumerate(order):
            rows[index].order = first + position

    def _cells(self) -> list[dict[str, Any]]:
        if self.fraction:
            return self.fraction.cells(self.factors)
        if self.sample:
            return self.sample.cells(self.factors)
        zipped = {f for group in self.zip_groups for f in group}
        axes: list[list[dict[str, Any]]] = []
        for group in self.zip_groups:
            axes.append(
                [dict(zip(group, values)) for values in zip(*(self.factors[f] for f in group))]
            )
        for f, levels in self.factors.items():
            if f not in zipped:
                axes.append([{f: level} for level in levels])
        cells = []
        for combo in itertools.product(*axes):
            cell = {k: v for part in combo for k, v in part.items()}
            if not any(_matches(rule, cell) for rule in self.exclude):
                cells.append(cell)
        return cells

    def _row(self, cell: dict[str, Any], rep: int) -> RunRow:
        from ddlcompare.plan.devices import where_acting

        config = {**self.fixed, **cell, "seed": self.seed}
        factors = {f: config[f] for f in self.path_factors()}
        # A fixed setting acting on this run alone (horovod_timeline beside
        # DDP runs) is a level of its path, outside the design's hash.
        acting = where_acting(config, self.factors)
        rel = "/".join(f"{f}~{_path_value(v)}" for f, v in {**factors, **acting}.items())
        path = f"{self.root}/{rel}/rep~{rep}"
        run_id = hashlib.sha256(path.encode()).hexdigest()[:12]
        config.update(rep=rep, run_id=run_id, design=self.name, settings_hash=self.settings_hash)
        # Every setting resolved (load: defaults for those not set) and the
        # run's keys: a whole RunConfig (tests/test_schema.py).
        resolved = cast(RunConfig, config)
        return RunRow(run_id=run_id, path=path, factors=factors, rep=rep, order=0, config=resolved)


# Keys of a run's config that say where it is filed, not what it runs.
BOOKKEEPING = ("run_id", "design", "settings_hash")


def identity(config: Mapping[str, Any]) -> str:
    """What a run is: its resolved settings (those at their default left out,
    as in settings_hash, and those the analysis alone reads), its seed and
    replication. Folder names follow the design's layout, which changes when
    a fixed setting becomes a factor; this does not."""
    settings = {
        k: v
        for k, v in config.items()
        if k in PARAMS and not PARAMS[k].analysis_only and v != PARAMS[k].default
    }
    blob = {"settings": settings, "seed": config.get("seed"), "rep": config.get("rep")}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def differences(written: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """Where two configs are not the same run (``identity``'s terms): each
    setting, seed or replication that differs, as "name: written, asked"."""
    names = [k for k in PARAMS if not PARAMS[k].analysis_only]
    found = []
    for name in [*names, "seed", "rep"]:
        default = PARAMS[name].default if name in PARAMS else None
        mine, theirs = written.get(name, default), asked.get(name, default)
        if mine != theirs:
            found.append(f"{name}: {mine!r} there, {theirs!r} in the design")
    return found


def check_run(folder: Path, config: RunConfig) -> list[str]:
    """The problems of a finished run's files against what the design asked
    of it (runfiles/records.py reads them); [] when sound. Whether there is
    a steps file per rank is the adapter's to say; config.json must be this
    run's."""
    return records.check_run(
        folder,
        config,
        rank_steps=registry.FRAMEWORKS[config["framework"]].rank_steps,
        differs=differences,
    )


def _path_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _matches(rule: dict[str, list[Any]], cell: dict[str, Any]) -> bool:
    return all(cell.get(f) in levels for f, levels in rule.items())


def load(path: str | Path) -> Design:
    """Read and validate a design file; raise DesignError listing every problem."""
    path = Path(path)
    source = str(path)
    if not source.strip() or source == ".":
        raise DesignError(
            "design", ["no design file given; pass --config design=PATH (e.g. design.yaml)"]
        )
    try:
        raw = yaml_safe.load(yaml_safe.read_text(path))
    except FileNotFoundError:
        raise DesignError(
            source,
            ["file not found; copy design.yaml from the repository or pass --config design=PATH"],
        ) from None
    except yaml_safe.YamlProblem as exc:
        raise DesignError(source, [str(exc)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise DesignError(source, [f"{where}not valid YAML ({yaml_safe.plain(exc)})"]) from None
    return parse(raw, source)


def parse(raw: Any, source: str = "design.yaml") -> Design:
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise DesignError(
            source,
            [f"must be a mapping with at least 'factors' (keys: {', '.join(TOP_LEVEL_KEYS)})"],
        )
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            problems.append(f"unknown key {shown(key)} (allowed: {', '.join(TOP_LEVEL_KEYS)})")

    name = _parse_name(raw, source, problems)
    factors = _parse_factors(raw.get("factors"), problems)
    fixed = _parse_fixed(raw.get("fixed", {}), factors, problems)
    max_runs = _integer(raw, "max_runs", MAX_RUNS, 1, problems, MAX_PLANNABLE)
    adaptive = _parse_adaptive(raw, problems)
    if adaptive:
        replications = adaptive.least
    else:
        replications = _integer(raw, "replications", 1, 1, problems, 10**9)  # see _check_size
    # 2^31 - 1: LBANN and TensorFlow's initialisers take the seed as an int.
    seed = _integer(raw, "seed", 42, 0, problems, 2**31 - 1)
    randomize = raw.get("randomize", True)
    if not isinstance(randomize, bool):
        problems.append(f"randomize: must be true or false, got {randomize!r}")
    zip_groups = _parse_zip(raw.get("zip", []), factors, problems)
    exclude = _parse_exclude(raw.get("exclude", []), factors, problems)
    sample = sampling.parse(raw, factors, seed, problems) if not problems else None
    fraction = None if sample or problems else fractional.parse(raw, factors, problems)
    follow_up = raw.get("follow_up")
    if follow_up is not None and not isinstance(follow_up, dict):
        problems.append("follow_up: must be a mapping (ddlc follow-up writes it); remove it")
    if not problems:
        if fraction:
            cells = fraction.runs_per_replication
        elif sample:
            cells = sample.cells_per_replication(factors)
        else:
            cells = _full_cells(factors, zip_groups)
        _check_size(cells, adaptive.most if adaptive else replications, max_runs, problems)
    if problems:
        raise DesignError(source, problems)

    design = Design(
        name=name,
        factors=factors,
        fixed=fixed,
        replications=replications,
        seed=seed,
        randomize=randomize,
        exclude=exclude,
        zip_groups=zip_groups,
        source=source,
        fraction=fraction,
        sample=sample,
        follow_up=follow_up,
        adaptive=adaptive,
    )
    _check_cells(design, problems)
    if problems:
        raise DesignError(source, problems)
    return design


ADAPTIVE_KEYS = ("target_half_width", "min_replications", "max_replications")


def _parse_adaptive(raw: dict, problems: list[str]) -> Adaptive | None:
    """replications: auto and its three settings (only with it)."""
    if raw.get("replications") != "auto":
        if given := [k for k in ADAPTIVE_KEYS if k in raw]:
            problems.append(
                f"{given[0]}: applies to replications: auto only; set replications: auto "
                f"or remove {given[0]}"
            )
        return None
    target = raw.get("target_half_width", Adaptive.target_half_width)
    if not isinstance(target, (int, float)) or isinstance(target, bool) or not 0 < target < 1:
        problems.append(
            f"target_half_width: must be a number between 0 and 1 (0.05: the 95 % interval "
            f"within 5 % of the mean), got {target!r}"
        )
        target = Adaptive.target_half_width
    least = _integer(raw, "min_replications", Adaptive.least, 2, problems, 1000)
    most = _integer(raw, "max_replications", Adaptive.most, 2, problems, 1000)
    if most < least:
        problems.append(f"max_replications ({most}) is below min_replications ({least}); raise it")
        most = least
    return Adaptive(float(target), least, most)


def _parse_name(raw: dict, source: str, problems: list[str]) -> str:
    if "name" not in raw:
        name = Path(source).stem
        if problem := text_problem(name):
            problems.append(
                f"name: not set, so it would be the file's name {shown(name)}, which "
                f"{problem}; add a line 'name: my-campaign'"
            )
        return name
    name = raw["name"]
    if isinstance(name, bool):
        written = "no" if name is False else "yes"
        problems.append(
            f"name: YAML reads {written} (or on/off, true/false) as {name}, not "
            f"text; put it in quotes: name: '{written}'"
        )
    elif isinstance(name, (int, float)):
        problems.append(
            f"name: YAML reads {name} as a number, not text; put it in quotes: name: '{name}'"
        )
    elif not isinstance(name, str):
        problems.append(f"name: {shown(name)} is not text; give a short name, e.g. my-campaign")
    elif problem := text_problem(name):
        problems.append(f"name: {shown(name)} {problem}")
    return name


def _full_cells(factors: dict, zip_groups: list[list[str]]) -> int:
    """The full factorial's cells, counted before expanding them: 10^7 runs
    would fill the memory."""
    zipped = {f for group in zip_groups for f in group}
    cells = 1
    for group in zip_groups:
        cells *= len(factors[group[0]])
    for f, levels in factors.items():
        if f not in zipped:
            cells *= len(levels)
    return cells


def _check_size(cells: int, replications: int, max_runs: int, problems: list[str]) -> None:
    """The cap counts the runs the plan lists: a fraction's, not the full
    factorial's it is drawn from."""
    if cells * replications > max_runs:
        problems.append(
            f"the plan has {cells} cells x {replications} replications = "
            f"{cells * replications} runs, more than max_runs ({max_runs}); "
            "fewer levels or replications, or set max_runs: N at the top of "
            "the design if you mean it"
        )


def _unknown(key: str, name: str, what: str) -> str:
    if name in RENAMED:
        return f"{key}: renamed; write {RENAMED[name]} instead of {name}"
    return f"{key}: unknown {what} (known: {', '.join(PARAMS)})"


def _parse_factors(raw: Any, problems: list[str]) -> dict[str, list[Any]]:
    if raw is None:
        problems.append("factors: missing; give at least 'framework: [...]'")
        return {}
    if not isinstance(raw, dict):
        problems.append("factors: must be a mapping of factor -> list of levels")
        return {}
    factors: dict[str, list[Any]] = {}
    for name, levels in raw.items():
        key = f"factors.{shown_key(name)}"
        param = PARAMS.get(name)
        if param is None:
            problems.append(_unknown(key, name, "factor"))
            continue
        if param.path_like or param.analysis_only:
            problems.append(f"{key}: cannot be a factor; set it under 'fixed'")
            continue
        if not isinstance(levels, list):
            levels = [levels]
        if not levels:
            problems.append(f"{key}: has no levels; give at least one")
            continue
        bad = [(lv, param.check(lv)) for lv in levels]
        for _level, problem in bad:
            if problem:
                problems.append(f"{key}: {problem}")
        if any(problem for _, problem in bad):
            continue
        levels = [param.normalise(lv) for lv in levels]
        seen = set()
        for level in levels:
            marker = json.dumps(level)
            if marker in seen:
                problems.append(
                    f"{key}: level {level!r} is listed twice (after reading "
                    "1 and 1.0 as one number); list each level once"
                )
            seen.add(marker)
        factors[name] = levels
    if "framework" not in raw:
        problems.append("factors.framework: missing; every design compares frameworks")
    return factors


def _parse_fixed(raw: Any, factors: dict[str, list[Any]], problems: list[str]) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append("fixed: must be a mapping of setting -> value")
        return {}
    for name, value in raw.items():
        key = f"fixed.{shown_key(name)}"
        param = PARAMS.get(name)
        if param is None:
            problems.append(_unknown(key, name, "setting"))
        elif name in factors:
            problems.append(f"{key}: is also a factor; keep it in one place")
        elif problem := param.check(value):
            problems.append(f"{key}: {problem}")
    resolved = {name: p.default for name, p in PARAMS.items() if name not in factors}
    resolved.update(
        {k: PARAMS[k].normalise(v) for k, v in raw.items() if k in PARAMS and k not in factors}
    )
    return resolved


def _integer(
    raw: dict, key: str, default: int, minimum: int, problems: list[str], maximum: int
) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        problems.append(
            f"{key}: must be an integer >= {minimum}, got {value!r}" + _hint(key, value)
        )
        return default
    if value > maximum:
        problems.append(f"{key}: must be at most {maximum}, got {value}" + _why_at_most(key))
        return default
    return value


def _hint(key: str, value) -> str:
    """What was probably meant: a number in quotes, or auto spelt otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        return f" (text in quotes: write {value.strip()} without them)"
    if key == "replications" and isinstance(value, str) and value.strip().lower() == "auto":
        return " (write auto in lower case)"
    return ""


def _why_at_most(key: str) -> str:
    if key == "max_runs":
        return (
            " (the plan and the workflow's jobs are held in memory); split the campaign "
            "into designs of fewer runs"
        )
    return ""


def _parse_zip(raw: Any, factors: dict[str, list[Any]], problems: list[str]) -> list[list[str]]:
    if not isinstance(raw, list) or not all(isinstance(g, list) for g in raw):
        problems.append("zip: must be a list of factor lists, e.g. [[nodes, batch_size]]")
        return []
    groups: list[list[str]] = []
    used: set[str] = set()
    for i, group in enumerate(raw):
        key = f"zip[{i}]"
        if not all(isinstance(f, str) for f in group):
            problems.append(
                f"{key}: lists factor names only, e.g. [nodes, batch_size]; "
                "the levels go under factors"
            )
            continue
        unknown = [f for f in group if f not in factors]
        if unknown:
            problems.append(f"{key}: {', '.join(map(shown_key, unknown))} not among the factors")
            continue
        if twice := next((f for i, f in enumerate(group) if f in group[:i]), None):
            problems.append(f"{key}: {shown_key(twice)} is listed twice; list each factor once")
            continue
        if len(group) < 2:
            problems.append(f"{key}: needs at least two factors")
            continue
        if used & set(group):
            problems.append(f"{key}: a factor may be in one zip group only")
            continue
        lengths = {f: len(factors[f]) for f in group}
        if len(set(lengths.values())) > 1:
            problems.append(
                f"{key}: zipped factors need the same number of levels, got "
                + ", ".join(f"{f}={n}" for f, n in lengths.items())
            )
            continue
        used |= set(group)
        groups.append(list(group))
    return groups


def _parse_exclude(raw: Any, factors: dict[str, list[Any]], problems: list[str]) -> list[dict]:
    if not isinstance(raw, list):
        problems.append(
            "exclude: must be a list of rules like {framework: horovod-torch, nodes: 2}"
        )
        return []
    rules = []
    for i, rule in enumerate(raw):
        key = f"exclude[{i}]"
        if not isinstance(rule, dict) or not rule:
            problems.append(f"{key}: must be a non-empty mapping of factor -> level(s)")
            continue
        parsed = {
            f: _exclude_levels(f"{key}.{shown_key(f)}", f, v, factors, problems)
            for f, v in rule.items()
        }
        if all(levels is not None for levels in parsed.values()):
            rules.append(parsed)
    return rules


def _exclude_levels(
    key: str, factor: Any, levels: Any, factors: dict[str, list[Any]], problems: list[str]
) -> list[Any] | None:
    """A rule's levels of one factor, checked as the factor's levels are
    (true is not 1, '2' is not 2) and spelt as they are (1 is 1.0)."""
    if factor not in factors:
        problems.append(f"{key}: not a factor of this design (factors: {', '.join(factors)})")
        return None
    levels = levels if isinstance(levels, list) else [levels]
    param = PARAMS[factor]
    if bad := next((p for p in map(param.check, levels) if p), None):
        problems.append(f"{key}: {bad}")
        return None
    levels = [param.normalise(lv) for lv in levels]
    if missing := [lv for lv in levels if lv not in factors[factor]]:
        problems.append(
            f"{key}: {', '.join(map(shown, missing))} is not a level "
            f"(levels: {', '.join(map(str, factors[factor]))})"
        )
        return None
    return levels


def _check_cells(design: Design, problems: list[str]) -> None:
    unpruned = Design(**{**design.__dict__, "exclude": []})
    all_cells = unpruned._cells()
    for i, rule in enumerate(design.exclude):
        if not any(_matches(rule, c) for c in all_cells):
            problems.append(
                f"exclude[{i}]: matches no run; the combination "
                f"{rule} never occurs (check zip groups)"
            )
    cells = design._cells()
    if all_cells and not cells:
        problems.append("exclude: removes every run; the design has zero runs")
    configs = [{**design.fixed, **cell} for cell in cells]
    _check_compressions(design, configs, problems)
    from ddlcompare.plan import devices
    from frameworks import knobs

    problems += devices.cell_problems(configs)
    problems += knobs.cell_problems(configs, design.factors)
    _check_tracers(configs, problems)


def _check_tracers(configs: list[dict], problems: list[str]) -> None:
    """Every run asked for a Score-P trace must be one Score-P can trace."""
    reasons = dict.fromkeys(traceable.refusal(config) for config in configs)
    problems.extend(r for r in reasons if r)


def _check_compressions(design: Design, configs: list[dict], problems: list[str]) -> None:
    """Every framework x compression cell left must be one its adapter can run."""
    from frameworks import registry

    refused = {}
    for config in configs:
        framework, compression = config["framework"], config["compression"]
        supported = registry.FRAMEWORKS[framework].compressions
        if compression not in supported:
            refused[(framework, compression)] = supported
    for (framework, compression), supported in refused.items():
        if "compression" in design.factors:
            fix = f"add the exclude rule {{framework: {framework}, compression: {compression}}}"
        else:
            fix = f"set fixed.compression to one of {', '.join(supported)}"
        problems.append(
            f"framework {framework} cannot run compression {compression} "
            f"(it supports: {', '.join(supported)}); {fix}"
        )
