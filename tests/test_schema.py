"""The exported JSON Schemas accept every shipped file, reject misspellings, and are current."""

from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest
from helpers import ROOT

from dse.spec.schema import design_schema, space_schema, train_space_schema


def test_committed_schemas_are_current():
    assert json.loads((ROOT / "spaces" / "space.schema.json").read_text()) == space_schema()
    assert json.loads((ROOT / "spaces" / "train-space.schema.json").read_text()) \
        == train_space_schema()
    assert json.loads((ROOT / "examples" / "design.schema.json").read_text()) == design_schema()


@pytest.mark.parametrize("path", sorted((ROOT / "spaces").glob("*.toml")), ids=lambda p: p.name)
def test_every_space_validates(path):
    doc = tomllib.loads(path.read_text())
    jsonschema.validate(doc, train_space_schema() if doc.get("task") == "train"
                        else space_schema())


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_every_design_validates(path):
    jsonschema.validate(tomllib.loads(path.read_text()), design_schema())


def test_misspellings_are_rejected():
    doc = tomllib.loads((ROOT / "spaces" / "quickstart.toml").read_text())
    doc["parameters"]["layout.tpp"] = [1]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, space_schema())
    doc = tomllib.loads((ROOT / "examples" / "llama70b-h100.toml").read_text())
    doc["accelerator"]["hbm_bw_bytes_per_sec"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, design_schema())


@pytest.mark.parametrize("path,value", [
    ("model.weight_dtype", ["bf16", "fp9"]),           # not a choice
    ("model.weight_dtype", {"scale": [1.0, 2.0]}),     # a choice cannot be scaled
    ("layout.tp", [1, -2]),                            # below the field's range
    ("workload.prefix_hit_fraction", [0.5, 1.5]),      # a fraction above 1
    ("accelerator.id", [""]),                          # a blank id
])
def test_parameter_values_are_typed_by_the_field_registry(path, value):
    doc = tomllib.loads((ROOT / "spaces" / "quickstart.toml").read_text())
    doc["parameters"][path] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, space_schema())
    doc["parameters"][path] = {"layout.tp": [1, 2], "model.weight_dtype": ["fp8"],
                               "workload.prefix_hit_fraction": [0.0, 0.5],
                               "accelerator.id": ["b300"]}[path]
    jsonschema.validate(doc, space_schema())


def test_training_misspellings_are_rejected():
    doc = tomllib.loads((ROOT / "spaces" / "train-405b.toml").read_text())
    jsonschema.validate(doc, train_space_schema())
    doc["parameters"]["layout.recomptue"] = ["full"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, train_space_schema())
    doc = tomllib.loads((ROOT / "spaces" / "train-405b.toml").read_text())
    doc["training"]["global_batch_seq"] = 1024
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, train_space_schema())
