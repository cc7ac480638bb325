"""JSON Schemas of design and space files, for editors (e.g. with the Even Better TOML extension).

    dse schema space > spaces/space.schema.json
"""

from __future__ import annotations

from dse.build import STRING_PATHS as STRINGS
from dse.build import settable_paths
from dse.design import SECTIONS
from dse.space import DIRECTIONS, NUMERIC_METRICS


def _sections() -> dict:
    paths = settable_paths()
    props = {}
    for sec in SECTIONS:
        keys = {}
        for p in paths:
            if p.startswith(sec + "."):
                rest = p[len(sec) + 1:]
                keys[rest] = {"type": "string"} if p in STRINGS else {"type": "number"}
        if sec == "layout":
            keys["num_chips"] = {"type": "integer", "minimum": 1}
        props[sec] = {"type": "object", "description": f"[{sec}]: catalog id and overrides",
                      "propertyNames": {"enum": sorted(keys)}, "properties": keys}
    return props


def design_schema() -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "dse design file",
            "type": "object", "additionalProperties": False, "properties": _sections(),
            "required": ["accelerator", "model"]}


def space_schema() -> dict:
    value = {"type": ["string", "number", "boolean"]}
    grid = {"oneOf": [
        {"type": "array", "items": value, "minItems": 1},
        {"type": "object", "additionalProperties": False,
         "properties": {"values": {"type": "array", "items": value, "minItems": 1},
                        "scale": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0},
                                  "minItems": 1},
                        "low": {"type": "number"}, "high": {"type": "number"},
                        "num": {"type": "integer", "minimum": 1},
                        "step": {"type": "number", "exclusiveMinimum": 0},
                        "log": {"type": "boolean"}}}]}
    bound = {"type": "object", "additionalProperties": False, "minProperties": 1,
             "properties": {"max": {"type": "number"}, "min": {"type": "number"}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "dse space file",
        "type": "object", "additionalProperties": False,
        "properties": {
            **_sections(),
            "name": {"type": "string"}, "question": {"type": "string"},
            "parameters": {"type": "object", "propertyNames": {"enum": settable_paths()},
                           "additionalProperties": grid},
            "objectives": {"oneOf": [
                {"type": "string", "description": "path of an objectives file"},
                {"type": "object", "propertyNames": {"enum": list(NUMERIC_METRICS)},
                 "additionalProperties": {"enum": list(DIRECTIONS)}, "minProperties": 1}]},
            "constraints": {"type": "object", "propertyNames": {"enum": list(NUMERIC_METRICS)},
                            "additionalProperties": bound},
            "answer": {"type": "object", "required": ["analysis"],
                       "description": "a worked question: the analysis (module of dse/questions) "
                                      "and its parameters",
                       "properties": {"analysis": {"type": "string"}}},
        },
        "required": ["objectives"],
    }
