"""JSON Schemas of design and space files, for editors (e.g. with the Even Better TOML extension).

    dse schema space > spaces/space.schema.json
"""

from __future__ import annotations

from dse.spec.design import DIRECTIONS, NUMERIC_METRICS, SECTIONS
from dse.spec import train_fields
from dse.spec.fields import CATALOG, LIMITS, REGISTRY, Field


def field_schema(f: Field) -> dict:
    """A field's JSON Schema: type, range, choices, and its description with unit and default."""
    default = "from the catalog" if f.default is CATALOG else (
        "dse chooses" if f.default is None else repr(f.default))
    doc = f"{f.doc}" + (f" [{f.unit}]" if f.unit else "") + f"; default: {default}"
    if f.kind == "id":      # blank only where the field gives it a meaning (no draft model)
        return {"type": "string", "minLength": 0 if f.blank else 1, "description": doc}
    if f.kind == "enum":
        return {"enum": [*f.choices, *([""] if f.blank else [])], "description": doc}
    if f.kind == "bool":
        return {"type": ["boolean", "integer"], "minimum": 0, "maximum": 1, "description": doc}
    out = {"type": "integer" if f.kind == "int" else "number"}
    if f.low is not None:
        out["exclusiveMinimum" if f.low_open else "minimum"] = f.low
    if f.upper is not None:
        out["maximum"] = f.upper
    out["description"] = doc
    return out


def parameter_schema(f: Field) -> dict:
    """What a space's ``[parameters]`` entry of a field may be: a list of its values, or a table
    of values; numbers also a range (low/high with num or step, log) or scale factors of the
    base design's value (a scale-factor column is ``<path>.scale``)."""
    item = {k: v for k, v in field_schema(f).items() if k != "description"}
    values = {"type": "array", "items": item, "minItems": 1}
    spec = {"values": values}
    if f.kind in ("int", "float"):
        spec.update({
            "scale": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0},
                      "minItems": 1, "description": "factors of the base design's value"},
            "low": {"type": "number"}, "high": {"type": "number"},
            "num": {"type": "integer", "minimum": 1, "maximum": LIMITS["values per parameter"]},
            "step": {"type": "number", "exclusiveMinimum": 0}, "log": {"type": "boolean"}})
    return {"description": field_schema(f)["description"],
            "oneOf": [values, {"type": "object", "additionalProperties": False,
                               "minProperties": 1, "properties": spec}]}


def _sections(design: bool) -> dict:
    """The design sections; ``design``: with the input-only fields (layout.num_chips)."""
    props = {}
    for sec in SECTIONS:
        keys = {p[len(sec) + 1:]: field_schema(f) for p, f in sorted(REGISTRY.items())
                if f.section == sec and (f.resolved or design)}
        props[sec] = {"type": "object", "description": f"[{sec}]: catalog id and overrides",
                      "propertyNames": {"enum": sorted(keys)}, "properties": keys}
    return props


def design_schema() -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "dse design file",
            "type": "object", "additionalProperties": False, "properties": _sections(True),
            "required": ["accelerator", "model"]}


def space_schema() -> dict:
    bound = {"type": "object", "additionalProperties": False, "minProperties": 1,
             "properties": {"max": {"type": "number", "minimum": 0},
                            "min": {"type": "number", "minimum": 0}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "dse space file",
        "type": "object", "additionalProperties": False,
        "properties": {
            **_sections(False),
            "name": {"type": "string"}, "question": {"type": "string"},
            "parameters": {"type": "object", "additionalProperties": False,
                           "properties": {p: parameter_schema(f) for p, f in
                                          sorted(REGISTRY.items()) if f.resolved}},
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


def train_space_schema() -> dict:
    """A training space (``task = "train"``): its sections, parameters and metrics
    (``dse.spec.train_fields``)."""
    from_serving = space_schema()
    bound = from_serving["properties"]["constraints"]["additionalProperties"]
    metrics = list(train_fields.NUMERIC_METRICS)
    props = {}
    for sec in train_fields.SECTIONS:
        keys = {p[len(sec) + 1:]: field_schema(f) for p, f in sorted(train_fields.REGISTRY.items())
                if f.section == sec}
        if keys:
            props[sec] = {"type": "object", "description": f"[{sec}]",
                          "propertyNames": {"enum": sorted(keys)}, "properties": keys}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "dse training space file", "type": "object", "additionalProperties": False,
        "properties": {
            **props, "task": {"const": "train"},
            "name": {"type": "string"}, "question": {"type": "string"},
            "parameters": {"type": "object", "additionalProperties": False,
                           "properties": {p: parameter_schema(f) for p, f in
                                          sorted(train_fields.REGISTRY.items())}},
            "objectives": {"oneOf": [
                {"type": "string", "description": "path of an objectives file"},
                {"type": "object", "propertyNames": {"enum": metrics},
                 "additionalProperties": {"enum": list(DIRECTIONS)}, "minProperties": 1}]},
            "constraints": {"type": "object", "propertyNames": {"enum": metrics},
                            "additionalProperties": bound},
        },
        "required": ["task", "objectives"],
    }
