"""JSON Schema -> the TypeScript-like tool signatures of Harmony's `# Tools` sections.

gpt-oss was trained on this exact text, so the rules follow openai/harmony's renderer to the
character (checked by `test_render_functions_with_parameters.txt`): descriptions, titles and examples
become `//` lines above a property; optional properties get `?`; a string enum becomes a union of
literals; a default is a trailing `// default: …` (strings quoted unless the schema is an enum);
`nullable` appends `| null`; `oneOf` becomes a multi-line ` | variant // comment` list; a `type`
list becomes a union. Beyond the reference (no test vector covers these): `anyOf` renders like a
one-line union. A tool with no parameters at all (an empty schema, `{}`) renders `() => any`; one whose
parameters are an object without properties renders `(_: {\n}) => any`, as OpenAI's renderer does.
"""

from __future__ import annotations

import json
from typing import Any

from parley.protocol.harmony._types import ToolNamespace
from parley.protocol.tool_spec import ToolSpec


def lines_of(text: str) -> list[str]:
    """Split like Rust's `str::lines` (the reference's): on `\n`, a trailing `\r` dropped, no final empty line."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [part[:-1] if part.endswith("\r") else part for part in parts]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _default_comment(schema: dict[str, Any]) -> str:
    default = schema["default"]
    if isinstance(default, str) and "enum" not in schema:
        return f'default: "{default}"'
    if isinstance(default, str):
        return f"default: {default}"
    return f"default: {_json(default)}"


def _with_nullable(schema: Any, type_text: str) -> str:
    if isinstance(schema, dict) and schema.get("nullable") is True and "null" not in type_text:
        return f"{type_text} | null"
    return type_text


def _variant_comments(variant: Any) -> str:
    if not isinstance(variant, dict):
        return ""
    comments: list[str] = []
    if isinstance(variant.get("description"), str):
        comments.append(variant["description"])
    if "default" in variant:
        comments.append(_default_comment(variant))
    return f" // {' '.join(comments)}" if comments else ""


def _one_of(variants: list[Any], indent: str) -> str:
    out = ""
    for variant in variants:
        out += f"\n{indent} | "
        out += _with_nullable(variant, schema_to_typescript(variant, indent + "   "))
        out += _variant_comments(variant)
    return out


def _object(schema: dict[str, Any], indent: str) -> str:
    out = ""
    if isinstance(schema.get("description"), str):
        out += f"{indent}// {schema['description']}\n"
    out += "{\n"
    properties = schema.get("properties")
    listed = schema.get("required")
    required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    if isinstance(properties, dict):
        for key, prop in properties.items():
            prop = prop if isinstance(prop, dict) else {}
            mark = "" if key in required else "?"
            if isinstance(prop.get("title"), str):
                out += f"{indent}// {prop['title']}\n{indent}//\n"
            one_of = prop.get("oneOf")
            if not isinstance(one_of, list) and isinstance(prop.get("description"), str):
                out += f"{indent}// {prop['description']}\n"
            examples = prop.get("examples")
            if isinstance(examples, list) and examples:
                out += f"{indent}// Examples:\n"
                for example in examples:
                    shown = f'"{example}"' if isinstance(example, str) else _json(example)
                    out += f"{indent}// - {shown}\n"
            if isinstance(one_of, list):
                if isinstance(prop.get("description"), str):
                    out += f"{indent}// {prop['description']}\n"
                if "default" in prop:
                    default = prop["default"]
                    shown = f'"{default}"' if isinstance(default, str) else _json(default)
                    out += f"{indent}// default: {shown}\n"
                out += f"{indent}{key}{mark}:\n"
                for variant in one_of:
                    out += f"{indent} | "
                    out += _with_nullable(variant, schema_to_typescript(variant, indent + "   "))
                    out += _variant_comments(variant) + "\n"
                out += f"{indent},\n"
                continue
            out += f"{indent}{key}{mark}: "
            out += _with_nullable(prop, schema_to_typescript(prop, indent + "    ")) + ","
            if "default" in prop:
                out += f" // {_default_comment(prop)}"
            out += "\n"
    return out + f"{indent}}}"


def schema_to_typescript(schema: Any, indent: str = "") -> str:
    """One JSON Schema as a TypeScript-like type."""
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("oneOf"), list):
        return _one_of(schema["oneOf"], indent)
    kind = schema.get("type")
    if isinstance(kind, list):
        names = ["number" if k == "integer" else k for k in kind if isinstance(k, str)]
        if names:
            return " | ".join(names)
    if kind == "object":
        return _object(schema, indent)
    if kind == "string":
        values = schema.get("enum")
        literals = [f'"{v}"' for v in values if isinstance(v, str)] if isinstance(values, list) else []
        return " | ".join(literals) if literals else "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "null":  # beyond the reference (which says `any`), for `anyOf [X, null]`
        return "null"
    if kind == "array":
        return f"{schema_to_typescript(schema['items'], indent)}[]" if "items" in schema else "Array<any>"
    if isinstance(schema.get("anyOf"), list):
        return " | ".join(schema_to_typescript(v, indent) for v in schema["anyOf"])
    return "any"


def _takes_no_arguments(parameters: dict[str, Any]) -> bool:
    """Only a tool without a parameters schema: `{"type": "object", "properties": {}}` is still an argument."""
    return not parameters


def render_tool(tool: ToolSpec) -> list[str]:
    lines = [f"// {line}" for line in lines_of(tool.description)]
    if _takes_no_arguments(tool.parameters):
        lines.append(f"type {tool.name} = () => any;\n")
    else:
        lines.append(f"type {tool.name} = (_: {schema_to_typescript(tool.parameters)}) => any;\n")
    return lines


def render_namespace(namespace: ToolNamespace) -> str:
    lines = [f"## {namespace.name}\n"]
    if namespace.description is not None:
        for line in lines_of(namespace.description):
            lines.append(f"// {line}" if namespace.tools else line)
    if namespace.tools:
        lines.append(f"namespace {namespace.name} {{\n")
        for tool in namespace.tools:
            lines.extend(render_tool(tool))
        lines.append(f"}} // namespace {namespace.name}")
    return "\n".join(lines)


def render_tools_section(namespaces: tuple[ToolNamespace, ...]) -> str:
    """`# Tools` and one `## name` section per namespace, in ascending order of name (as the reference)."""
    sections = ["# Tools"]
    sections.extend(render_namespace(ns) for ns in sorted(namespaces, key=lambda ns: ns.name))
    return "\n\n".join(sections)
