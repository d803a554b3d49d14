"""`HttpFleet`: the Fleet port over HTTP, against the simulator's API (or anything that speaks it).

Every call is idempotent by design, so connection failures and 502/503/504 are retried with a short
backoff; anything the server refuses comes back as `FleetError` carrying the server's own words.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import requests

from railyard.fleet import FleetNotFound
from railyard.fleet.port import FleetError
from railyard.models import Capacity, CheckResult, Host, Job, Step

_RETRY_STATUS = frozenset({502, 503, 504})


class HttpFleet:
    """A `Fleet` reached over HTTP at `base_url` (e.g. http://127.0.0.1:8765)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 15.0,
        retries: int = 3,
        backoff_s: float = 0.2,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.session = requests.Session()

    def __repr__(self) -> str:
        return f"HttpFleet({self.base_url!r})"

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
        params = None if names is None else {"names": ",".join(names)}
        return [Host.model_validate(h) for h in self._call("GET", "/v1/hosts", params=params)]

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        if hosts is not None and not hosts:
            return []
        params = None if hosts is None else {"hosts": ",".join(hosts)}
        return [Job.model_validate(j) for j in self._call("GET", "/v1/jobs", params=params)]

    def request_checkpoint(self, job_ids: list[str]) -> float:
        return float(self._call("POST", "/v1/jobs/checkpoint", body={"jobs": list(job_ids)})["requested_at"])

    def drain(self, hosts: list[str], op: str) -> None:
        if hosts:
            self._call("POST", "/v1/hosts/drain", body={"hosts": list(hosts), "op": op})

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        body = {"steps": [s.model_dump() if isinstance(s, Step) else dict(s) for s in steps], "op": op}
        if body["steps"]:
            self._call("POST", f"/v1/hosts/{_seg(host)}/upgrade", body=body)

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult:
        data = self._call("POST", f"/v1/hosts/{_seg(host)}/check", body={"expected": dict(expected), "op": op})
        return CheckResult.model_validate(data)

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        if not hosts:
            return []
        data = self._call("GET", "/v1/checks", params={"hosts": ",".join(hosts), "op": op})
        return [CheckResult.model_validate(c) for c in data]

    def return_to_service(self, hosts: list[str], op: str) -> None:
        if hosts:
            self._call("POST", "/v1/hosts/return", body={"hosts": list(hosts), "op": op})

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
        return self._call("GET", "/v1/audit")

    def samples(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/audit/samples")

    def settings(self, **rates: float) -> dict[str, float]:
        """Change fault rates (host_failure_per_hour, upgrade_fail_rate, check_fail_rate); none = read."""
        if not rates:
            return self._call("GET", "/v1/settings")
        return self._call("PATCH", "/v1/settings", body=rates)

    def set_job(self, job_id: str, **fields: Any) -> Job:
        """A job's own requests (dodge_until, clear_dodge) or, for fault tests, stuck=True."""
        return Job.model_validate(self._call("PATCH", f"/v1/jobs/{_seg(job_id)}", body=fields))

    def fail(self, host: str) -> Host:
        """Fault injection (simulator only): a serving host breaks now."""
        return Host.model_validate(self._call("POST", f"/v1/hosts/{_seg(host)}/fail"))

    def repaired(self, host: str) -> Host:
        """The repair team is done with the host (simulator only)."""
        return Host.model_validate(self._call("POST", f"/v1/hosts/{_seg(host)}/repaired"))

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/healthz").get("ok"))
        except FleetError:
            return False

    # ---- plumbing ---------------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None) -> Any:
        url = self.base_url + path
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = self.session.request(method, url, params=params, json=body, timeout=self.timeout)
            except requests.ConnectionError as exc:  # includes connect timeouts; nothing reached the server
                problem = f"cannot connect ({type(exc).__name__})"
                continue
            except requests.Timeout:
                raise FleetError(f"fleet at {self.base_url}: {method} {path} got no answer within {self.timeout[1]}s") from None
            except requests.RequestException as exc:
                raise FleetError(f"fleet at {self.base_url}: {method} {path} failed: {exc}") from None
            if resp.status_code in _RETRY_STATUS:
                problem = f"HTTP {resp.status_code}"
                continue
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
        detail = _detail(resp)
        if resp.status_code == 404:
            raise FleetNotFound(detail)
        if resp.status_code < 500:
            raise FleetError(detail)
        raise FleetError(f"fleet at {self.base_url}: {method} {path} failed with HTTP {resp.status_code}: {detail}")


def _seg(value: str) -> str:
    """A host name as one URL path segment; anything odd is escaped and left for the server to refuse."""
    return quote(str(value), safe="")


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


__all__ = ["HttpFleet"]
