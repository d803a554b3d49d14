"""`railyard schema`: the JSON Schema an editor validates railyard.yaml with accepts what the models accept and
refuses what they refuse."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from railyard.cli import config_schema
from railyard.domain.config import ConfigError, parse_config
from tests.support.configs import small_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = yaml.safe_load((ROOT / "include" / "config" / "railyard.yaml").read_text())


def test_the_command_prints_a_2020_12_schema_of_the_config() -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "railyard"), "schema"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "Railyard config (railyard.yaml)"
    assert {"domains", "trains", "releases", "buffers", "fleet"} <= set(schema["properties"])
    jsonschema.Draft202012Validator.check_schema(schema)


TWO_TRAINS = small_config(trains=[{"id": "a", "releases": ["driver-570"]}, {"id": "b", "releases": ["kernel-6-1-28"]}])
LISTED = DEMO | {"domains": [{"name": "pod-x", "hosts": ["gpu-x01", "gpu-x[02-08]"]}, *DEMO["domains"][1:]]}


@pytest.mark.parametrize("name, data", [("demo", DEMO), ("small", small_config()), ("two trains", TWO_TRAINS),
                                        ("hosts as a list", LISTED)])
def test_the_schema_accepts_what_the_models_accept(name: str, data: dict) -> None:
    parse_config(copy.deepcopy(data))
    jsonschema.validate(data, config_schema())


@pytest.mark.parametrize("change", ["unknown top-level key", "wrong type", "missing trains"])
def test_the_schema_refuses_what_the_models_refuse(change: str) -> None:
    data = copy.deepcopy(DEMO)
    if change == "unknown top-level key":
        data["bufers"] = {}
    elif change == "wrong type":
        data["timeouts"]["poll_s"] = "often"
    else:
        del data["trains"]
    with pytest.raises(ConfigError):
        parse_config(copy.deepcopy(data))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, config_schema())
