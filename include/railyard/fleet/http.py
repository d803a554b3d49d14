"""`HttpFleet`: the Fleet port over HTTP, against the simulator's API (or anything that speaks it).

Every call is idempotent by design, so connection failures and 502/503/504 are retried with a short
backoff; anything the server refuses comes back as `FleetError` carrying the server's own words.

Authentication: a bearer token (`token=`) or HTTP basic auth (`login=`, `password=`), sent in the
`Authorization` header only, never in the URL (a URL with `user:password@` is refused). TLS: `verify`
is True (system CAs), False, or the path of a CA bundle; `cert` is a client certificate (a PEM path
holding cert and key, or a `(cert, key)` pair). No message, repr or exception of this class ever
carries the token or the password: whatever the server says is scrubbed of them before it is raised.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import msgspec
import requests
from pydantic import TypeAdapter, ValidationError
from requests.auth import AuthBase

from railyard.domain.models import Capacity, CheckResult, Host, HostState, Job, Step
from railyard.fleet import FleetNotFound, gcpause
from railyard.fleet.port import FleetError

_RETRY_STATUS = frozenset({502, 503, 504})
# Bulk answers are validated straight from the bytes (pydantic-core parses and checks in one pass):
# the whole fleet's hosts, 76,800 of them, in about a second less than json() + a model per host.
_HOSTS = TypeAdapter(list[Host])
_HOST = TypeAdapter(Host)
_JOBS = TypeAdapter(list[Job])
_CHECKS = TypeAdapter(list[CheckResult])
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# Reads of hosts by "what changed since" (docs/design.md, "The fleet port"): a server that can answers a
# read of hosts with a cursor in CURSOR_HEADER; the next read of the same hosts sends it back as `since`, and
# an answer that holds only the hosts changed since then says so by echoing it in CHANGES_HEADER. A server
# that sends no cursor is read whole every time, as before.
CURSOR_HEADER = "Railyard-Cursor"
CHANGES_HEADER = "Railyard-Changes-Since"
_OUT = ("\x00out",)  # the view of the hosts out of service (no host name holds a NUL)
# The lists of hosts read by changes, the least recent dropped: a stop reads a few (its domain's, the hosts out,
# a gate's), a page the whole fleet and a domain at a time. Every view kept is objects each full pass of the
# cyclic collector walks again (a long-lived client reads domain after domain: at 3,840 hosts a domain, the views
# of the domains it has left, with the checks it is done with, were half the collector's time in a train's client).
VIEWS_KEPT = 4
VIEW_ENTRIES_KEPT = 100_000  # and at most this many hosts in them (a fleet of 76,800 and a few domains)
CHECK_VIEWS_KEPT = 4  # the check results of operations whose checks still run, read by changes meanwhile
KEEP_LONG_LIVED = 10_000  # a whole fleet of at least this many hosts, read afresh and kept: see gcpause
log = logging.getLogger("railyard.fleet.http")
T = TypeVar("T")
_JSON_BODY = {"Content-Type": "application/json"}
_encode = msgspec.json.Encoder().encode  # a domain's bodies (thousands of hosts) in a tenth of json.dumps' time


class _Auth(AuthBase):
    """The Authorization header, built per request; its repr names the scheme, never the secret."""

    def __init__(self, scheme: str, value: str):
        self.scheme = scheme
        self._header = f"{scheme} {value}"

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = self._header
        return r

    def __repr__(self) -> str:
        return f"<{self.scheme} auth>"


def _keep_view(views: OrderedDict[Any, tuple[str, dict[str, T]]], key: Any, view: tuple[str, dict[str, T]] | None,
               since: str | None, resp: Any, got: dict[str, T], asked: Collection[str] | None,
               where: str, most: int = VIEWS_KEPT) -> dict[str, T]:
    """The view of `key` after an answer `got` (by name) to a read that sent `since`: the view with the
    answer's entries when the server says it holds only what changed since (it echoes `since`), else the answer
    itself. Kept under the answer's cursor; forgotten when it sent none. The least recent views are dropped
    beyond `most` of them or VIEW_ENTRIES_KEPT entries in all: a long-lived client reads domain after domain,
    and every view kept is memory and objects each full pass of the cyclic collector walks again."""
    if view is not None and since is not None and resp.headers.get(CHANGES_HEADER) == since:
        if got and asked is not None and not got.keys() <= set(asked):  # (a quiet poll builds no set of thousands)
            raise FleetError(f"{where} answered hosts it was not asked for")
        if got:
            merged = dict(view[1])
            merged.update(got)
        else:  # nothing changed (a poll while a domain installs): the view as it is, not a copy of thousands
            merged = view[1]
    else:
        merged = got
    cursor = resp.headers.get(CURSOR_HEADER)
    if cursor:
        views[key] = (cursor, merged)  # replaced whole, never changed in place
        views.move_to_end(key)
        kept = sum(len(v[1]) for v in views.values())
        while len(views) > most or (kept > VIEW_ENTRIES_KEPT and len(views) > 1):
            kept -= len(views.popitem(last=False)[1][1])
    else:
        views.pop(key, None)
    return merged


class HttpFleet:
    """A `Fleet` reached over HTTP(S) at `base_url` (e.g. http://127.0.0.1:8765)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        login: str | None = None,
        password: str | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        connect_timeout: float = 3.0,
        read_timeout: float = 15.0,
        retries: int = 3,
        backoff_s: float = 0.2,
    ):
        parts = urlsplit(base_url)
        if parts.username is not None or parts.password is not None:
            # the message must not repeat the URL: it holds the very secret it is refused for
            raise ValueError("the fleet URL carries credentials (user:password@host); give them as token= or "
                             "login=/password= instead: a URL ends up in logs and error messages")
        if token and (login or password):
            raise ValueError("give the fleet either a bearer token or login/password, not both")
        if (login is None) != (password is None) or login == "" or password == "":
            raise ValueError("basic auth needs both a login and a password")
        self.base_url = base_url.rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.verify = verify
        self.cert = cert
        self._secrets: tuple[str, ...] = ()
        if not token and login is None:  # what requests would otherwise look up on each request: ~/.netrc's entry
            login, password = requests.utils.get_netrc_auth(self.base_url) or (None, None)
        auth: _Auth | None = None
        if token:
            auth = _Auth("Bearer", token)
            self._secrets = (token,)
        elif login and password:
            basic = base64.b64encode(f"{login}:{password}".encode()).decode()
            auth = _Auth("Basic", basic)
            self._secrets = (password, basic)
        self.auth_scheme = auth.scheme.lower() if auth else None
        # per list of names read (None: the fleet): (the server's cursor, the hosts as of it, by name); each
        # entry is replaced whole, never changed in place, so reads in two threads never mix two answers
        self._views: OrderedDict[tuple[str, ...] | None, tuple[str, dict[str, Host]]] = OrderedDict()
        self._check_views: OrderedDict[tuple[str, ...], tuple[str, dict[str, CheckResult]]] = OrderedDict()
        self.session = requests.Session()
        self.session.auth = auth
        self._from_environment()
        if auth and parts.scheme == "http" and (parts.hostname or "") not in _LOOPBACK:
            log.warning("fleet at %s: credentials go over plain http; use https", self.base_url)

    def _from_environment(self) -> None:
        """The proxy (HTTPS_PROXY, NO_PROXY) and CA bundle (REQUESTS_CA_BUNDLE) requests takes from the
        environment, read once for the fleet's URL, as ~/.netrc is above: requests would otherwise read and
        lowercase every environment variable on each request (1-2 ms of CPU a call, most of a quiet poll's).
        An explicit `verify` (False, a bundle's path) wins over the environment's, as in requests."""
        env = self.session.merge_environment_settings(self.base_url, {}, None, self.verify, None)
        self.session.proxies.update(env["proxies"] or {})
        self.verify = env["verify"]
        self.session.trust_env = False

    def __repr__(self) -> str:
        return f"HttpFleet({self.base_url!r}, auth={self.auth_scheme!r})"

    def __enter__(self) -> HttpFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    # ---- the Fleet protocol --------------------------------------------------------------------
    def now(self) -> float:
        return float(self._call("GET", "/v1/now")["now"])

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        if names is not None and not names:
            return []
        key = None if names is None else tuple(names)
        view = self._views.get(key)
        since = view[0] if view is not None else None
        if names is None:
            path = "/v1/hosts"
            resp = self._call("GET", path, params={"since": since} if since else None, raw=True)
        else:  # by name in a body: a domain's names (thousands) do not fit in a URL
            path = "/v1/hosts/query"
            body: dict[str, Any] = {"names": list(names)} | ({"since": since} if since else {})
            resp = self._call("POST", path, body=body, raw=True)
        got = {h.name: h for h in self._parse(_HOSTS, resp.content, path)}
        by_name = _keep_view(self._views, key, view, since, resp, got, names,
                             f"fleet at {self.base_url}: POST {path}")
        if names is None:
            if by_name is got and len(got) >= KEEP_LONG_LIVED and key in self._views:
                gcpause.keep_long_lived()  # the whole fleet read afresh, and kept for the reads after
            return list(by_name.values())
        try:
            return [by_name[n] for n in names]
        except KeyError as exc:
            raise FleetError(f"fleet at {self.base_url}: POST {path} left out host {exc.args[0]!r}") from None

    def hosts_out(self) -> list[Host]:
        """The hosts not serving, by `GET /v1/hosts?out=true`, read by "what changed since" as other reads are.
        A server that knows no `out` answers every host: they are filtered here, so the answer is the same."""
        view = self._views.get(_OUT)
        since = view[0] if view is not None else None
        path = "/v1/hosts"
        resp = self._call("GET", path, params={"out": "true"} | ({"since": since} if since else {}), raw=True)
        got = self._parse(_HOSTS, resp.content, path)
        by_name = _keep_view(self._views, _OUT, view, since, resp, {h.name: h for h in got}, None,
                             f"fleet at {self.base_url}: GET {path}")
        out = {n: h for n, h in by_name.items() if h.state != HostState.SERVING}
        if len(out) < len(by_name) and _OUT in self._views:  # keep only what is out: the next delta adds to it
            self._views[_OUT] = (self._views[_OUT][0], out)
        return list(out.values())

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        if hosts is not None and not hosts:
            return []
        if hosts is None:
            return self._parse(_JOBS, self._call("GET", "/v1/jobs", raw=True).content, "/v1/jobs")
        resp = self._call("POST", "/v1/jobs/query", body={"names": list(hosts)}, raw=True)
        return self._parse(_JOBS, resp.content, "/v1/jobs/query")

    def request_checkpoint(self, job_ids: list[str]) -> float:
        return float(self._call("POST", "/v1/jobs/checkpoint", body={"jobs": list(job_ids)})["requested_at"])

    def drain(self, hosts: list[str], op: str) -> None:
        if hosts:
            # raw: the answer (the hosts, as drained) is not read, and a domain's is a megabyte of JSON
            self._call("POST", "/v1/hosts/drain", body={"hosts": list(hosts), "op": op}, raw=True)

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self.upgrade_hosts({host: steps}, op)

    def upgrade_hosts(self, work: dict[str, list[Step]], op: str) -> None:
        hosts = {h: [{"component": s.component, "version": s.version} if isinstance(s, Step) else dict(s)
                     for s in steps] for h, steps in work.items() if steps}
        if hosts:
            self._call("POST", "/v1/hosts/upgrade", body={"hosts": hosts, "op": op})

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult:
        data = self._call("POST", f"/v1/hosts/{_seg(host)}/check", body={"expected": dict(expected), "op": op})
        return CheckResult.model_validate(data)

    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        if expected:
            self._call("POST", "/v1/hosts/check", body={"hosts": {h: dict(e) for h, e in expected.items()}, "op": op})

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        """The latest check per host for `op` (hosts never checked under it left out). Read by "what changed
        since", as hosts are: a domain's thousands of pending checks cost a poll nothing until they end."""
        if not hosts:
            return []
        key = (op, *hosts)
        view = self._check_views.get(key)
        since = view[0] if view is not None else None
        path = "/v1/checks/query"
        resp = self._call("POST", path, body={"hosts": list(hosts), "op": op} | ({"since": since} if since else {}),
                          raw=True)
        got = self._parse(_CHECKS, resp.content, path)
        by_host = _keep_view(self._check_views, key, view, since, resp, {r.host: r for r in got}, hosts,
                             f"fleet at {self.base_url}: POST {path}", CHECK_VIEWS_KEPT)
        if all(r.status != "pending" for r in by_host.values()) and len(by_host) == len(hosts):
            # every check asked for is over: nothing is left to poll for, and a domain's thousands of results
            # kept would only be walked by the collector's passes (a later read of them is whole, as the first)
            self._check_views.pop(key, None)
        return [by_host[h] for h in hosts if h in by_host]

    def return_to_service(self, hosts: list[str], op: str) -> None:
        if hosts:
            self._call("POST", "/v1/hosts/return", body={"hosts": list(hosts), "op": op}, raw=True)

    def offboard(self, host: str, reason: str, op: str) -> None:
        self._call("POST", f"/v1/hosts/{_seg(host)}/offboard", body={"reason": reason, "op": op})

    def capacity(self) -> Capacity:
        return Capacity.model_validate(self._call("GET", "/v1/capacity"))

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        if hosts:
            self._call("POST", "/v1/hosts/handover", body={"hosts": list(hosts), "from_op": from_op, "to_op": to_op})

    # ---- beyond the protocol -------------------------------------------------------------------
    def audit(self) -> dict[str, Any]:
        """The simulator's audit: max_domains_out, lost work, unverified returns, installs, stops..."""
        return dict(self._call("GET", "/v1/audit"))

    def samples(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/audit/samples"))

    def settings(self, **rates: float) -> dict[str, float]:
        """Change fault rates (host_failure_per_hour, upgrade_fail_rate, check_fail_rate); none = read."""
        if not rates:
            return dict(self._call("GET", "/v1/settings"))
        return dict(self._call("PATCH", "/v1/settings", body=rates))

    def set_job(self, job_id: str, **fields: Any) -> Job:
        """A job's own requests (dodge_until, clear_dodge) or, for fault tests, stuck=True."""
        return Job.model_validate(self._call("PATCH", f"/v1/jobs/{_seg(job_id)}", body=fields))

    def fail(self, host: str) -> Host:
        """Fault injection (simulator only): a serving host breaks now."""
        return _HOST.validate_python(self._call("POST", f"/v1/hosts/{_seg(host)}/fail"))

    def repaired(self, host: str) -> Host:
        """The repair team is done with the host (simulator only)."""
        return _HOST.validate_python(self._call("POST", f"/v1/hosts/{_seg(host)}/repaired"))

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/healthz").get("ok"))
        except FleetError:
            return False

    # ---- plumbing ---------------------------------------------------------------------------------
    def _parse(self, adapter: TypeAdapter[T], content: bytes, path: str) -> T:
        """A bulk answer, parsed and validated; one that does not validate is the fleet's error.

        The cyclic garbage collector is paused meanwhile: validation builds hundreds of thousands of objects
        (the whole fleet's hosts and their versions), none of them in a cycle, and the collections that many
        allocations set off cost a third of the parse (0.1 s at 76,800 hosts)."""
        try:
            with gcpause.paused():
                return adapter.validate_json(content)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise FleetError(self._scrub(f"fleet at {self.base_url}: GET {path} answered data that does not "
                                         f"validate ({exc.error_count()} error(s); first at {where or 'top'}: "
                                         f"{first.get('msg')})")) from None

    def _call(self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None,
              raw: bool = False) -> Any:
        url = self.base_url + path
        data, headers = (None, None) if body is None else (_encode(body), _JSON_BODY)
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = self.session.request(method, url, params=params, timeout=self.timeout, verify=self.verify,
                                            cert=self.cert, data=data, headers=headers)
            except requests.exceptions.SSLError as exc:  # retrying does not fix a certificate
                raise FleetError(self._scrub(
                    f"fleet at {self.base_url}: {method} {path}: TLS failed ({_tls_reason(exc)}); check the "
                    "connection's verify / ca_bundle / cert"
                )) from None
            except requests.ConnectionError as exc:  # includes connect timeouts; nothing reached the server
                problem = f"cannot connect ({type(exc).__name__})"
                continue
            except requests.Timeout:
                raise FleetError(f"fleet at {self.base_url}: {method} {path} got no answer "
                                 f"within {self.timeout[1]}s") from None
            except requests.RequestException as exc:
                raise FleetError(self._scrub(f"fleet at {self.base_url}: {method} {path} failed: {exc}")) from None
            if resp.status_code in _RETRY_STATUS:
                problem = f"HTTP {resp.status_code}"
                continue
            if raw and resp.status_code < 400:
                return resp  # the caller parses the content (and may read the headers)
            return self._answer(resp, method, path)
        tries = self.retries + 1
        raise FleetError(
            f"fleet at {self.base_url} unreachable: {method} {path} failed {tries} time(s), last: {problem}"
        )

    def _answer(self, resp: requests.Response, method: str, path: str) -> Any:
        if resp.status_code < 400:
            try:
                return resp.json()
            except ValueError:
                raise FleetError(f"fleet at {self.base_url}: {method} {path} answered non-JSON") from None
        detail = self._scrub(_detail(resp))
        if resp.status_code in (401, 403):
            sent = (f"the {self.auth_scheme} credentials were refused" if self.auth_scheme
                    else "no credentials were sent")
            raise FleetError(
                f"fleet at {self.base_url}: {method} {path} not authorized (HTTP {resp.status_code}: {detail}); "
                f"{sent}: check the token or login/password of the fleet connection"
            )
        if resp.status_code == 404:
            raise FleetNotFound(detail)
        if resp.status_code < 500:
            raise FleetError(detail)
        raise FleetError(f"fleet at {self.base_url}: {method} {path} failed with HTTP {resp.status_code}: {detail}")

    def _scrub(self, text: str) -> str:
        """The text with every secret this fleet holds replaced by `***` (a server may echo a header)."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def env_token() -> str | None:
    """The bearer token for clients outside Airflow (the CLI, scripts): env RAILYARD_FLEET_TOKEN, else the
    first line of the file named by RAILYARD_FLEET_TOKEN_FILE; None when neither is set. The same
    variables give the simulator its token."""
    token = os.environ.get("RAILYARD_FLEET_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("RAILYARD_FLEET_TOKEN_FILE")
    if not path:
        return None
    try:
        lines = Path(path).read_text().strip().splitlines()
    except OSError as exc:
        raise FleetError(f"RAILYARD_FLEET_TOKEN_FILE {path}: cannot read it ({exc.strerror})") from None
    if not lines or not lines[0].strip():
        raise FleetError(f"RAILYARD_FLEET_TOKEN_FILE {path} is empty")
    return lines[0].strip()


def _seg(value: str) -> str:
    """A host name as one URL path segment; anything odd is escaped and left for the server to refuse."""
    return quote(str(value), safe="")


def _tls_reason(exc: requests.exceptions.SSLError) -> str:
    """The useful words of an SSL error (requests nests them deep in a long repr)."""
    text = str(exc)
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "WRONG_VERSION_NUMBER",
                   "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT", "TLSV1_ALERT", "hostname mismatch"):
        i = text.find(marker)
        if i >= 0:
            return text[i:].split(")")[0].split("'")[0].strip()
    return type(exc).__name__


def _detail(resp: requests.Response) -> str:
    """The server's `detail`, flattened (422 bodies are lists of field errors)."""
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        return resp.text[:500] or f"HTTP {resp.status_code}"
    if isinstance(detail, list):
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(p) for p in err.get("loc", []) if p != "body")
                msg = str(err.get("msg", err))
                if isinstance(err.get("input"), str):
                    msg += f" (got {err['input']!r})"
                parts.append(f"{loc}: {msg}" if loc else msg)
            else:
                parts.append(str(err))
        return "invalid request: " + "; ".join(parts)
    return str(detail) if detail is not None else f"HTTP {resp.status_code}"


__all__ = ["HttpFleet", "env_token"]
