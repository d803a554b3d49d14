"""A stand-in `HostRunner` for tests: it installs NOTHING, it only keeps versions in a table.

Each node's component versions are a record in the state store (the ledger's database), as is
each upgrade or check it runs. The work runs in a detached worker process
(`python -m railyard.backends.slurm.standin URL KEY`) that takes the configured time and records its progress
and a heartbeat, so a retried task on any worker re-attaches to the work in flight (or resumes it
when the worker died: no heartbeat for HEARTBEAT_S) instead of starting it twice. Selected only by
writing `fleet.slurm.runner: standin`; the SSH runner is the production path.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import socket
import subprocess
import sys
import time
from typing import Any

from railyard.backends.hosts.port import RunnerError, UpgradeState
from railyard.domain.models import CheckResult, Step, check_token
from railyard.ledger.state import Store

VERSIONS, WORK = "standin_versions", "standin_work"
HEARTBEAT_S = 5.0


def op_token(op: str) -> str:
    """An operation id as a plain token (Slurm reasons, file names): readable part + hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", op).strip("._-")[:40] or "op"
    return f"{safe}-{hashlib.sha1(op.encode()).hexdigest()[:8]}"


def _alive(cur: dict[str, Any] | None) -> bool:
    return bool(cur) and time.time() - float(cur.get("beat", 0)) < HEARTBEAT_S  # type: ignore[union-attr]


class StandinRunner:
    def __init__(self, store: Store, *, durations: dict[str, float], check_s: float = 2.0,
                 initial_versions: dict[str, str] | None = None):
        self.store = store
        self.durations = dict(durations)
        self.check_s = check_s
        self.initial = dict(initial_versions or {})

    @staticmethod
    def _key(kind: str, host: str, op: str) -> str:
        return f"{kind}:{check_token(host)}:{op_token(op)}"

    # ---- HostRunner ----------------------------------------------------------------------------
    def versions(self, host: str) -> dict[str, str]:
        return {**self.initial, **(self.store.get(VERSIONS, check_token(host)) or {})}

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        key = self._key("upgrade", host, op)
        cur = self.store.get(WORK, key)
        if cur and (cur["status"] in ("done", "failed") or _alive(cur)):
            return  # finished, or in flight: re-attach
        todo = [s.model_dump() for s in steps]
        if cur:  # the worker died: resume the steps it had not finished
            todo = cur["steps"]
        self._spawn(key, {"kind": "upgrade", "host": host, "status": "running", "steps": todo,
                          "durations": {s["component"]: self.durations.get(s["component"], 1.0) for s in todo}})

    def upgrade_state(self, host: str, op: str) -> UpgradeState:
        cur = self.store.get(WORK, self._key("upgrade", host, op))
        if cur is None:
            return UpgradeState(host=host, status="idle", versions=self.versions(host))
        status = cur["status"]
        if status == "running" and not _alive(cur):
            status = "idle"  # the worker died: nothing runs; the next `upgrade` call resumes it
        return UpgradeState(host=host, status=status, error=cur.get("error"), versions=self.versions(host))

    def start_check(self, host: str, expected: dict[str, str], op: str) -> None:
        key = self._key("check", host, op)
        cur = self.store.get(WORK, key)
        if cur and (cur["status"] != "pending" or _alive(cur)):
            return
        for c, v in expected.items():
            check_token(c), check_token(v)
        self._spawn(key, {"kind": "check", "host": host, "status": "pending", "expected": expected,
                          "check_s": self.check_s})

    def check_result(self, host: str, op: str) -> CheckResult:
        cur = self.store.get(WORK, self._key("check", host, op))
        if cur is None:
            return CheckResult(host=host, status="failed", reason="no check was started for this operation")
        if cur["status"] == "pending" and not _alive(cur):
            return CheckResult(host=host, status="pending", reason="check worker died; start_check resumes it")
        return CheckResult(host=host, status=cur["status"], reason=cur.get("reason"),
                           versions=cur.get("versions") or {})

    def busy(self, host: str, op: str) -> str | None:
        """'upgrade' or 'check' while a worker for this op runs on the host."""
        for kind, running in (("upgrade", "running"), ("check", "pending")):
            cur = self.store.get(WORK, self._key(kind, host, op))
            if cur and cur["status"] == running and _alive(cur):
                return kind
        return None

    def _spawn(self, key: str, state: dict[str, Any]) -> None:
        state.update(initial=self.initial, beat=time.time(), at=socket.gethostname())
        self.store.put(WORK, key, state)
        try:
            subprocess.Popen([sys.executable, "-m", "railyard.backends.slurm.standin", self.store.url, key],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise RunnerError(f"{state['host']}: cannot start the stand-in worker: {exc}") from None


def _sleep(store: Store, key: str, seconds: float) -> None:
    """Sleep, beating the record's heartbeat so others see the work is alive."""
    end = time.time() + seconds
    while True:
        cur = store.get(WORK, key) or {}
        store.put(WORK, key, {**cur, "beat": time.time()})
        left = end - time.time()
        if left <= 0:
            return
        time.sleep(min(1.0, left))


def _work(url: str, key: str) -> None:
    """The detached worker: one upgrade (steps in order) or one check, then exit."""
    store = Store(url)
    st = store.get(WORK, key) or {}
    host = st["host"]

    def versions() -> dict[str, str]:
        return {**st["initial"], **(store.get(VERSIONS, host) or {})}

    if st["kind"] == "upgrade":
        for i, step in enumerate(list(st["steps"])):
            _sleep(store, key, float(st["durations"].get(step["component"], 1.0)))
            store.put(VERSIONS, host, {**versions(), step["component"]: step["version"]})
            store.put(WORK, key, {**(store.get(WORK, key) or st), "steps": st["steps"][i + 1:], "beat": time.time()})
        store.put(WORK, key, {**(store.get(WORK, key) or st), "status": "done", "steps": []})
        return
    _sleep(store, key, float(st["check_s"]))
    found = versions()
    wrong = {c: found.get(c) for c, v in st["expected"].items() if found.get(c) != v}
    if wrong:
        status, reason = "failed", f"versions not at target: {wrong}"
    else:
        status, reason = "passed", None
    store.put(WORK, key, {**(store.get(WORK, key) or st), "status": status, "reason": reason, "versions": found})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="stand-in runner worker (started by StandinRunner)")
    ap.add_argument("url")
    ap.add_argument("key")
    a = ap.parse_args()
    _work(a.url, a.key)
