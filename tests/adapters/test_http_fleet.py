"""HttpFleet against a real simulator server (uvicorn in a subprocess): the fleet API, its bearer token, TLS."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import TypeAdapter

from railyard.domain.models import CheckResult, Host, HostState, Step
from railyard.fleet import FleetNotFound
from railyard.fleet.http import HttpFleet
from railyard.fleet.port import Fleet, FleetError

from .conftest import SIM_CONFIG, SimServer

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
    assert {p["job"] for p in audit["placements"]} == {j.id for j in fleet.jobs()}  # the studies' record, served
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


def test_a_domains_upgrades_and_checks_are_one_request_each_and_a_refusal_spares_the_rest(
        sim_server: SimServer) -> None:
    """The bulk endpoints start every host they can; the one refused (never drained) is named in the error."""
    fleet = HttpFleet(sim_server.url)
    sent: list[str] = []
    request = fleet.session.request
    fleet.session.request = lambda method, url, **kw: sent.append(f"{method} {url.split('/v1')[1]}") or request(
        method, url, **kw)
    pod_c, op = ["gpu-c01", "gpu-c02", "gpu-c03", "gpu-c04"], "op-bulk"
    fleet.drain(pod_c[:3], op)
    wait_for("drain", all_in(fleet, pod_c[:3], HostState.DRAINED))
    steps = [Step(component=c, version=v) for c, v in TARGETS.items()]
    sent.clear()
    with pytest.raises(FleetError, match="gpu-c04"):
        fleet.upgrade_hosts({h: steps for h in pod_c}, op)
    assert sent == ["POST /hosts/upgrade"]
    assert [h.state for h in fleet.hosts(pod_c)] == [HostState.UPGRADING] * 3 + [HostState.SERVING]
    fleet.upgrade_hosts({h: steps for h in pod_c[:3]}, op)  # a retried task re-attaches: no second install
    wait_for("upgrade", all_in(fleet, pod_c[:3], HostState.DRAINED))
    sent.clear()
    with pytest.raises(FleetError, match="gpu-c04"):
        fleet.start_checks({h: TARGETS for h in pod_c}, op)
    assert sent == ["POST /hosts/check"]
    wait_for("check", lambda: [r.status for r in fleet.check_results(pod_c, op)] == ["passed"] * 3)
    installs = {(i["host"], i["component"]): i["count"] for i in fleet.audit()["installs"]}
    assert all(installs[(h, c)] == 1 for h in pod_c[:3] for c in TARGETS)
    assert not any(h == "gpu-c04" for h, _ in installs)
    # a domain's names travel in the body: thousands of them do not fit in a URL
    assert len(fleet.hosts(pod_c * 1500)) == 6000 and len(fleet.check_results(pod_c * 1500, op)) == 4500


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
    # the bulk bodies, validated from their bytes: the same 422, each error at ("body", ...), the bad value named
    body = {"hosts": {"gpu-a01": [{"component": "gpu-driver", "version": "570; rm -rf /"}]}, "op": "op-1"}
    r = requests.post(f"{url}/v1/hosts/upgrade", json=body, timeout=5)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "hosts", "gpu-a01", 0, "version"], r.text
    assert r.json()["detail"][0]["input"] == "570; rm -rf /"
    r = requests.post(f"{url}/v1/hosts/check", json={"hosts": {"gpu-a01": {"gpu-driver": "570"}}}, timeout=5)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "op"], r.text
    junk = "not json " + "x" * 5000
    r = requests.post(f"{url}/v1/hosts/drain", data=junk, headers={"Content-Type": "application/json"}, timeout=5)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid" and "xxxx" not in r.text, r.text
    assert requests.post(f"{url}/v1/hosts/query", json={"names": ["gpu-a01"], "extra": 1}, timeout=5).status_code == 422


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
        "/v1/hosts/upgrade",
        "/v1/hosts/check",
        "/v1/hosts/query",
        "/v1/jobs/query",
        "/v1/checks/query",
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
    restarting = time.monotonic()
    fleet = HttpFleet(sim_server.start())

    after = fleet.hosts(["gpu-c01"])[0]
    assert after == before  # same versions, still drained and held by op-1
    # the clock may run only while the server is up again (startup is slow on a loaded machine)
    up_s = time.monotonic() - restarting
    assert now_before <= fleet.now() < now_before + up_s * 600 + 60
    installs = [i for i in fleet.audit()["installs"] if i["host"] == "gpu-c01"]
    assert [(i["component"], i["count"]) for i in installs] == [("kernel", 1)]
    fleet.return_to_service(["gpu-c01"], "op-1")
    wait_for("return", all_in(fleet, ["gpu-c01"], HostState.SERVING))
    assert fleet.audit()["unverified_returns"] == ["gpu-c01"]  # returned with no check: counted

    assert fleet.healthy()
    assert sim_server.stop() == 0  # SIGTERM: a clean exit
    assert not fleet.healthy()


def test_the_whole_fleet_comes_back_in_one_answer_validated_as_hosts(shared_sim_server: SimServer) -> None:
    fleet = HttpFleet(shared_sim_server.url)
    hosts = fleet.hosts()
    raw = requests.get(f"{shared_sim_server.url}/v1/hosts", timeout=5).json()
    assert TypeAdapter(list[Host]).dump_python(hosts, mode="json") == raw  # the engine's own JSON, as the models say it
    assert [h.name for h in hosts] == sorted(h.name for h in hosts) and len(hosts) == len(raw) > 0
    assert fleet.hosts(["gpu-b02", "gpu-a01"]) == [h for n in ("gpu-b02", "gpu-a01") for h in hosts if h.name == n]
    assert fleet.jobs() and all(isinstance(j.hosts, list) for j in fleet.jobs())


@contextlib.contextmanager
def json_server(answer: Callable[[str, Any], Any], seen: list[tuple[str, str, str]] | None = None) -> Iterator[str]:
    """A stand-in fleet manager on loopback: `answer(method, request body or None)` is the JSON it answers;
    yields its URL. `seen` gets each request's (method, target as sent, Authorization header)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            if seen is not None:
                seen.append((method, self.path, self.headers.get("Authorization") or ""))
            body = json.dumps(answer(method, json.loads(self.rfile.read(size)) if size else None)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self._reply("GET")

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self._reply("POST")

        def log_message(self, *args: Any) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_fleet_answer_that_does_not_validate_is_a_fleet_error() -> None:
    """A fleet manager that answers hosts with a name no shell may see: refused at the boundary."""
    liar = [{"name": "gpu-a01; reboot", "domain": "pod-a", "state": "serving"}]
    with json_server(lambda _method, _body: liar) as url:
        with pytest.raises(FleetError, match=r"GET /v1/hosts answered data that does not validate .*first at 0\.name"):
            HttpFleet(url).hosts()


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


def test_the_environments_proxy_no_proxy_and_netrc_are_honoured_as_read_at_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What requests takes from the environment is read once, when the fleet is made (requests would read every
    variable again on each request): HTTP_PROXY carries the calls, NO_PROXY exempts its hosts, ~/.netrc's entry
    for the fleet's host is sent as basic auth and never shown."""
    import base64

    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                "all_proxy", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    via_proxy: list[tuple[str, str, str]] = []
    direct: list[tuple[str, str, str]] = []
    with json_server(lambda _m, _b: {"now": 5.0}, via_proxy) as proxy, \
            json_server(lambda _m, _b: {"now": 7.0}, direct) as fleet_url:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        proxied = HttpFleet("http://fleet.invalid:8080", retries=0)
        monkeypatch.delenv("HTTP_PROXY")  # read already: the fleet keeps its proxy
        assert proxied.now() == 5.0 and proxied.now() == 5.0
        assert [p for _m, p, _a in via_proxy] == ["http://fleet.invalid:8080/v1/now"] * 2
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert HttpFleet(fleet_url).now() == 7.0
        assert len(via_proxy) == 2 and direct[-1][:2] == ("GET", "/v1/now") and direct[-1][2] == ""
        netrc = tmp_path / ".netrc"
        netrc.write_text("machine 127.0.0.1 login ops password n3trc-s3cret\n")
        netrc.chmod(0o600)
        fleet = HttpFleet(fleet_url)
        assert fleet.now() == 7.0
        assert direct[-1][2] == "Basic " + base64.b64encode(b"ops:n3trc-s3cret").decode()
        assert fleet.auth_scheme == "basic" and "n3trc" not in repr(fleet)
        assert HttpFleet(fleet_url, token="tok-given").now() == 7.0  # a token given wins over the file
        assert direct[-1][2] == "Bearer tok-given"


# ---- authentication and TLS against a real server ------------------------------------------------------
TOKEN = "tok-adapter-4b8e2f6a1c3d5e7f"
SECURE_READY_RE = re.compile(r"railyard-sim ready on (https?://\S+)( \(bearer token required\))?")


class SecureSimServer(SimServer):
    """The simulator with extra command-line arguments (token file, TLS) and extra environment."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None):
        super().__init__(workdir, SIM_CONFIG)
        self.args, self.env = list(args), env or {}
        self.authenticated = False

    def start(self, timeout: float = 20.0) -> str:
        cmd = [sys.executable, "-m", "railyard.sim", "--config", str(self.config_path), "--db", str(self.db_path),
               "--port", "0", *self.args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_FLEET_TOKEN")}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**env, **self.env, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = SECURE_READY_RE.search(self.log_path.read_text(errors="replace"))
            if m:
                self.url, self.authenticated = m.group(1), bool(m.group(2))
                return self.url
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"simulator exited:\n{self.log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("simulator not ready")


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[SecureSimServer]:
    server = SecureSimServer(tmp_path, env={"RAILYARD_FLEET_TOKEN": TOKEN})
    server.start()
    yield server
    server.stop()


def test_a_token_server_refuses_calls_without_it(token_server: SecureSimServer) -> None:
    url = token_server.url
    assert token_server.authenticated  # it says so when it starts, without printing the token
    assert TOKEN not in token_server.log_path.read_text()
    assert requests.get(f"{url}/healthz", timeout=5).status_code == 200  # liveness stays open
    for method, path, body in [("GET", "/v1/hosts", None), ("GET", "/v1/capacity", None),
                               ("PATCH", "/v1/settings", {"check_fail_rate": 1.0}),
                               ("POST", "/v1/hosts/gpu-a01/fail", None), ("POST", "/v1/hosts/gpu-a01/repaired", None),
                               ("GET", "/v1/audit", None), ("GET", "/openapi.json", None)]:
        r = requests.request(method, url + path, json=body, timeout=5)
        assert r.status_code == 401, (path, r.status_code)
        r = requests.request(method, url + path, json=body, timeout=5, headers={"Authorization": "Bearer nope-nope"})
        assert r.status_code == 401 and "nope-nope" not in r.text
    fleet = HttpFleet(url, token=TOKEN)
    assert fleet.settings()["check_fail_rate"] == 0.0  # the PATCH above never reached the engine
    assert all(h.state == HostState.SERVING for h in fleet.hosts())  # nor the /fail
    assert fleet.healthy()

    with pytest.raises(FleetError, match="not authorized .*no credentials were sent"):
        HttpFleet(url).capacity()
    wrong = "tok-wrong-9d7b5a3c1e2f4a6b"
    with pytest.raises(FleetError, match="not authorized .*bearer credentials were refused") as err:
        HttpFleet(url, token=wrong).drain(["gpu-a01"], "op-1")
    assert wrong not in str(err.value) and TOKEN not in str(err.value)
    with pytest.raises(FleetError, match="basic credentials were refused") as err:
        HttpFleet(url, login="ops", password=TOKEN).capacity()
    assert TOKEN not in str(err.value)
    assert fleet.capacity().domains_out == []  # the refused drain did nothing


def test_the_token_comes_from_a_file_and_an_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    server = SecureSimServer(tmp_path, "--token-file", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="is empty"):
        server.start()
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "sim.log").unlink()
    server = SecureSimServer(tmp_path, "--token-file", str(tmp_path / "token"))
    server.start()
    try:
        assert server.authenticated
        assert HttpFleet(server.url, token=TOKEN).now() > 0
        assert requests.get(f"{server.url}/v1/now", timeout=5).status_code == 401
    finally:
        server.stop()


def _pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        (d / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
        (d / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("railyard test CA")).issuer_name(name("railyard test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca_key, ca)
    for stem, usage, san in (("server", ExtendedKeyUsageOID.SERVER_AUTH,
                              [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             ("client", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("railyard-client")])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(stem)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(san), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(stem, key, cert)
    return {p.stem + p.suffix: p for p in d.iterdir()}


def test_tls_with_a_private_ca_and_a_client_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    pki = _pki(pki_dir)
    server = SecureSimServer(tmp_path, "--tls-cert", str(pki["server.pem"]), "--tls-key", str(pki["server.key"]),
                             "--tls-client-ca", str(pki["ca.pem"]), env={"RAILYARD_FLEET_TOKEN": TOKEN})
    url = server.start()
    try:
        assert url.startswith("https://127.0.0.1:") and server.authenticated
        client = (str(pki["client.pem"]), str(pki["client.key"]))
        fleet = HttpFleet(url, token=TOKEN, verify=str(pki["ca.pem"]), cert=client)
        assert fleet.capacity().total_hosts == 12
        started = time.monotonic()
        with pytest.raises(FleetError, match="TLS failed .*(CERTIFICATE_VERIFY_FAILED|certificate verify failed)"):
            HttpFleet(url, token=TOKEN, cert=client).capacity()  # the system CAs do not know ours
        assert time.monotonic() - started < 3  # a certificate problem is not retried
        with pytest.raises(FleetError, match="TLS failed|cannot connect"):  # no client certificate: refused
            HttpFleet(url, token=TOKEN, verify=str(pki["ca.pem"]), retries=0).capacity()
        with pytest.raises(FleetError, match="not authorized"):  # TLS is no substitute for the token
            HttpFleet(url, verify=str(pki["ca.pem"]), cert=client).capacity()
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki["ca.pem"]))  # the environment's CA, as requests reads it
        assert HttpFleet(url, token=TOKEN, cert=client).capacity().total_hosts == 12
        with pytest.raises(FleetError, match="TLS failed"):  # an explicit bundle still wins over it
            HttpFleet(url, token=TOKEN, verify=certifi_bundle(), cert=client, retries=0).capacity()
        fleet.close()  # else the server's SIGTERM waits (up to its 3 s grace) for this idle TLS connection
    finally:
        server.stop()


def certifi_bundle() -> str:
    import certifi

    return str(certifi.where())


def test_reads_of_hosts_ask_only_for_what_changed_and_add_up_to_a_full_read(sim_server: SimServer) -> None:
    """A second read of the same hosts sends the first answer's cursor and gets back only the hosts that
    changed (none, then the drained ones); what it returns is a full read's answer each time. A restarted
    server does not know the cursor: its full answer replaces the view."""
    import json

    from railyard.fleet.http import CHANGES_HEADER, CURSOR_HEADER

    fleet = HttpFleet(sim_server.url)
    sent: list[dict[str, Any]] = []
    answered: list[tuple[int, str | None]] = []
    request = fleet.session.request

    def spy(method: str, url: str, **kw: Any) -> Any:
        resp = request(method, url, **kw)
        if url.endswith("/v1/hosts/query"):
            sent.append(json.loads(kw["data"]))
            answered.append((len(resp.json()), resp.headers.get(CHANGES_HEADER)))
        return resp

    fleet.session.request = spy  # type: ignore[method-assign]

    def full() -> list[Host]:
        return TypeAdapter(list[Host]).validate_python(
            requests.post(f"{sim_server.url}/v1/hosts/query", json={"names": POD_B}, timeout=5).json())

    assert fleet.hosts(POD_B) == full()
    assert "since" not in sent[-1] and answered[-1] == (4, None)
    assert fleet.hosts(POD_B) == full()
    assert sent[-1]["since"] and answered[-1] == (0, sent[-1]["since"])  # nothing changed: nothing sent

    fleet.drain(POD_B[:2], "op-delta")
    assert fleet.hosts(POD_B) == full()
    assert answered[-1][0] >= 2 and answered[-1][1] == sent[-1]["since"]
    assert [h.state for h in fleet.hosts(POD_B)[:2]] == [HostState.DRAINING] * 2
    wait_for("drain", all_in(fleet, POD_B[:2], HostState.DRAINED))
    assert fleet.hosts(POD_B) == full()

    before = fleet.hosts(POD_B)
    sim_server.kill()
    fleet.base_url = sim_server.start()  # the same client, its views kept, at the new server's port
    assert fleet.hosts(POD_B) == full() == before
    assert answered[-1] == (4, None)  # another server's cursor: a full answer
    whole = fleet.hosts()
    assert fleet.hosts() == whole and len(whole) > len(POD_B)
    raw = requests.get(f"{sim_server.url}/v1/hosts", timeout=5)
    assert raw.headers[CURSOR_HEADER] and json.loads(raw.content) == TypeAdapter(list[Host]).dump_python(
        whole, mode="json")


def test_polls_of_check_results_ask_only_for_what_changed(sim_server: SimServer) -> None:
    """While a domain's checks run, each poll after the first gets back only the checks that changed (none
    while they all run); what `check_results` returns is a full read's answer each time, also after a
    restarted server forgets the cursor. Once every check asked for is over, its view is not kept: the next
    read is whole."""
    import json

    from railyard.fleet.http import CHANGES_HEADER

    fleet = HttpFleet(sim_server.url)
    answered: list[tuple[bool, int, str | None]] = []
    request = fleet.session.request

    def spy(method: str, url: str, **kw: Any) -> Any:
        resp = request(method, url, **kw)
        if url.endswith("/v1/checks/query"):
            answered.append(("since" in json.loads(kw["data"]), len(resp.json()), resp.headers.get(CHANGES_HEADER)))
        return resp

    fleet.session.request = spy  # type: ignore[method-assign]
    op = "op-checks-delta"

    def full() -> list[CheckResult]:
        return TypeAdapter(list[CheckResult]).validate_python(requests.post(
            f"{sim_server.url}/v1/checks/query", json={"hosts": POD_B, "op": op}, timeout=5).json())

    assert fleet.check_results(POD_B, op) == [] == full()
    fleet.drain(POD_B, op)
    wait_for("drain", all_in(fleet, POD_B, HostState.DRAINED))
    fleet.start_checks({h: TARGETS for h in POD_B}, op)
    first = fleet.check_results(POD_B, op)
    assert first == full() and {r.status for r in first} == {"pending"} and len(first) == 4
    assert answered[-1][0] and answered[-1][1] == 4  # the checks started since the first read: all four
    assert fleet._check_views  # checks still run: kept for the polls by changes
    assert fleet.check_results(POD_B, op) == full()
    assert answered[-1][:2] == (True, 0) and answered[-1][2]  # nothing changed since: nothing sent
    sim_server.kill()
    fleet.base_url = sim_server.start()  # another server: the cursor is not its own, its full answer counts
    before = full()
    got = fleet.check_results(POD_B, op)
    asked = answered[-1]
    after = full()
    # the restarted clock catches up, and a check may end between two reads: each host's result is as a full
    # read just before or just after had it
    assert len(got) == len(before) == len(after) == 4
    assert all(g in (b, a) for g, b, a in zip(got, before, after, strict=True)), (got, before, after)
    assert asked[0] and asked[2] is None
    wait_for("checks", lambda: all(r.status != "pending" for r in fleet.check_results(POD_B, op)), timeout=30)
    assert not fleet._check_views  # every check is over: nothing kept
    assert fleet.check_results(POD_B, op) == full() and answered[-1][0] is False


def test_a_fleet_that_sends_no_cursor_is_read_whole_every_time() -> None:
    """A fleet manager that knows nothing of cursors: no read ever sends `since`."""
    bodies: list[dict[str, Any]] = []

    def answer(_method: str, body: Any) -> Any:
        bodies.append(body)
        return [{"name": n, "domain": "pod-a", "state": "serving"} for n in body["names"]]

    with json_server(answer) as url:
        fleet = HttpFleet(url)
        for _ in range(3):
            assert [h.name for h in fleet.hosts(["gpu-a01", "gpu-a02"])] == ["gpu-a01", "gpu-a02"]
        assert bodies == [{"names": ["gpu-a01", "gpu-a02"]}] * 3


def test_the_hosts_out_of_service_are_read_without_the_whole_fleet_and_stay_right_as_hosts_change(
        sim_server: SimServer) -> None:
    """`hosts_out` answers what a whole read would, filtered to the hosts not serving: first a whole answer of
    those alone, then by changes (hosts going out are added, hosts back in service dropped), and again after a
    restarted server forgets the cursor."""
    import json

    from railyard.fleet.http import CHANGES_HEADER

    fleet = HttpFleet(sim_server.url)
    sizes: list[tuple[bool, int, bool]] = []  # (sent since, hosts answered, answered by changes)
    request = fleet.session.request

    def spy(method: str, url: str, **kw: Any) -> Any:
        resp = request(method, url, **kw)
        if (kw.get("params") or {}).get("out"):
            sizes.append(("since" in kw["params"], len(json.loads(resp.content)), CHANGES_HEADER in resp.headers))
        return resp

    fleet.session.request = spy  # type: ignore[method-assign]

    def truth() -> list[Host]:
        return [h for h in HttpFleet(sim_server.url).hosts() if h.state != HostState.SERVING]

    assert fleet.hosts_out() == truth() == []
    assert sizes[-1] == (False, 0, False)  # the whole answer: no host of the 12 sent
    op = "op-out-b"
    fleet.drain(POD_B, op)
    wait_for("drain", all_in(fleet, POD_B, HostState.DRAINED))
    out = fleet.hosts_out()
    assert out == truth() and [h.name for h in out] == POD_B and all(h.state == HostState.DRAINED for h in out)
    sent_since, answered, by_changes = sizes[-1]  # the changes, or the hosts out whole where that is shorter
    assert sent_since and (answered >= len(POD_B) if by_changes else answered == len(POD_B))
    assert fleet.hosts_out() == truth() and sizes[-1] == (True, 0, True)  # nothing changed: nothing sent
    fleet.return_to_service(POD_B, op)
    wait_for("return", all_in(fleet, POD_B, HostState.SERVING))
    assert fleet.hosts_out() == truth() == []  # the hosts back in service left the view
    assert sizes[-1] == (True, 0, False)  # whole: none out, shorter than the changes (pod-b back, jobs moved)
    fleet.drain(POD_B[:1], "op-out-b2")
    sim_server.kill()
    fleet.base_url = sim_server.start()  # the same client, its views kept: a cursor the new process does not know
    assert [h.name for h in fleet.hosts_out()] == POD_B[:1] == [h.name for h in truth()]
    assert sizes[-1][:2] == (True, 1) and not sizes[-1][2]  # a whole answer of the hosts out alone


def test_a_server_that_knows_no_out_answers_every_host_and_the_client_keeps_the_ones_out(
        shared_sim_server: SimServer) -> None:
    every = [{"name": "gpu-a01", "domain": "pod-a", "state": "serving"},
             {"name": "gpu-a02", "domain": "pod-a", "state": "drained"},
             {"name": "gpu-a03", "domain": "pod-a", "state": "failed"}]
    with json_server(lambda _method, _body: every) as url:
        assert [h.name for h in HttpFleet(url).hosts_out()] == ["gpu-a02", "gpu-a03"]
    # the simulator's out= is a read of the whole fleet's: with names it is refused, naming the parameter
    r = requests.get(f"{shared_sim_server.url}/v1/hosts", params={"out": "true", "names": "gpu-a01"}, timeout=5)
    assert r.status_code == 422 and "out=" in r.json()["detail"]


def test_the_views_kept_for_reads_by_changes_are_bounded_by_the_hosts_in_them(
        shared_sim_server: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Views of earlier reads are kept up to a number of hosts in all (a long-lived client reads domain after
    domain): the least recent is dropped first, so its next read is whole again, while the views still kept
    are read by changes. The newest view is kept whatever its size."""
    import json

    from railyard.fleet import http

    monkeypatch.setattr(http, "VIEW_ENTRIES_KEPT", 6)
    fleet = HttpFleet(shared_sim_server.url)
    sent: list[tuple[tuple[str, ...], bool]] = []
    request = fleet.session.request

    def spy(method: str, url: str, **kw: Any) -> Any:
        if url.endswith("/v1/hosts/query"):
            body = json.loads(kw["data"])
            sent.append((tuple(body["names"]), "since" in body))
        return request(method, url, **kw)

    fleet.session.request = spy  # type: ignore[method-assign]
    pod_a = ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
    fleet.hosts(pod_a)
    fleet.hosts(pod_a)
    assert sent[-1] == (tuple(pod_a), True)  # kept: read by changes
    fleet.hosts(POD_B)  # 8 hosts in two views, over 6: pod A's (the least recent) is dropped
    fleet.hosts(POD_B)
    assert sent[-1] == (tuple(POD_B), True)
    fleet.hosts(pod_a)
    assert sent[-1] == (tuple(pod_a), False)  # dropped: read whole again (and now pod B's is dropped)
    whole = fleet.hosts()  # more hosts than the bound alone: kept, the only view
    assert fleet.hosts() == whole and len(whole) > 6
    assert list(fleet._views) == [None]


def test_a_whole_fleet_read_afresh_is_kept_out_of_the_collectors_later_passes(
        shared_sim_server: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole fleet read afresh, of at least KEEP_LONG_LIVED hosts, is frozen out of the cyclic collector's
    passes (gcpause.keep_long_lived); a read by changes, or of fewer hosts, is not."""
    import gc

    from railyard.fleet import http

    fleet = HttpFleet(shared_sim_server.url)
    gc.unfreeze()
    try:
        fleet.hosts()  # the test fleet is far below KEEP_LONG_LIVED
        assert gc.get_freeze_count() == 0
        monkeypatch.setattr(http, "KEEP_LONG_LIVED", 8)
        fleet.hosts()  # a read by changes: nothing new to keep
        assert gc.get_freeze_count() == 0
        whole = HttpFleet(shared_sim_server.url).hosts()  # read afresh, by a new client
        assert gc.get_freeze_count() > 0 and len(whole) >= 8
        assert gc.isenabled()
    finally:
        gc.unfreeze()
