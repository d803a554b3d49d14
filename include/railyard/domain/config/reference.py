"""The config file's field reference in Markdown, from the models themselves (`railyard schema --markdown`):
one table per section, every field with its type, default and description, so the docs cannot drift."""

from __future__ import annotations

import enum
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (X, list[X], dict[str, X], X | None, Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", re.sub(r"typing\.", "", str(annotation)))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(its section's defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def reference(root: type[BaseModel]) -> str:
    """Markdown: one section per model reached from `root`, in the order first reached, its fields in order."""
    seen: dict[type[BaseModel], str] = {root: "(top level)"}
    order: list[type[BaseModel]] = [root]
    i = 0
    while i < len(order):
        model = order[i]
        for name, field in model.model_fields.items():
            for sub in _models_in(field.annotation):
                if sub not in seen:
                    seen[sub] = f"{seen[model]}.{name}".removeprefix("(top level).")
                    order.append(sub)
        i += 1
    lines: list[str] = []
    for model in order:
        lines += [f"### `{seen[model]}` ({model.__name__})", ""]
        doc = (model.__doc__ or "").strip()
        if doc and model is not root:
            lines += [_cell(doc), ""]
        lines += ["| field | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            lines.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | {_cell(_default(field))} | "
                         f"{_cell(field.description or '')} |")
        lines.append("")
    return "\n".join(lines)
