"""A private Prometheus for tests: Debian's `prometheus` on a free loopback port, its TSDB in a dir of its own,
scraping one target every second with a bearer token from a file. `stop()` ends exactly the server it started.

    prom = PrometheusServer(root, target="127.0.0.1:8080", path="/railyard/metrics", token="...").start()
    prom.query('railyard_domains_out')   # the instant vector, as [(labels, value)]
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from railyard.devstack.stack import free_port


class PrometheusServer:
    def __init__(self, root: Path, *, target: str, path: str, token: str, interval_s: float = 1.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.target, self.path, self.token, self.interval_s = target, path, token, interval_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.root / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> Path:
        token_file = self.root / "scrape-token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        every = f"{int(self.interval_s * 1000)}ms"
        cfg = {"global": {"scrape_interval": every, "evaluation_interval": every},
               "rule_files": [],
               "scrape_configs": [{"job_name": "railyard", "metrics_path": self.path, "scrape_timeout": every,
                                   "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                                   "static_configs": [{"targets": [self.target]}]}]}
        out = self.root / "prometheus.yml"
        out.write_text(yaml.safe_dump(cfg))
        return out

    def start(self, timeout: float = 60) -> PrometheusServer:
        exe = shutil.which("prometheus")
        assert exe, "prometheus: scripts/setup-deps installs Debian's prometheus package"
        cfg = self.config()
        check = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [exe, f"--config.file={cfg}", f"--storage.tsdb.path={self.root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        r = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body: dict[str, Any] = r.json()
        assert r.status_code == 200 and body["status"] == "success", body
        return [(x["metric"], float(x["value"][1])) for x in body["data"]["result"]]

    def one(self, promql: str) -> float | None:
        """The value of a query that selects one series; None when it selects none."""
        rows = self.query(promql)
        assert len(rows) <= 1, rows
        return rows[0][1] if rows else None

    def targets(self) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/v1/targets", timeout=10)
        return list(r.json()["data"]["activeTargets"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
