"""HttpFleet against a real simulator server (uvicorn in a subprocess)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
import requests

from railyard.fleet import FleetNotFound
from railyard.fleet.http import HttpFleet
from railyard.fleet.port import Fleet, FleetError
from railyard.models import Host, HostState, Step

from .conftest import SimServer

TARGETS = {"gpu-driver": "570.86.15", "gpu-firmware": "96.00.a5.00.01", "kernel": "6.1.0-28"}
POD_B = ["gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04"]


def wait_for(what: str, probe: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a live server (the adapter tier is real time; unit tests never sleep)."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


def all_in(fleet: HttpFleet, hosts: list[str], state: HostState) -> Callable[[], bool]:
    return lambda: all(h.state == state for h in fleet.hosts(hosts))


def test_a_full_stop_on_one_domain(sim_server: SimServer) -> None:
    fleet = HttpFleet(sim_server.url)
    assert isinstance(fleet, Fleet)
    op = "op-stop-b"
    jobs = fleet.jobs(POD_B)
    assert jobs and all(j.state == "running" for j in jobs)
    at = fleet.request_checkpoint([j.id for j in jobs])
    wait_for("checkpoint", lambda: all(j.last_checkpoint >= at for j in fleet.jobs(POD_B)))

    fleet.drain(POD_B, op)
    fleet.drain(POD_B, op)  # a retried task: no-op
    wait_for("drain", all_in(fleet, POD_B, HostState.DRAINED))
    assert fleet.capacity().domains_out == ["pod-b"]
    assert fleet.jobs(POD_B) == []  # the jobs moved off

    steps = [Step(component=c, version=v) for c, v in TARGETS.items()]
    for h in POD_B:
        fleet.upgrade(h, steps, op)
        fleet.upgrade(h, steps, op)  # re-attach, no second install
    wait_for("upgrade", all_in(fleet, POD_B, HostState.DRAINED))
    assert all(h.versions == TARGETS and h.last_error is None for h in fleet.hosts(POD_B))

    for h in POD_B:
        assert fleet.start_check(h, TARGETS, op).host == h
    wait_for("check", lambda: {r.status for r in fleet.check_results(POD_B, op)} == {"passed"})

    fleet.return_to_service(POD_B, op)
    wait_for("return", all_in(fleet, POD_B, HostState.SERVING))
    hosts = fleet.hosts(POD_B)
    assert all(h.versions == TARGETS and h.operation is None for h in hosts)
    cap = fleet.capacity()
    assert cap.serving_hosts == cap.total_hosts == 12 and cap.domains_out == []

    audit = fleet.audit()
    assert audit["unverified_returns"] == []
    assert audit["max_domains_out"] == 1
    assert audit["max_lost_s"] < 120  # fresh checkpoints: at most the few fleet seconds between calls
    assert sorted((i["host"], i["component"], i["count"]) for i in audit["installs"]) == sorted(
        (h, c, 1) for h in POD_B for c in TARGETS
    )
    [stop] = audit["stops"]
    assert (stop["op"], stop["domain"], stop["complete"]) == (op, "pod-b", True)
    assert stop["work_s"] >= 30 + (60 + 60 + 30 + 60) + 60 + 30
    assert audit["work_seconds"] == pytest.approx(stop["work_s"] / 600)
    samples = fleet.samples()
    assert samples and max(len(s["domains_out"]) for s in samples) == 1


def test_refusals_come_back_as_fleet_errors(shared_sim_server: SimServer) -> None:
    sim_server = shared_sim_server
    fleet = HttpFleet(sim_server.url)
    with pytest.raises(FleetNotFound, match="gpu-zz99"):
        fleet.hosts(["gpu-a01", "gpu-zz99"])
    with pytest.raises(FleetError, match="gpu-zz99"):
        fleet.drain(["gpu-zz99"], "op-1")
    fleet.drain(["gpu-a01"], "op-1")
    with pytest.raises(FleetError, match="gpu-a01 is draining, held by operation 'op-1'"):
        fleet.drain(["gpu-a01"], "op-2")
    r = requests.post(f"{sim_server.url}/v1/hosts/drain", json={"hosts": ["gpu-a01"], "op": "op-2"}, timeout=5)
    assert r.status_code == 409 and "op-1" in r.json()["detail"]
    r = requests.get(f"{sim_server.url}/v1/hosts", params={"names": "gpu-zz99"}, timeout=5)
    assert r.status_code == 404 and "gpu-zz99" in r.json()["detail"]
    wait_for("drain", all_in(fleet, ["gpu-a01"], HostState.DRAINED))  # leave the shared server settled


BAD_NAMES = ["gpu a01", "gpu-a01;reboot", "$(reboot)", "-rf", "../gpu-a01", "x" * 64]


def test_bad_host_names_are_refused_with_422(shared_sim_server: SimServer) -> None:
    url = shared_sim_server.url
    fleet = HttpFleet(url)
    before = fleet.hosts()
    for bad in BAD_NAMES:
        with pytest.raises(FleetError, match="invalid request") as err:
            fleet.drain([bad], "op-1")
        assert bad in str(err.value)
        r = requests.post(f"{url}/v1/hosts/drain", json={"hosts": [bad], "op": "op-1"}, timeout=5)
        assert r.status_code == 422, bad
        r = requests.get(f"{url}/v1/hosts", params={"names": bad}, timeout=5)
        assert r.status_code == 422, bad
        if "/" not in bad:
            with pytest.raises(FleetError, match="invalid request"):
                fleet.offboard(bad, "x", "op-1")
    assert fleet.hosts() == before  # nothing was touched


def test_bad_bodies_and_versions_are_refused(shared_sim_server: SimServer) -> None:
    url = shared_sim_server.url
    assert requests.post(f"{url}/v1/hosts/drain", json={"hosts": ["gpu-a01"]}, timeout=5).status_code == 422
    assert requests.post(f"{url}/v1/hosts/drain", json={"hosts": [], "op": "o"}, timeout=5).status_code == 422
    body = {"steps": [{"component": "gpu-driver", "version": "570; rm -rf /"}], "op": "op-1"}
    assert requests.post(f"{url}/v1/hosts/gpu-a01/upgrade", json=body, timeout=5).status_code == 422
    body = {"expected": {"gpu-driver": "`id`"}, "op": "op-1"}
    assert requests.post(f"{url}/v1/hosts/gpu-a01/check", json=body, timeout=5).status_code == 422
    assert requests.patch(f"{url}/v1/settings", json={"upgrade_fail_rate": 2}, timeout=5).status_code == 422
    assert HttpFleet(url).settings(check_fail_rate=0.5)["check_fail_rate"] == 0.5


def test_openapi_lists_the_paths(shared_sim_server: SimServer) -> None:
    doc = requests.get(f"{shared_sim_server.url}/openapi.json", timeout=5).json()
    assert doc["info"]["title"] == "Railyard fleet simulator" and doc["info"]["description"]
    expected = {
        "/v1/now",
        "/v1/hosts",
        "/v1/jobs",
        "/v1/jobs/checkpoint",
        "/v1/hosts/drain",
        "/v1/hosts/{host}/upgrade",
        "/v1/hosts/{host}/check",
        "/v1/checks",
        "/v1/hosts/return",
        "/v1/hosts/{host}/offboard",
        "/v1/capacity",
        "/v1/audit",
        "/v1/audit/samples",
        "/v1/settings",
        "/healthz",
    }
    assert expected <= set(doc["paths"])
    assert "patch" in doc["paths"]["/v1/settings"]
    assert all(op.get("summary") for path in doc["paths"].values() for op in path.values())


def test_state_survives_sigkill_and_restart_and_sigterm_stops_cleanly(sim_server: SimServer) -> None:
    fleet = HttpFleet(sim_server.url)
    fleet.drain(["gpu-c01"], "op-1")
    wait_for("drain", all_in(fleet, ["gpu-c01"], HostState.DRAINED))
    fleet.upgrade("gpu-c01", [Step(component="kernel", version="6.1.0-28")], "op-1")
    wait_for("upgrade", lambda: fleet.hosts(["gpu-c01"])[0].versions["kernel"] == "6.1.0-28")
    before: Host = fleet.hosts(["gpu-c01"])[0]
    now_before = fleet.now()

    sim_server.kill()
    with pytest.raises(FleetError):
        HttpFleet(sim_server.url, retries=0, connect_timeout=1).now()
    time.sleep(0.5)  # ~300 fleet seconds of downtime that must not show on the fleet clock
    fleet = HttpFleet(sim_server.start())

    after = fleet.hosts(["gpu-c01"])[0]
    assert after == before  # same versions, still drained and held by op-1
    assert now_before <= fleet.now() < now_before + 300
    installs = [i for i in fleet.audit()["installs"] if i["host"] == "gpu-c01"]
    assert [(i["component"], i["count"]) for i in installs] == [("kernel", 1)]
    fleet.return_to_service(["gpu-c01"], "op-1")
    wait_for("return", all_in(fleet, ["gpu-c01"], HostState.SERVING))
    assert fleet.audit()["unverified_returns"] == ["gpu-c01"]  # returned with no check: counted

    assert fleet.healthy()
    assert sim_server.stop() == 0  # SIGTERM: a clean exit
    assert not fleet.healthy()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_fleet_is_a_fleet_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(FleetError, match=url.replace(".", r"\.")):
        HttpFleet(url, connect_timeout=1.0).capacity()
    assert time.monotonic() - started < 5
