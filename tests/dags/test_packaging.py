"""The plugin is registered once, by the installed distribution's entry point or by the plugins folder, never
both; the provider metadata is what Airflow's providers manager accepts; the public DAG builders build every DAG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from railyard.devstack.stack import ROOT

# run in a fresh interpreter: Airflow's plugins manager caches what it loaded for the process
PROBE = """
import json, sys
if sys.argv[1] == "hide-entry-point":  # as where the distribution is not installed (an Astro-style deployment)
    import importlib.metadata as md
    import airflow._shared.module_loading as ml
    real_eps, real_with = md.entry_points, ml.entry_points_with_dist
    def eps(**kw):
        return [e for e in real_eps(**kw) if not e.value.startswith("railyard_airflow")]
    md.entry_points = eps
    ml.entry_points_with_dist = lambda group: [(e, d) for e, d in real_with(group)
                                                if not e.value.startswith("railyard_airflow")]
    import railyard_airflow.plugin
    railyard_airflow.plugin.entry_points = eps
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"plugins": [[p.name, str(p.source)] for p in plugins], "errors": errors}))
"""


def loaded(tmp_path: Path, mode: str) -> dict:
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__LAZY_LOAD_PROVIDERS="False")
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode, source", [("installed", "EntryPoint(name='railyard'"),
                                          ("hide-entry-point", "railyard_plugin.py")])
def test_the_plugin_is_registered_once_by_the_package_or_by_the_folder(tmp_path: Path, mode: str, source: str) -> None:
    got = loaded(tmp_path, mode)
    assert [name for name, _src in got["plugins"]] == ["railyard"], got
    assert source in got["plugins"][0][1], got
    assert got["errors"] == {}, got  # no "already registered" import error, no stray module of the package


def test_the_provider_info_is_valid_for_airflows_providers_manager() -> None:
    import airflow
    import jsonschema

    from railyard_airflow.provider_info import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "railyard" and "plugins" not in info  # the entry point alone registers it
    for group in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[group]:
            for mod in entry["python-modules"]:
                __import__(mod)  # every module it names imports


def test_the_public_builders_build_every_dag_of_a_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import railyard_airflow as ra

    monkeypatch.delenv("RAILYARD_CONFIG", raising=False)
    cfg = ROOT / "include" / "config" / "railyard.yaml"
    every = ra.railyard_dags(cfg)
    trains = ra.train_dags(cfg)
    singles = {**ra.emergency_dags(cfg), **ra.release_dags(cfg), **ra.repair_dags(cfg), **ra.reconcile_dags(cfg),
               **ra.outside_dags(cfg)}
    assert set(singles) == {"railyard_emergency", "railyard_releases", "railyard_repairs", "railyard_reconcile",
                            "railyard_outside"}
    assert trains and all(d.startswith("railyard_train_") for d in trains)
    assert set(every) == set(trains) | set(singles)


def test_an_installed_package_without_a_config_refuses_to_build(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    from railyard.domain import config as config_mod
    from railyard.domain.config import ConfigError
    from railyard_airflow import railyard_dags

    monkeypatch.delenv("RAILYARD_CONFIG", raising=False)
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", tmp_path / "absent" / "railyard.yaml")
    with pytest.raises(ConfigError, match="no config was named: pass its path .* or set RAILYARD_CONFIG"):
        railyard_dags()
