"""The configuration reference, generated from the settings and deploy spec classes.

MkDocs runs this file as a hook: a page holding ``<!-- reference: gateway.yaml -->`` or
``<!-- reference: deploy.yaml -->`` gets, in that place, one table per section of the file,
each field with its type, default and the docstring written under it in the class. A field
without a docstring fails the build, so the reference cannot drift from the code.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi

from deploy.sidecar.spec import Spec
from gateway.settings import Settings

ROOTS: dict[str, type[msgspec.Struct]] = {"gateway.yaml": Settings, "deploy.yaml": Spec}
_MARKER = re.compile(r"<!--\s*reference:\s*(\S+)\s*-->")


class Field(msgspec.Struct, frozen=True):
    """One field of a section, as the reference shows it."""

    name: str
    type: str
    default: str
    doc: str


class Section(msgspec.Struct, frozen=True):
    """One table of the reference: a struct and where it sits in the file."""

    path: str
    doc: str
    fields: tuple[Field, ...]


def field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a class's annotated fields, by field name."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        value = after.value if isinstance(after, ast.Expr) else None
        text = value.value if isinstance(value, ast.Constant) else None
        if isinstance(text, str):
            docs[node.target.id] = inspect.cleandoc(text)
    return docs


def _markdown(text: str) -> str:
    """One paragraph of Markdown from a docstring written with reStructuredText literals."""
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def _type_name(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        return " \\| ".join(_type_name(member) for member in t.types)
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(f"`{value}`" for value in t.values)
    if isinstance(t, mi.StructType):
        tag = t.cls.__struct_config__.tag
        return "section" if tag is None else f"`{tag}`"
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return f"list of {_type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"map of {_type_name(t.key_type)} to {_type_name(t.value_type)}"
    names = {
        mi.StrType: "string", mi.IntType: "integer", mi.FloatType: "number",
        mi.BoolType: "boolean", mi.NoneType: "null", mi.AnyType: "any",
    }  # fmt: skip
    return names.get(type(t), type(t).__name__)


def _default(field: mi.Field) -> str:
    if field.required:
        return "required"
    value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    if isinstance(value, msgspec.Struct):
        return ""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and isinstance(value[0], msgspec.Struct):
        return ""
    return f"`{msgspec.json.encode(value).decode()}`"


def _structs(t: mi.Type) -> Iterator[tuple[mi.StructType, bool]]:
    """The sections a field's type holds, each with whether it comes in a list."""
    if isinstance(t, mi.StructType):
        yield t, False
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _structs(member)
    elif isinstance(t, mi.VarTupleType | mi.ListType):
        for struct, _ in _structs(t.item_type):
            yield struct, True


def sections(root: type[msgspec.Struct]) -> list[Section]:
    """Every section of a configuration file, the root first, in the order fields appear."""
    found: list[Section] = []

    def visit(struct: mi.StructType, path: str) -> None:
        docs = field_docs(struct.cls)
        fields = tuple(
            Field(f.encode_name, _type_name(f.type), _default(f), docs.get(f.name, ""))
            for f in struct.fields
        )
        found.append(Section(path, inspect.cleandoc(struct.cls.__doc__ or ""), fields))
        for f in struct.fields:
            for child, listed in _structs(f.type):
                name = f"{path}.{f.encode_name}" if path else f.encode_name
                name += "[]" if listed else ""
                tag = child.cls.__struct_config__.tag
                if tag is not None:
                    name += f" ({child.cls.__struct_config__.tag_field}: {tag})"
                visit(child, name)

    root_type = mi.type_info(root)
    assert isinstance(root_type, mi.StructType)
    visit(root_type, "")
    return found


def undocumented(root: type[msgspec.Struct]) -> list[str]:
    """Fields, by their place in the file, that have no docstring."""
    return [
        f"{section.path}.{field.name}" if section.path else field.name
        for section in sections(root)
        for field in section.fields
        if not field.doc
    ]


def render(root: type[msgspec.Struct]) -> str:
    """The reference of one configuration file as Markdown: a table per section."""
    missing = undocumented(root)
    if missing:
        raise ValueError(f"{root.__name__}: fields without a docstring: {', '.join(missing)}")
    parts: list[str] = []
    for section in sections(root):
        title = f"### `{section.path}`" if section.path else "### top level"
        parts += [title, "", _markdown(section.doc), ""]
        parts += ["| field | type | default | what it does |", "|---|---|---|---|"]
        parts += [
            f"| `{f.name}` | {f.type} | {f.default} | {_markdown(f.doc)} |" for f in section.fields
        ]
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: replace each reference marker by the generated tables."""

    def table(match: re.Match[str]) -> str:
        return render(ROOTS[match.group(1)])

    return _MARKER.sub(table, markdown)
