"""design.schema.json: generated from params.py, shipped current, and it
agrees with the harness on good and bad designs."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from ddlcompare.plan import design, schema

REPO = Path(__file__).resolve().parent.parent


def test_shipped_schema_and_settings_doc_are_current():
    assert schema.SCHEMA_FILE.read_text() == schema.text(), (
        "design.schema.json is stale: run python -m ddlcompare.plan.schema"
    )
    assert schema.SETTINGS_DOC.read_text() == schema.settings_doc(), (
        "docs/settings.md is stale: run python -m ddlcompare.plan.schema"
    )
    assert schema.RUN_CONFIG.read_text() == schema.run_config_module(), (
        "runfiles/run_config.py is stale: run python -m ddlcompare.plan.schema"
    )


def test_the_run_config_type_has_every_key_a_run_gets():
    """RunConfig's keys are those of a planned run's configuration, no more,
    no fewer: a setting's type is declared once, in params.py."""
    from runfiles.run_config import RunConfig

    row = design.load(REPO / "design.yaml").runs()[0]
    assert set(RunConfig.__annotations__) == set(row.config)


def test_designs_of_the_repository_validate():
    """With the plain jsonschema package, as an editor would."""
    shipped = json.loads(schema.SCHEMA_FILE.read_text())
    for path in [
        REPO / "design.yaml",
        *sorted(REPO.glob("designs/*.yaml")),
        *sorted(REPO.glob("bench/*.yaml")),
    ]:
        jsonschema.validate(yaml.safe_load(path.read_text()), shipped)
        assert schema.errors(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"factors": {"framework": ["torch-ddp"], "nodes": [0]}},
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"epochs": "two"}},
        {"factors": {"framework": ["no-such-framework"]}},
        {"factors": {"framework": ["torch-ddp"]}, "colour": "red"},
        {"factors": {"framework": ["torch-ddp"], "nodes": [1.0]}},
        {"factors": {"nodes": [1]}},
        {"factors": {"framework": ["torch-ddp"], "batch_size": [32, 64]}, "design": "random"},
        {
            "factors": {"framework": ["torch-ddp"], "batch_size": [32, 64]},
            "design": "latin-hypercube",
            "samples": 1,
        },
        {"factors": {"framework": ["torch-ddp"]}, "replications": "often"},
        {"factors": {"framework": ["torch-ddp"]}, "replications": "auto", "min_replications": 1},
    ],
)
def test_schema_and_harness_refuse_the_same_designs(bad):
    assert schema.errors(bad)
    with pytest.raises(design.DesignError):
        design.parse(bad, "bad.yaml")


def test_a_renamed_setting_names_its_new_name():
    with pytest.raises(design.DesignError, match="fixed.torch_threads: renamed; write threads"):
        design.parse(
            {"factors": {"framework": ["torch-ddp"]}, "fixed": {"torch_threads": 2}}, "old.yaml"
        )


def test_every_top_level_key_is_in_the_schema():
    assert set(schema.design_schema()["properties"]) == set(design.TOP_LEVEL_KEYS)


@pytest.mark.parametrize(
    "plan",
    [
        {"design": "fractional", "resolution": 3, "max_runs": 100},
        {"design": "latin-hypercube", "samples": 4},
        {"replications": "auto", "target_half_width": 0.1, "max_replications": 4},
    ],
)
def test_schema_and_harness_accept_the_same_plans(plan):
    good = {
        "factors": {
            "framework": ["torch-ddp"],
            "batch_size": [16, 32],
            "epochs": [1, 2],
            "momentum": [0.0, 0.9],
        },
        **plan,
    }
    assert schema.errors(good) == []
    design.parse(good, "good.yaml")
