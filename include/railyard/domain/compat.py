"""Versions and compatibility rules between components: pure functions, no I/O.

Versions compare as dotted numbers (`570.86.15 < 570.124.6`), part by part; a part that is not a
number sorts after every number and among text parts alphabetically (`96.00.89 < 96.00.a5`), so any
two plain tokens compare, deterministically.

A rule is one line of text, checked against the component names of the config:

    fabric-manager == gpu-driver                       # equals: both installed -> same version
    cuda-compat >= 12.8 requires gpu-driver >= 570     # if the left holds, the right must hold
    kernel >= 6.8 conflicts gpu-driver < 550           # the two never hold together

A condition is `COMPONENT [OP VERSION]` (OP one of == != >= <= > <); a bare component means
"installed". A component a host does not have makes no condition on it hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from railyard.domain.models import check_token

OPS = ("==", "!=", ">=", "<=", ">", "<")
_SPLIT = re.compile(r"[.\-_+]")


def version_key(v: str) -> tuple[Any, ...]:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _SPLIT.split(v))


def compare(a: str, b: str) -> int:
    ka, kb = version_key(a), version_key(b)
    return (ka > kb) - (ka < kb)


def newest(versions: Iterable[str]) -> str | None:
    vs = list(versions)
    return max(vs, key=version_key) if vs else None


def _holds(op: str, a: str, b: str) -> bool:
    c = compare(a, b)
    return {"==": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}[op]


@dataclass(frozen=True)
class Cond:
    component: str
    op: str | None = None
    version: str | None = None

    def holds(self, versions: dict[str, str]) -> bool:
        have = versions.get(self.component)
        if have is None:
            return False
        return self.op is None or _holds(self.op, have, self.version)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.component if self.op is None else f"{self.component} {self.op} {self.version}"


@dataclass(frozen=True)
class Rule:
    kind: str  # equals | requires | conflicts
    left: Cond
    right: Cond
    text: str

    @property
    def components(self) -> tuple[str, str]:
        return self.left.component, self.right.component

    def broken(self, versions: dict[str, str]) -> bool:
        if self.kind == "equals":
            a, b = versions.get(self.left.component), versions.get(self.right.component)
            return a is not None and b is not None and compare(a, b) != 0
        if self.kind == "requires":
            return self.left.holds(versions) and not self.right.holds(versions)
        return self.left.holds(versions) and self.right.holds(versions)  # conflicts


def _cond(text: str, components: set[str]) -> Cond:
    parts = text.split()
    if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] not in OPS):
        raise ValueError(f"{text!r} is not a condition 'COMPONENT [OP VERSION]' with OP one of {' '.join(OPS)}")
    if parts[0] not in components:
        raise ValueError(f"unknown component {parts[0]!r} in {text!r}")
    if len(parts) == 1:
        return Cond(parts[0])
    check_token(parts[2])
    return Cond(parts[0], parts[1], parts[2])


def parse_rule(text: str, components: set[str]) -> Rule:
    """One rule line -> Rule; ValueError says what is wrong with the text."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a rule is a non-empty line of text")
    t = " ".join(text.split())
    for kind in ("requires", "conflicts"):
        if f" {kind} " in f" {t} ":
            left, _, right = t.partition(f" {kind} ")
            if not left or not right:
                raise ValueError(f"{text!r}: '{kind}' needs a condition on each side")
            return Rule(kind, _cond(left, components), _cond(right, components), t)
    parts = t.split()
    if len(parts) == 3 and parts[1] == "==" and parts[2] in components:
        if parts[0] not in components:
            raise ValueError(f"unknown component {parts[0]!r} in {text!r}")
        if parts[0] == parts[2]:
            raise ValueError(f"{text!r}: a component always equals itself")
        return Rule("equals", Cond(parts[0]), Cond(parts[2]), t)
    raise ValueError(f"{text!r} is not a rule: 'A == B' (two components), 'COND requires COND' or "
                     "'COND conflicts COND'")


def apply_order(components: list[str], rules: list[Rule], preferred: list[str]) -> list[str]:
    """Install order for one visit: what a `requires` names first, then `preferred` (the config's
    `compatibility.order`), then the given order. Cycles fall back to the given order."""
    before: dict[str, set[str]] = {c: set() for c in components}
    for r in rules:
        a, b = r.components
        if r.kind == "requires" and a in before and b in before:
            before[a].add(b)
    rank = {c: (preferred.index(c) if c in preferred else len(preferred), i) for i, c in enumerate(components)}
    out: list[str] = []
    left = sorted(components, key=lambda c: rank[c])
    while left:
        ready = [c for c in left if not (before[c] & set(left))]
        nxt = ready[0] if ready else left[0]
        out.append(nxt)
        left.remove(nxt)
    return out
