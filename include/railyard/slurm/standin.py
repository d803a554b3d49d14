"""A stand-in `HostRunner` for nodes without real on-host work (tests, demos, dry runs).

Each node's component versions live in `<dir>/<node>/versions.json`. An upgrade or a check runs as
a detached worker process (`python -m railyard.slurm.standin`) that takes the configured time and
writes its progress to `<dir>/<node>/<kind>-<op token>.json`, so a retried task re-attaches to the
work in flight (or resumes it when the worker died) instead of starting it twice. The SSH runner
replaces it by configuration; the fleet only sees the `HostRunner` port.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from railyard.hosts.port import RunnerError, UpgradeState
from railyard.models import CheckResult, Step, check_token


def op_token(op: str) -> str:
    """An operation id as a plain token (Slurm reasons, file names): readable part + hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", op).strip("._-")[:40] or "op"
    return f"{safe}-{hashlib.sha1(op.encode()).hexdigest()[:8]}"


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class StandinRunner:
    def __init__(self, state_dir: str | os.PathLike[str], *, durations: dict[str, float],
                 check_s: float = 2.0, initial_versions: dict[str, str] | None = None,
                 fail_checks: list[str] | None = None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.durations = dict(durations)
        self.check_s = check_s
        self.initial = dict(initial_versions or {})
        self.fail_checks = set(fail_checks or [])

    def _node(self, host: str) -> Path:
        d = self.dir / check_token(host)
        d.mkdir(exist_ok=True)
        return d

    # ---- HostRunner ----------------------------------------------------------------------------
    def versions(self, host: str) -> dict[str, str]:
        return {**self.initial, **(_read(self._node(host) / "versions.json") or {})}

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        f = self._node(host) / f"upgrade-{op_token(op)}.json"
        cur = _read(f)
        if cur and (cur["status"] in ("done", "failed") or _alive(cur.get("pid"))):
            return  # finished, or in flight: re-attach
        todo = [s.model_dump() for s in steps]
        if cur:  # the worker died: resume the steps it had not finished
            todo = cur["steps"]
        self._spawn(f, {"kind": "upgrade", "host": host, "status": "running", "steps": todo,
                        "durations": {s["component"]: self.durations.get(s["component"], 1.0) for s in todo}})

    def upgrade_state(self, host: str, op: str) -> UpgradeState:
        cur = _read(self._node(host) / f"upgrade-{op_token(op)}.json")
        if cur is None:
            return UpgradeState(host=host, status="idle", versions=self.versions(host))
        status = cur["status"]
        if status == "running" and not _alive(cur.get("pid")):
            status = "idle"  # the worker died: nothing runs; the next `upgrade` call resumes it
        return UpgradeState(host=host, status=status, error=cur.get("error"), versions=self.versions(host))

    def start_check(self, host: str, expected: dict[str, str], op: str) -> None:
        f = self._node(host) / f"check-{op_token(op)}.json"
        cur = _read(f)
        if cur and (cur["status"] != "pending" or _alive(cur.get("pid"))):
            return
        for c, v in expected.items():
            check_token(c), check_token(v)
        self._spawn(f, {"kind": "check", "host": host, "status": "pending", "expected": expected,
                        "check_s": self.check_s, "fail": host in self.fail_checks})

    def check_result(self, host: str, op: str) -> CheckResult:
        cur = _read(self._node(host) / f"check-{op_token(op)}.json")
        if cur is None:
            return CheckResult(host=host, status="failed", reason="no check was started for this operation")
        if cur["status"] == "pending" and not _alive(cur.get("pid")):
            return CheckResult(host=host, status="pending", reason="check worker died; start_check resumes it")
        return CheckResult(host=host, status=cur["status"], reason=cur.get("reason"),
                           versions=cur.get("versions") or {})

    def busy(self, host: str, op: str) -> str | None:
        """'upgrade' or 'check' while a worker for this op runs on the host."""
        node = self._node(host)
        for kind, running in (("upgrade", "running"), ("check", "pending")):
            cur = _read(node / f"{kind}-{op_token(op)}.json")
            if cur and cur["status"] == running and _alive(cur.get("pid")):
                return kind
        return None

    def _spawn(self, f: Path, state: dict) -> None:
        state["versions_file"] = str(f.parent / "versions.json")
        state["initial"] = self.initial
        _write(f, state)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "railyard.slurm.standin", str(f)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise RunnerError(f"{state['host']}: cannot start the stand-in worker: {exc}") from None
        state["pid"] = proc.pid
        cur = _read(f) or {}
        if cur.get("status") == state["status"]:
            _write(f, {**cur, "pid": proc.pid})


def _work(f: Path) -> None:
    """The detached worker: one upgrade (steps in order) or one check, then exit."""
    for _ in range(100):  # the parent writes our pid right after the spawn
        st = _read(f)
        if st and st.get("pid") == os.getpid():
            break
        time.sleep(0.02)
    st = _read(f) or {}
    vfile = Path(st["versions_file"])
    if st["kind"] == "upgrade":
        for i, step in enumerate(list(st["steps"])):
            time.sleep(float(st["durations"].get(step["component"], 1.0)))
            versions = {**st["initial"], **(_read(vfile) or {})}
            versions[step["component"]] = step["version"]
            _write(vfile, versions)
            _write(f, {**(_read(f) or st), "steps": st["steps"][i + 1:]})
        _write(f, {**(_read(f) or st), "status": "done", "steps": []})
        return
    time.sleep(float(st["check_s"]))
    versions = {**st["initial"], **(_read(vfile) or {})}
    wrong = {c: versions.get(c) for c, v in st["expected"].items() if versions.get(c) != v}
    if st.get("fail"):
        status, reason = "failed", "stand-in check: injected failure (dcgmi diag -r 3: GPU 2 XID 79)"
    elif wrong:
        status, reason = "failed", f"versions not at target: {wrong}"
    else:
        status, reason = "passed", None
    _write(f, {**(_read(f) or st), "status": status, "reason": reason, "versions": versions})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="stand-in runner worker (started by StandinRunner)")
    ap.add_argument("state_file", type=Path)
    _work(ap.parse_args().state_file)
