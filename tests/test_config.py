"""The config model: valid configs parse; every invalid one names its key path and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from privpipe.errors import ConfigError
from privpipe.pipelines.config import PrivpipeConfig, json_schema, read_config, validate_config

ROOT = Path(__file__).resolve().parent.parent


def base() -> dict[str, Any]:
    return {
        "name": "adult-nightly",
        "input": {"path": "data/adult.csv", "format": "csv", "delimiter": ";"},
        "schema": {
            "quasi_identifiers": ["age", "sex", "race"],
            "sensitive": "occupation",
            "privacy_unit": None,
        },
        "hierarchies": {
            "age": {"file": "h/age.csv"},
            "sex": {"groups": [{"Male": "*", "Female": "*"}]},
            "race": {"mask": {"digits": 1}},
        },
        "releases": [
            {
                "name": "k5",
                "kind": "k_anonymity",
                "k": 5,
                "suppression_limit": 0.05,
                "algorithm": "optimal",
            },
            {"name": "l3", "kind": "l_diversity", "k": 5, "l": 3, "variant": "recursive", "c": 4},
            {"name": "t02", "kind": "t_closeness", "k": 5, "t": 0.2, "distance": "equal"},
        ],
        "output": {"dir": "out/adult-nightly", "format": "csv"},
    }


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        validate_config(data, "demo.yaml")
    assert e.value.exit_code == 2
    return str(e.value)


def test_valid_config_parses_into_frozen_model() -> None:
    cfg = validate_config(base(), "demo.yaml")
    assert cfg.name == "adult-nightly"
    assert cfg.schema_.quasi_identifiers == ["age", "sex", "race"]
    assert [r.kind for r in cfg.releases] == ["k_anonymity", "l_diversity", "t_closeness"]
    assert cfg.input.batch_rows == 65_536 and cfg.input.max_rejected_fraction == 0
    with pytest.raises(Exception, match="frozen"):
        cfg.name = "other"  # type: ignore[misc]


def test_design_md_example_keys_validate() -> None:
    """The anonymisation part of DESIGN.md's config example is accepted as written."""
    data = yaml.safe_load(
        """
name: adult-nightly
input: {path: data/adult.csv, format: csv, delimiter: ";"}
schema:
  quasi_identifiers: [age, sex, race, education, marital-status, native-country, workclass]
  sensitive: occupation
  privacy_unit: null
hierarchies:
  age: {file: hierarchies/adult_hierarchy_age.csv}
  sex: {file: h/sex.csv}
  race: {file: h/race.csv}
  education: {file: h/education.csv}
  marital-status: {file: h/ms.csv}
  native-country: {file: h/nc.csv}
  workclass: {file: h/wc.csv}
releases:
  - {name: k5,   kind: k_anonymity, k: 5, suppression_limit: 0.05, algorithm: optimal}
  - {name: l3,   kind: l_diversity, k: 5, l: 3, variant: recursive, c: 4}
  - {name: t02,  kind: t_closeness, k: 5, t: 0.2, distance: hierarchical}
output: {dir: out/adult-nightly, format: csv}
"""
    )
    data["hierarchies"]["occupation"] = {"file": "h/occ.csv"}
    cfg = validate_config(data, "adult.yaml")
    assert cfg.needs_hierarchy() >= {"age", "occupation"}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["releases"][2].update(k=0),
            "demo.yaml: releases[2].k: must be an integer >= 1, got 0",
        ),
        (
            lambda d: d["releases"][0].update(k=1),
            "demo.yaml: releases[0].k: must be an integer >= 2, got 1",
        ),
        (
            lambda d: d["releases"][0].update(k=2.5),
            "demo.yaml: releases[0].k: must be an integer, got 2.5",
        ),
        (
            lambda d: d["releases"][0].update(k="5"),
            "demo.yaml: releases[0].k: must be an integer, got '5'",
        ),
        (
            lambda d: d["input"].update(batch_rows=-5),
            "demo.yaml: input.batch_rows: must be an integer >= 1, got -5",
        ),
        (
            lambda d: d["input"].update(delimter=";"),
            "demo.yaml: input.delimter: unknown key; did you mean 'delimiter'?",
        ),
        (
            lambda d: d.update(outptu={"dir": "x"}),
            "demo.yaml: outptu: unknown key; did you mean 'output'?",
        ),
        (
            lambda d: d["releases"][1].update(variant="recursive", c=None),
            "variant: recursive needs 'c'",
        ),
        (
            lambda d: d["releases"][2].update(t=1.5),
            "demo.yaml: releases[2].t: must be a number <= 1.0, got 1.5",
        ),
        (
            lambda d: d["releases"][2].update(t=float("nan")),
            "releases[2].t: must be a finite number",
        ),
        (
            lambda d: d["releases"][0].update(kind="k_anon"),
            "releases[0].kind: unknown release kind 'k_anon'",
        ),
        (
            lambda d: d["releases"][1].update(name="k5"),
            "releases[1].name: 'k5' is used by an earlier release; names must be unique",
        ),
        (
            lambda d: d["schema"].update(sensitive="age"),
            "schema.sensitive: 'age' is also a quasi-identifier",
        ),
        (
            lambda d: d["hierarchies"].pop("race"),
            "hierarchies.race: missing; releases[0] (k_anonymity) generalises 'race'",
        ),
        (
            lambda d: d["hierarchies"].update(zip={"mask": {"digits": 5}}),
            "hierarchies.zip: 'zip' is neither a quasi-identifier, the sensitive attribute nor",
        ),
        (
            lambda d: d["hierarchies"].update(age={"file": "a.csv", "mask": {"digits": 2}}),
            "hierarchies.age: give exactly one of file, mask, prefix, intervals, dates, groups, "
            "codes",
        ),
        (
            lambda d: d["hierarchies"].update(age={"intervals": {"widths": [5, 7]}}),
            "hierarchies.age.intervals.widths: each width must be a multiple of the previous",
        ),
        (
            lambda d: d["schema"].update(quasi_identifiers=["age", "sex", "race", "age"]),
            "schema.quasi_identifiers: 'age' is listed twice",
        ),
        (
            lambda d: d["input"].update(delimiter=";;"),
            "input.delimiter: must be a single character, got ';;'",
        ),
        (lambda d: d.pop("output"), "demo.yaml: output: required key is missing"),
        (lambda d: d.update(name="my name"), "demo.yaml: name: must start with a letter"),
        (
            lambda d: d["input"].update(max_rejected_fraction=2),
            "input.max_rejected_fraction: must be a number <= 1.0, got 2",
        ),
        (
            lambda d: d["releases"][0].update(min_levels={"zip": 1}),
            "releases[0].min_levels.zip: 'zip' is not a quasi-identifier",
        ),
        (lambda d: d["input"].update(header=False), "header: false needs 'columns'"),
        (
            lambda d: d.update(report={"marginals": [["age", "salary"]]}),
            "report.marginals[0]: 'salary' is not a quasi-identifier or the sensitive",
        ),
        (
            lambda d: d.update(report={"marginals": [["age", "age"]]}),
            "report.marginals[0]: give one or more distinct columns",
        ),
    ],
)
def test_invalid_configs_name_key_and_fix(mutate: Any, expected: str) -> None:
    data = base()
    mutate(data)
    assert expected in error_of(data)


def test_all_problems_reported_at_once() -> None:
    data = base()
    data["releases"][0]["k"] = 1
    data["input"]["batch_rows"] = 0
    msg = error_of(data)
    assert "releases[0].k" in msg and "input.batch_rows" in msg
    assert len(msg.splitlines()) >= 2


def test_yaml_syntax_error_has_line_number(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ninput:\n  path: a.csv\n   format: csv\noutput: {dir: o}\n")
    with pytest.raises(ConfigError) as e:
        read_config(p)
    assert "bad.yaml: YAML syntax error at line 4" in str(e.value)


def test_config_must_be_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        read_config(p)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        read_config(tmp_path / "nope.yaml")


def test_committed_json_schema_is_current() -> None:
    """configs/schema.json is generated from the model; regenerate with `privpipe schema`."""
    committed = json.loads((ROOT / "configs" / "schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema()))


def test_schema_forbids_unknown_keys() -> None:
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "input", "schema", "output"}


def test_example_configs_validate() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data, _ = read_config(path)
        assert isinstance(validate_config(data, path.name), PrivpipeConfig)
