"""Railyard as a user installs it: the wheel, built from this checkout, installed into a new virtualenv with the
pinned Airflow (no checkout on the path), under `airflow standalone` with an empty plugins folder and a dags
folder that holds only the two-line DAG file; a train runs on `railyard sim serve` and the Railyard page answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import requests

from railyard.devstack.stack import ROOT, Stack, _wait, free_port
from tests.support.configs import small_config, write_config

pytestmark = pytest.mark.e2e

DAG_FILE = """from railyard_airflow import railyard_dags
globals().update(railyard_dags({path!r}))
"""
RAILYARD_DAGS = {"railyard_train_demo", "railyard_emergency", "railyard_releases", "railyard_repairs",
                 "railyard_reconcile", "railyard_outside"}


def sh(*cmd: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def build_wheel(out: Path) -> Path:
    sh("uv", "build", "--quiet", "--wheel", "--out-dir", out, ROOT, cwd=ROOT)
    (wheel,) = out.glob("railyard-*.whl")
    return wheel


def test_the_wheel_holds_both_packages_the_page_and_the_entry_points(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(ep).decode()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    for f in ("railyard/cli.py", "railyard/py.typed", "railyard/sim/app.py", "railyard_airflow/plugin.py",
              "railyard_airflow/provider_info.py", "railyard_airflow/ui/static/index.html"):
        assert f in names, f
    assert not [n for n in names if n.startswith(("tests/", "dags/", "bench/", "include/"))]
    assert "[airflow.plugins]\nrailyard = railyard_airflow.plugin:RailyardPlugin" in entry_points
    assert "[apache_airflow_provider]\nprovider_info = railyard_airflow.provider_info:get_provider_info" in entry_points
    assert "Requires-Dist: apache-airflow<3.4,>=3.2.0" in metadata
    assert 'Provides-Extra: postgres' in metadata


def test_a_user_installs_the_wheel_into_their_airflow_and_runs_a_train(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    sh("uv", "venv", "--quiet", "-p", "3.11", venv)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAILYARD_CONFIG")}
    # the pinned Airflow is the constraint, as Airflow's constraints file is for a user; `make test-compat` names
    # another Airflow and the day after its release (RAILYARD_AIRFLOW_VERSION=3.2.0@2026-04-08): the rest is
    # resolved from what was published by then, which is what that release's constraints file holds
    compat, _, day = os.environ.get("RAILYARD_AIRFLOW_VERSION", "").partition("@")
    pins = ([f"apache-airflow=={compat}", *(["--exclude-newer", day] if day else [])] if compat
            else ["-c", ROOT / "requirements.txt"])
    sh("uv", "pip", "install", "--quiet", "--compile-bytecode", *pins,
       f"railyard[postgres] @ {wheel.as_uri()}", env=env | {"VIRTUAL_ENV": str(venv)})
    bin_dir = venv / "bin"
    probe = ("import json, railyard, railyard_airflow, airflow; "
             "print(json.dumps([railyard.__file__, railyard_airflow.__file__, airflow.__version__]))")
    where = json.loads(sh(bin_dir / "python", "-c", probe, env=env, cwd=tmp_path))
    assert all(Path(f).is_relative_to(venv) for f in where[:2]), where  # the installed copy, not the checkout
    assert where[2] == (compat or "3.3.2")

    opt = tmp_path / "opt"
    opt.mkdir()
    cfg = write_config(opt / "railyard.yaml", small_config(domains=2, hosts_per_domain=2))
    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    dags.mkdir()
    plugins.mkdir()
    (dags / "railyard.py").write_text(DAG_FILE.format(path=str(cfg)))
    stack = Stack(home=tmp_path / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port(),
                  bin_dir=bin_dir, dags_folder=dags, plugins_folder=plugins, checkout_on_path=False)
    try:
        stack.start_sim()
        stack.start_airflow()
        airflow_env = stack.env()
        assert "PYTHONPATH" not in airflow_env
        registered = json.loads(sh(bin_dir / "airflow", "plugins", "--output", "json", env=airflow_env, cwd=tmp_path))
        assert [p["name"] for p in registered] == ["railyard"]
        assert "EntryPoint(name='railyard'" in registered[0]["source"]
        providers = json.loads(sh(bin_dir / "airflow", "providers", "list", "--output", "json", env=airflow_env,
                                  cwd=tmp_path))
        assert [p for p in providers if p["package_name"] == "railyard"], providers
        # the one Airflow object Railyard's DAGs need and do not create: the pool every disruptive task runs in
        sh(bin_dir / "airflow", "pools", "set", stack.config.pool, str(stack.config.max_domains_down),
           "Railyard: every disruptive task", env=airflow_env, cwd=tmp_path)
        errors = stack.rest("GET", "/importErrors")
        assert errors["total_entries"] == 0, errors

        _wait("the six Railyard DAGs", 120, lambda: all(stack.dag_present(d) for d in RAILYARD_DAGS) or None)
        run_id = stack.trigger("railyard_train_demo")
        assert stack.wait_run("railyard_train_demo", run_id, timeout=300) == "success"
        cfg_model = stack.config
        target = {c.component: c.version for c in cfg_model.releases}
        hosts = stack.fleet().hosts()
        assert hosts and all(h.state == "serving" and all(h.versions.get(c) == v for c, v in target.items())
                             for h in hosts), [(h.name, h.state, h.versions) for h in hosts]

        h = {"Authorization": f"Bearer {stack.token()}"}
        page = requests.get(f"{stack.api}/railyard/", headers=h, timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
        overview = requests.get(f"{stack.api}/railyard/api/overview", headers=h, timeout=30)
        assert overview.status_code == 200, overview.text
        trains = {t["id"]: t for t in requests.get(f"{stack.api}/railyard/api/trains", headers=h, timeout=30).json()}
        assert [d["last_visit"] is not None for d in trains["demo"]["domains"]] == [True, True], trains
    finally:
        stack.stop()
