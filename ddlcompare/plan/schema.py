"""design.yaml's JSON Schema, generated from the one definition of the
settings (ddlcompare/plan/params.py) and the design's top-level keys.

The schema is shipped as ``design.schema.json`` at the repository's root,
so that editors validate design.yaml as it is typed (the first line of
design.yaml names it for the YAML language server). Types, bounds and
allowed values are checked through it; cross-field rules (zip, exclude,
what an adapter supports) stay in ddlcompare/plan/design.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlcompare.plan.params import PARAMS, SAFE_TEXT, Param

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "design.schema.json"


def value_schema(param: Param) -> dict[str, Any]:
    """The schema of one value of a setting, null included where allowed."""
    schema = param.value_schema()
    return {"anyOf": [schema, {"type": "null"}]} if param.nullable else schema


def setting_schema(param: Param) -> dict[str, Any]:
    return {**value_schema(param), "description": param.help, "default": param.default}


def factor_schema(param: Param) -> dict[str, Any]:
    level = value_schema(param)
    return {
        "description": f"levels of {param.name}: {param.help}",
        "anyOf": [{"type": "array", "items": level, "minItems": 1}, level],
    }


def design_schema() -> dict[str, Any]:
    factors = {
        p.name: factor_schema(p) for p in PARAMS.values() if not (p.path_like or p.analysis_only)
    }
    scalar = {"type": ["string", "number", "boolean", "null"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ddl-compare design",
        "description": "An experiment: factors and their levels, fixed settings, replications "
        "(generated from ddlcompare/plan/params.py by `ddlc schema`)",
        "type": "object",
        "additionalProperties": False,
        "required": ["factors"],
        "properties": {
            "name": {
                "type": "string",
                "pattern": SAFE_TEXT.pattern,
                "description": "the design's name, used as results/<name>/",
            },
            "factors": {
                "type": "object",
                "properties": factors,
                "required": ["framework"],
                "additionalProperties": False,
                "description": "factor -> list of levels; every combination runs",
            },
            "fixed": {
                "type": ["object", "null"],
                "additionalProperties": False,
                "properties": {p.name: setting_schema(p) for p in PARAMS.values()},
                "description": "setting -> value, the same for every run",
            },
            "replications": {
                "anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}],
                "default": 1,
                "description": "runs per design cell, or auto: as many as each cell's "
                "interval needs (target_half_width, min_replications, max_replications)",
            },
            **adaptive_keys(),
            "seed": {
                "type": "integer",
                "minimum": 0,
                "default": 42,
                "description": "seed for weights, data order and the run order",
            },
            "randomize": {
                "type": "boolean",
                "default": True,
                "description": "shuffle the run order with the seed",
            },
            "exclude": {
                "type": "array",
                "description": "rules removing matching runs",
                "items": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": {"anyOf": [scalar, {"type": "array", "items": scalar}]},
                },
            },
            "zip": {
                "type": "array",
                "description": "factor groups whose levels vary together",
                "items": {"type": "array", "minItems": 2, "items": {"type": "string"}},
            },
            **plan_keys(),
        },
    }


def adaptive_keys() -> dict[str, Any]:
    """replications: auto's settings (design.py checks they come with it)."""
    from ddlcompare.plan.design import TOP_LEVEL_KEYS, Adaptive

    return {
        "target_half_width": {
            "type": "number",
            "exclusiveMinimum": 0,
            "exclusiveMaximum": 1,
            "default": Adaptive.target_half_width,
            "description": TOP_LEVEL_KEYS["target_half_width"],
        },
        "min_replications": {
            "type": "integer",
            "minimum": 2,
            "default": Adaptive.least,
            "description": TOP_LEVEL_KEYS["min_replications"],
        },
        "max_replications": {
            "type": "integer",
            "minimum": 2,
            "default": Adaptive.most,
            "description": TOP_LEVEL_KEYS["max_replications"],
        },
    }


def plan_keys() -> dict[str, Any]:
    """The keys that choose which cells run and how many (design.py checks
    how they combine)."""
    from ddlcompare.plan import design, fractional, sampling

    return {
        "design": {
            "enum": ["full", "fractional", sampling.KIND],
            "default": "full",
            "description": fractional.KEYS["design"],
        },
        "resolution": {
            "type": "integer",
            "minimum": 3,
            "description": fractional.KEYS["resolution"],
        },
        "generators": {
            "type": "array",
            "items": {"type": "string"},
            "description": fractional.KEYS["generators"],
        },
        "samples": {
            "type": "integer",
            "minimum": 2,
            "maximum": sampling.MAX_SAMPLES,
            "description": sampling.KEYS["samples"],
        },
        "max_runs": {
            "type": "integer",
            "minimum": 1,
            "default": design.MAX_RUNS,
            "description": design.TOP_LEVEL_KEYS["max_runs"],
        },
        "follow_up": {"type": "object", "description": design.TOP_LEVEL_KEYS["follow_up"]},
    }


def errors(raw: Any) -> list[str]:
    """Where a design breaks the schema (Python's int for "integer"), one
    line each; empty when it conforms."""
    from runfiles.strict_json import strict_validator

    found = strict_validator(json.dumps(design_schema())).iter_errors(raw)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in found]


