"""docker-compose.yaml: valid for docker-compose, the Railyard stack is all there, and it is the stack
the distributed tests run (tests/support/distributed.py): the same settings that matter.

`docker-compose -f docker-compose.yaml config` validates the file without a Docker engine and
prints it resolved (anchors merged, variables at their defaults, RAILYARD_FLEET_TOKEN as given);
the assertions read that output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
IMAGE = "apache/airflow:3.3.2"
AIRFLOW_SERVICES = [
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-worker",
    "airflow-triggerer",
    "airflow-init",
    "airflow-cli",
    "flower",
]
REQUIRED = {"postgres", "redis", "railyard-sim", *AIRFLOW_SERVICES}
MOUNTS = {
    "dags": "/opt/airflow/dags",
    "plugins": "/opt/airflow/plugins",
    "include": "/opt/airflow/include",
    "logs": "/opt/airflow/logs",
}
SIM_CONFIG = "/opt/airflow/include/config/railyard.yaml"
TOKEN = "0123abcd" * 8  # what `openssl rand -hex 32` gives, as the header of the file says
# Settings of docker-compose.yaml that the one-machine stack has no use for, each with its reason.
COMPOSE_ONLY = {
    "AIRFLOW_CONFIG": "one airflow.cfg written by airflow-init and mounted into every container",
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "the scheduler's :8974/health, for the container healthcheck",
    "_PIP_ADDITIONAL_REQUIREMENTS": "the image's entrypoint (quick checks only)",
    "_AIRFLOW_DB_MIGRATE": "the image's entrypoint (airflow-init)",
    "_AIRFLOW_WWW_USER_CREATE": "the image's entrypoint (airflow-init)",
    "_AIRFLOW_WWW_USER_USERNAME": "the image's entrypoint (airflow-init)",
    "_AIRFLOW_WWW_USER_PASSWORD": "the image's entrypoint (airflow-init)",
    "DUMB_INIT_SETSID": "the image's init, for the worker's warm shutdown",
    "CONNECTION_CHECK_MAX_COUNT": "the image's entrypoint (airflow-cli)",
}


def compose_config(path: Path = COMPOSE, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed (apt-get install docker-compose); it validates the file")
    # Resolve with the file's own defaults, not whatever the caller's shell exports.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "_AIRFLOW", "_PIP", "COMPOSE_", "RAILYARD_"))}
    if token is not None:
        env["RAILYARD_FLEET_TOKEN"] = token
    return subprocess.run(
        [exe, "-f", str(path), "config"], cwd=path.parent, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def resolved() -> dict:
    proc = compose_config()
    if proc.returncode != 0:
        pytest.fail(f"docker-compose rejected {COMPOSE.name} (rc={proc.returncode}):\n{proc.stderr}\n{proc.stdout}")
    return yaml.safe_load(proc.stdout)


def mounts(service: dict) -> dict[str, str]:
    """container path -> source (host path or volume name), for short and long volume syntax."""
    out: dict[str, str] = {}
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = v["source"]
        else:
            parts = v.split(":")
            out[parts[1]] = parts[0]
    return out


def env(service: dict) -> dict[str, str]:
    e = service.get("environment", {})
    if isinstance(e, list):
        e = dict(item.split("=", 1) for item in e)
    return {k: "" if v is None else str(v) for k, v in e.items()}


def command_text(service: dict) -> str:
    cmd = service.get("command", "")
    return cmd if isinstance(cmd, str) else "\n".join(cmd)


def test_rejects_a_broken_file(tmp_path):
    """The validator really validates: an unknown service key is refused."""
    bad = tmp_path / "docker-compose.yaml"
    bad.write_text("services:\n  x:\n    image: busybox\n    no_such_option: 1\n")
    proc = compose_config(bad)
    assert proc.returncode != 0
    assert "no_such_option" in proc.stderr


def test_services_present(resolved):
    missing = REQUIRED - set(resolved["services"])
    assert not missing, f"services missing: {sorted(missing)}"
    assert resolved["services"]["airflow-cli"]["profiles"] == ["debug"]
    assert resolved["services"]["flower"]["profiles"] == ["flower"]


def test_image_tag(resolved):
    for name in [*AIRFLOW_SERVICES, "railyard-sim"]:
        assert resolved["services"][name]["image"] == IMAGE, name


def test_airflow_services_mount_the_project(resolved):
    for name in AIRFLOW_SERVICES:
        m = mounts(resolved["services"][name])
        for folder, target in MOUNTS.items():
            assert target in m, f"{name} does not mount ./{folder} at {target}"
            assert Path(m[target]) == ROOT / folder, f"{name}: {target} comes from {m[target]}"


def test_airflow_common_settings(resolved):
    for name in AIRFLOW_SERVICES:
        svc = resolved["services"][name]
        e = env(svc)
        assert e["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert e["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert "@postgres/airflow" in e["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
        assert e["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://"), name
        assert e["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/", name
        assert e["AIRFLOW__CORE__AUTH_MANAGER"], name
        assert e["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false", name
        assert e["PYTHONPATH"].split(":") == ["/opt/airflow/include", "/opt/airflow/plugins"], name
        assert e["RAILYARD_CONFIG"] == SIM_CONFIG, name
        if name != "airflow-init":  # init runs as root to fix ownership, as upstream's does
            assert svc["user"] == "50000:0", name
    assert (ROOT / "include" / "config" / "railyard.yaml").is_file()


def test_fleet_connection_points_at_the_simulator(resolved):
    for name in AIRFLOW_SERVICES:
        conn = json.loads(env(resolved["services"][name])["AIRFLOW_CONN_RAILYARD_FLEET"])
        assert conn == {"conn_type": "http", "host": "railyard-sim", "port": 8765, "schema": "http",
                        "password": TOKEN, "extra": {"auth": "bearer"}}, name


def test_no_token_no_stack():
    """RAILYARD_FLEET_TOKEN has no default: without it the file does not resolve, and nothing starts."""
    proc = compose_config(token=None)
    assert proc.returncode != 0
    assert "RAILYARD_FLEET_TOKEN" in proc.stderr


def test_same_settings_as_the_distributed_stack(resolved):
    """Every Airflow service of the file has the settings that matter that DistributedStack sets
    (tests/support/distributed.py: executor, databases, broker, result backend, ledger, scheduling speed,
    failover timing, fleet connection), and no other, except the container plumbing in COMPOSE_ONLY."""
    from tests.support.distributed import TEST_ONLY, reference_settings, settings_that_matter

    want = reference_settings()
    for name in AIRFLOW_SERVICES:
        e = {k: v for k, v in env(resolved["services"][name]).items() if k not in COMPOSE_ONLY}
        got = settings_that_matter(e, fleet_token=TOKEN)
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        differ = {k: (got[k], want[k]) for k in set(got) & set(want) if got[k] != want[k]}
        assert not (missing or extra or differ), (
            f"{name}: docker-compose.yaml and DistributedStack differ: missing {missing}, only in the file "
            f"{extra}, different (file, stack) {differ}")
    # what the stack sets for itself alone is explained (tests/support/distributed.py TEST_ONLY)
    assert all(TEST_ONLY.values())


def test_simulator_needs_the_token_and_is_not_published(resolved):
    svc = resolved["services"]["railyard-sim"]
    assert env(svc)["RAILYARD_FLEET_TOKEN"] == TOKEN  # the same token the connection sends
    assert not svc.get("ports"), f"railyard-sim publishes {svc.get('ports')}: its admin endpoints must not be"
    # nothing on the host's every address but the Airflow UI/API (which has its own login)
    for name, s in resolved["services"].items():
        for p in s.get("ports", []):
            published = p if isinstance(p, str) else f"{p.get('host_ip', '')}:{p.get('published')}"
            assert name == "airflow-apiserver" or published.startswith("127.0.0.1:"), (name, p)


def test_ledger_on_the_same_postgres(resolved):
    urls = {env(resolved["services"][n])["RAILYARD_LEDGER_URL"] for n in AIRFLOW_SERVICES}
    assert urls == {"postgresql+psycopg2://airflow:airflow@postgres/railyard"}
    init = command_text(resolved["services"]["airflow-init"])
    assert "CREATE DATABASE railyard" in init
    assert "datname = 'railyard'" in init  # only if missing: init runs on every `up`


def test_init_creates_the_pool_and_migrates(resolved):
    svc = resolved["services"]["airflow-init"]
    init = command_text(svc)
    assert 'airflow pools set railyard_disruptive 1 "' in init
    assert env(svc)["_AIRFLOW_DB_MIGRATE"] == "true"
    assert "set -e" in init  # a failed pool or database creation fails init, and nothing starts


def test_healthchecks(resolved):
    svcs = resolved["services"]
    for name in ["postgres", "redis", "railyard-sim", "airflow-apiserver", "airflow-scheduler",
                 "airflow-dag-processor", "airflow-worker", "airflow-triggerer", "flower"]:
        assert svcs[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-worker",
                 "airflow-triggerer"]:
        deps = svcs[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name


def test_simulator_service(resolved):
    svc = resolved["services"]["railyard-sim"]
    cmd = svc["command"]
    assert isinstance(cmd, list)
    assert cmd[:3] == ["python", "-m", "railyard.sim"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--config": SIM_CONFIG,
        "--db": "/opt/airflow/railyard/sim.db",
        "--host": "0.0.0.0",
        "--port": "8765",
    }
    health = " ".join(svc["healthcheck"]["test"])
    assert "http://localhost:8765/healthz" in health  # the one path open without the token
    m = mounts(svc)
    assert Path(m["/opt/airflow/include"]) == ROOT / "include"
    state = m["/opt/airflow/railyard"]
    assert not state.startswith("/"), "the simulator's state must be a named volume"
    assert state in resolved["volumes"]
    assert env(svc)["PYTHONPATH"].startswith("/opt/airflow/include")
    # Tasks and deferred sensors call the simulator: they start once it answers.
    for name in ("airflow-worker", "airflow-triggerer"):
        assert resolved["services"][name]["depends_on"]["railyard-sim"]["condition"] == "service_healthy"
    # airflow-init hands the state volume to the services' user.
    assert mounts(resolved["services"]["airflow-init"])["/opt/airflow/railyard"] == state
