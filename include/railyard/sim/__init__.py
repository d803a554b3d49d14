"""The fleet simulator: `SimEngine` (the in-process fleet), `create_app` / `serve` (its HTTP service),
`resolve_token` (the optional bearer token its API then requires: RAILYARD_FLEET_TOKEN or a token file).

`create_app`, `serve` and `resolve_token` load lazily, so unit tests that only need the engine do not import FastAPI.
"""

from __future__ import annotations

from typing import Any

from railyard.sim.engine import SimEngine


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve", "resolve_token"):
        from railyard.sim import app

        return getattr(app, name)
    raise AttributeError(f"module 'railyard.sim' has no attribute {name!r}")


__all__ = ["SimEngine", "create_app", "resolve_token", "serve"]