def text() -> str:
    return json.dumps(design_schema(), indent=2) + "\n"


def write(path: Path = SCHEMA_FILE) -> Path:
    path.write_text(text())
    return path


SETTINGS_DOC = SCHEMA_FILE.parent / "docs" / "settings.md"


def settings_doc() -> str:
    """docs/settings.md: every setting with its type, default and meaning."""
    from ddlcompare.plan.params import CORE_FACTORS

    lines = [
        "# Settings (generated from ddlcompare/plan/params.py: `python -m ddlcompare.plan.schema`)",
        "",
        "Each may be fixed (`fixed:`) or a factor (`factors:`), except where noted. "
        f"The core factors ({', '.join(CORE_FACTORS)}) name every run's folder.",
        "",
        "| setting | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for p in PARAMS.values():
        note = " (fixed only)" if p.path_like or p.analysis_only else ""
        default = "null" if p.default is None else json.dumps(p.default)
        lines.append(f"| `{p.name}` | {p.describe()} | `{default}` | {p.help}{note} |")
    lines += [
        "",
        "## Replications",
        "",
        "At the top of the design, beside `replications` (an integer, or `auto`):",
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
    ]
    for key, spec in adaptive_keys().items():
        lines.append(f"| `{key}` | `{json.dumps(spec['default'])}` | {spec['description']} |")
    return "\n".join(lines + variables_doc() + environments_doc()) + "\n"


def variables_doc() -> list[str]:
    """The environment variables (declared in runfiles/variables.py)."""
    from runfiles.variables import VARIABLES

    lines = [
        "",
        "# Environment variables (generated from runfiles/variables.py)",
        "",
        "None is needed where GitHub can be reached (elsewhere, `DDLC_SOURCES`): each has "
        "a default that works on a machine set up by `envs/setup.sh`. The harness passes "
        "them on to the jobs it starts.",
        "",
        "| variable | default | meaning | read by |",
        "| --- | --- | --- | --- |",
    ]
    for v in VARIABLES.values():
        lines.append(f"| `{v.name}` | {v.described_default()} | {v.meaning} | {v.readers} |")
    return lines


def environments_doc() -> list[str]:
    """The framework environments (declared in envs/environments.tsv)."""
    from ddlcompare.plan import envs

    setup = {
        "requirements": "`bash envs/setup.sh {name}`, uv from `{build}`'s wheels (fetched once by pip)",
        "script": "`bash envs/setup.sh {name}`, by `{build}`",
        "no": "`bash {build}`, a step of its own",
    }
    lines = [
        "",
        "# Environments (generated from envs/environments.tsv)",
        "",
        "Each framework runs in the environment its adapter names. Its folder is the "
        "checkout's, unless its variable names another or the checkout has none and "
        "its build put one under the cache root (`DDLC_CACHE`).",
        "",
        "| environment | folder | variable | else, under the cache | built by | "
        "Debian packages its build needs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for env in envs.ENVIRONMENTS.values():
        built_in = "" if env.built_in == "-" else f"`{env.built_in}`"
        needs = "" if env.needs == "-" else env.needs
        how = setup[env.setup].format(name=env.name, build=env.build)
        lines.append(
            f"| {env.name} | `{env.folder}` | `{envs.variable(env.name)}` | {built_in} | {how} "
            f"| {needs} |"
        )
    return lines


RUN_CONFIG = SCHEMA_FILE.parent / "runfiles" / "run_config.py"
# Keys of a run's configuration that are not settings: the design adds them
# to every run (ddlcompare/plan/design.py's Design._row).
RUN_KEYS = {"seed": int, "rep": int, "run_id": str, "design": str, "settings_hash": str}


def run_config_module() -> str:
    """runfiles/run_config.py: a run's configuration (config.json, RunRow.config)
    as a TypedDict, one key per setting with the type params.py declares, so
    that mypy checks every reader; generated, never edited."""
    lines = [
        '"""A run\'s configuration as a type: every setting of',
        "ddlcompare/plan/params.py with its type, and the keys the design adds to",
        "each run. Generated by `python -m ddlcompare.plan.schema`; do not edit",
        '(tests/test_schema.py checks it is current)."""',
        "",
        "# Tarantella's environment is Python 3.9: the annotations stay text.",
        "from __future__ import annotations",
        "",
        "from typing import TypedDict",
        "",
        "",
        "class RunConfig(TypedDict):",
    ]
    for p in PARAMS.values():
        kind = p.kind.__name__ + (" | None" if p.nullable else "")
        lines.append(f"    {p.name}: {kind}")
    lines += [f"    {key}: {kind.__name__}" for key, kind in RUN_KEYS.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    write()
    SETTINGS_DOC.write_text(settings_doc())
    RUN_CONFIG.write_text(run_config_module())
    print(f"wrote {SCHEMA_FILE.name}, docs/{SETTINGS_DOC.name} and runfiles/{RUN_CONFIG.name}")


if __name__ == "__main__":
    main()
