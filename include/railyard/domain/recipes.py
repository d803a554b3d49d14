"""Command templates for component recipes: a closed set of variables, every value a plain token.

A recipe such as `apt-get install -y nvidia-driver={version}` is checked when the config loads
(unknown variables, format tricks and control characters are refused with the field and value),
and rendered only from values that pass `check_token`, each one `shlex.quote`d. No command is
ever built from an unchecked string.
"""

from __future__ import annotations

import shlex
import string
from typing import Annotated

from pydantic import AfterValidator

from railyard.domain.models import check_token

VARIABLES = frozenset({"version", "host", "component", "sku", "gpus"})
MAX_TEMPLATE = 1000


def template_fields(text: str) -> list[str]:
    """The variables a template uses; refuses anything but plain `{name}` fields."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a command template must be a non-empty string")
    if len(text) > MAX_TEMPLATE:
        raise ValueError(f"a command template is at most {MAX_TEMPLATE} characters")
    bad = sorted({repr(ch) for ch in text if ord(ch) < 32 or ord(ch) == 127})
    if bad:
        raise ValueError(f"control characters are not allowed in a command template ({', '.join(bad)})")
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"not a valid template: {exc}") from None
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if spec or conversion:
            raise ValueError(f"template field {{{field}}} may not carry a format spec or conversion")
        if field not in VARIABLES:
            raise ValueError(f"unknown template variable {{{field}}}; known: {', '.join(sorted(VARIABLES))}")
        names.append(field)
    return names


def check_template(text: str) -> str:
    template_fields(text)
    return text


CommandTemplate = Annotated[str, AfterValidator(check_template)]


def render(template: str, **values: object) -> str:
    """The command with every variable a checked plain token, shell-quoted."""
    used = template_fields(template)
    quoted: dict[str, str] = {}
    for name in set(used):
        if name not in values or values[name] is None:
            raise ValueError(f"template variable {{{name}}} has no value")
        quoted[name] = shlex.quote(check_token(str(values[name])))
    return template.format(**quoted)


__all__ = ["VARIABLES", "CommandTemplate", "check_template", "render", "template_fields"]
