"""Schemas built around the constructs on which real-world schemas made a backend reject valid instances.

Issue 26 measured 13 rejected valid instances on held-out MaskBench schemas, all with xgrammar
deciding, on schemas mixing these constructs; each entry here isolates one of them (name ->
schema), so the differential tests can say which backend enforces which construct exactly.
"""

from __future__ import annotations

from typing import Any

_ITEM = {"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"type": "string"}}, "required": ["id"]}

FEATURE_SCHEMAS: dict[str, Any] = {
    "integer_bounds": {"type": "integer", "minimum": -5, "maximum": 1000},
    "number_bounds": {"type": "number", "minimum": 0, "maximum": 1},
    "number_exclusive_bounds": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 1e6},
    "enum_with_bounds": {"type": "integer", "enum": [1, 5, 10, 50], "minimum": 3, "maximum": 20},
    "number_enum_with_minimum": {"type": "number", "enum": [0.5, 2, 3.25], "minimum": 1},
    "min_max_items": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
    "prefix_items_with_bounds": {
        "type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"},
        "minItems": 1, "maxItems": 3,
    },
    "items_of_objects_bounded": {"type": "array", "items": _ITEM, "minItems": 1, "maxItems": 2},
    "pattern_with_format": {"type": "string", "format": "date", "pattern": "^20"},
    "pattern_with_lengths": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 6},
    "format_date_time": {"type": "string", "format": "date-time"},
    "string_lengths": {"type": "string", "minLength": 1, "maxLength": 5},
    "ref_with_additional_properties": {
        "$defs": {"item": _ITEM},
        "type": "object",
        "properties": {"main": {"$ref": "#/$defs/item"}},
        "additionalProperties": {"$ref": "#/$defs/item"},
    },
    "ref_siblings": {
        "$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "$ref": "#/$defs/base", "required": ["a"],
    },
    "one_of_tagged": {
        "oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
             "required": ["kind", "r"]},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
             "required": ["kind", "side"]},
        ]
    },
    "one_of_overlapping": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]},
    "any_of_objects": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    },
    "any_of_scalars": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}, {"type": "null"}]},
    "dependencies": {  # a Draft 7 keyword (2020-12, the default dialect, has dependentRequired instead)
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"}},
        "dependencies": {"card": ["billing"]},
    },
    "dependent_required": {
        "type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"}},
        "dependentRequired": {"card": ["billing"]},
    },
    "all_of_merge": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}},
        ]
    },
    "pattern_properties": {
        "type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False,
    },
    "nested_optional": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                       "meta": {"type": "object", "properties": {"k": {"type": "boolean"}}}},
        "required": ["name"],
    },
    "unique_items": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 4},
    "multiple_of": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    "const_object": {"const": {"a": [1, 2], "b": None}},
}  # fmt: skip
