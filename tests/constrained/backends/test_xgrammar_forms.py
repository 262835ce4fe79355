"""The schema rewrites xgrammar gets (`backends/xgrammar_forms.py`) and its no-multiple-in-range rule, as functions.

The end-to-end checks (the rewritten schema compiles and accepts what it should) are in
`tests/constrained/test_generated_schemas.py`; these pin the rewrites' exactness case by case.
"""

from __future__ import annotations

from typing import Any

import pytest

from parley.constrained.backends.xgrammar import _no_multiple_in_range
from parley.constrained.backends.xgrammar_forms import (
    ROOT_DEFINITION,
    root_recursion_as_definition,
    tuples_as_prefix_items,
)

INTEGER = {"type": "integer"}


@pytest.mark.parametrize(
    ("node", "empty"),
    [
        ({**INTEGER, "minimum": 1, "maximum": 2, "multipleOf": 5}, True),
        ({**INTEGER, "minimum": 1, "maximum": 5, "multipleOf": 5}, False),
        ({**INTEGER, "minimum": 0, "exclusiveMaximum": 5, "multipleOf": 5}, False),  # 0 is a multiple
        ({**INTEGER, "exclusiveMinimum": 0, "exclusiveMaximum": 5, "multipleOf": 5}, True),
        ({**INTEGER, "minimum": 5, "exclusiveMinimum": True, "maximum": 9, "multipleOf": 5}, True),  # Draft 4
        ({**INTEGER, "minimum": -7, "maximum": -6, "multipleOf": 5}, True),
        ({**INTEGER, "minimum": 1.5, "maximum": 2.5, "multipleOf": 2}, False),  # 2
        ({**INTEGER, "minimum": 1, "multipleOf": 5}, False),  # one bound: never empty
        ({"type": "number", "minimum": 1, "maximum": 2, "multipleOf": 5}, False),  # xgrammar ignores it there
        ({**INTEGER, "minimum": 1, "maximum": 2, "multipleOf": 0.5}, False),  # fractional steps: not judged
    ],
)
def test_an_integer_range_is_empty_of_multiples_only_when_no_multiple_lies_between_its_bounds(
    node: dict[str, Any], empty: bool
) -> None:
    assert _no_multiple_in_range(node) is empty


def test_a_tuple_items_list_becomes_prefix_items_with_its_additional_items_as_items() -> None:
    schema = {"type": "array", "items": [INTEGER, {"type": "string"}], "additionalItems": False}
    assert tuples_as_prefix_items(schema) == {"type": "array", "prefixItems": [INTEGER, {"type": "string"}],
                                              "items": False}  # fmt: skip
    assert schema["items"] == [INTEGER, {"type": "string"}]  # a copy: the caller's schema is left alone


def test_prefix_items_past_max_items_are_cut() -> None:
    cut = tuples_as_prefix_items({"prefixItems": [INTEGER, INTEGER, INTEGER], "maxItems": 1})
    assert cut == {"prefixItems": [INTEGER], "maxItems": 1}
    assert tuples_as_prefix_items({"prefixItems": [INTEGER], "maxItems": 0}) == {"maxItems": 0}


def test_a_self_referring_root_moves_under_defs_with_its_pointers() -> None:
    tree = {"$schema": "x", "properties": {"kids": {"items": {"$ref": "#"}}, "tag": {"$ref": "#/$defs/t"}},
            "$defs": {"t": {"type": "string"}}}  # fmt: skip
    moved = root_recursion_as_definition(tree)
    inner = moved["$defs"][ROOT_DEFINITION]
    assert moved["$ref"] == f"#/$defs/{ROOT_DEFINITION}" and moved["$schema"] == "x"
    assert inner["properties"]["kids"]["items"]["$ref"] == f"#/$defs/{ROOT_DEFINITION}"
    assert inner["properties"]["tag"]["$ref"] == f"#/$defs/{ROOT_DEFINITION}/$defs/t"


def test_a_root_that_does_not_refer_to_itself_is_left_as_written() -> None:
    schema = {"properties": {"a": {"$ref": "#/$defs/t"}}, "$defs": {"t": INTEGER}}
    assert root_recursion_as_definition(schema) is schema
