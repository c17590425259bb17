"""The JSON Schema corpus of the structured-output tests: one schema per feature OpenAI's strict
mode and common agent frameworks use. Every string, array and number is bounded (maxLength, enum,
pattern, maxItems, maximum, multipleOf), so that even a random model's output reaches the end of
the grammar within a tiny model's context: an unbounded string lets a model that repeats itself
write forever, and no mask can end it."""
from __future__ import annotations

S = {"type": "string", "maxLength": 6}          # a short free string
B = {"type": "string", "maxLength": 3}

SCHEMAS: dict[str, dict] = {
    "flat_object": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
                    "required": ["name", "age"], "additionalProperties": False},
    "nested_object": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "tag": B},
                 "required": ["id", "tag"], "additionalProperties": False},
        "ok": {"type": "boolean"}}, "required": ["user", "ok"], "additionalProperties": False},
    "deeply_nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["c"], "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
        "required": ["a"], "additionalProperties": False},
    "array_min_max": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
    "array_exact": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3},
    "array_of_objects": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "object", "properties": {"k": B, "v": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["k", "v"], "additionalProperties": False}},
    "enum_strings": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                     "required": ["color"], "additionalProperties": False},
    "enum_mixed": {"enum": ["a", 1, None, True, 2.5]},
    "const": {"type": "object", "properties": {"version": {"const": "v1"}, "n": {"const": 3}},
              "required": ["version", "n"], "additionalProperties": False},
    "anyof": {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, B]}},
              "required": ["x"], "additionalProperties": False},
    "oneof_disjoint": {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}},
                                  "required": ["kind", "r"], "additionalProperties": False},
                                 {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}},
                                  "required": ["kind", "side"], "additionalProperties": False}]},
    "number_bounds": {"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}},
                      "required": ["p"], "additionalProperties": False},
    "number_exclusive": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 0.5},
    "integer_negative": {"type": "integer", "minimum": -100, "maximum": -10},
    "integer_multiple": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "nullable": {"type": "object", "properties": {"maybe": {"type": ["string", "null"], "maxLength": 4}},
                 "required": ["maybe"], "additionalProperties": False},
    "required_subset": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": B},
                        "required": ["a"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
                "required": ["code"], "additionalProperties": False},
    "pattern_phone": {"type": "string", "pattern": "^\\+?[0-9]{3}-[0-9]{4}$"},
    "format_date": {"type": "object", "properties": {"d": {"type": "string", "format": "date"}},
                    "required": ["d"], "additionalProperties": False},
    "format_time": {"type": "string", "format": "time"},
    "format_date_time": {"type": "string", "format": "date-time"},
    "format_uuid": {"type": "string", "format": "uuid"},
    "format_ipv4": {"type": "string", "format": "ipv4"},
    "format_email": {"type": "string", "format": "email", "maxLength": 12},
    "min_length": {"type": "string", "minLength": 3, "maxLength": 5},
    "defs_ref": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                     "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                                     "required": ["x", "y"], "additionalProperties": False}},
                 "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
                 "required": ["from", "to"], "additionalProperties": False},
    "defs_recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["v", "next"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["x", "y"]}],
                     "items": False},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                          "additionalProperties": False},
                         {"properties": {"a": {"minimum": 3, "maximum": 7}}}]},
    "pydantic_like": {"title": "Person", "type": "object", "properties": {
        "name": {"title": "Name", "type": "string", "maxLength": 6},
        "tags": {"title": "Tags", "type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "score": {"title": "Score", "type": "number", "minimum": 0, "maximum": 5, "multipleOf": 0.5}},
        "required": ["name", "tags", "score"], "additionalProperties": False},
    "object_of_arrays": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "null"}, "maxItems": 2},
                                                          "ys": {"type": "array", "items": B, "maxItems": 1}},
                         "required": ["xs", "ys"], "additionalProperties": False},
    "string_unicode_enum": {"enum": ["café", "日本", "naïve"]},
}

# Keywords the engine cannot enforce: each must be a 400 naming it, never an unconstrained answer.
UNSUPPORTED = {
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "not": {"not": {"type": "string"}},
    "if": {"if": {"type": "string"}, "then": {"minLength": 1}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
}
