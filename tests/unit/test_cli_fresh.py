"""Every `railyard` command as a new user meets it on a fresh clone: its defaults, no `.railyard` folder in
the working directory or the home, no simulator running, no RAILYARD_* (or AIRFLOW_*) in the environment.
Each either works or says in one line what is missing; none ends in a traceback. `railyard demo` starts
the real stack: tests/e2e/test_demo_stop.py runs it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from railyard.devstack.stack import free_port
from railyard.domain.config import load_config

RAILYARD = Path(sys.executable).parent / "railyard"
SIM_PORT = load_config().simulator.port  # the default config's: where `plan` and `drift` look by default


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAILYARD_", "AIRFLOW")) or k == "RAILYARD_TEST_SESSION"}  # conftest.py: not config
    env["HOME"] = str(home)
    return env


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    home, clone = tmp_path / "home", tmp_path / "clone"
    home.mkdir()
    clone.mkdir()
    # Hold the default simulator port without listening: a connection is refused, as on a machine where
    # no simulator runs, and no simulator can start there while the commands run.
    hold = socket.socket()
    try:
        hold.bind(("127.0.0.1", SIM_PORT))
    except OSError:
        hold.close()
        pytest.fail(f"port {SIM_PORT} is in use: a simulator (or a demo) runs on this machine; this test "
                    "needs it free (`make stop`)")

    def call(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RAILYARD), *argv], cwd=clone, env=fresh_env(home), capture_output=True,
                              text=True, timeout=120)

    try:
        yield call
    finally:
        hold.close()


def message(r: subprocess.CompletedProcess[str]) -> str:
    """The one line that says what is missing: stderr without argparse's usage block."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if lines and lines[0].startswith("usage:"):
        lines = [ln for ln in lines if not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, f"want one line on stderr, got:\n{r.stderr}"
    return lines[0]


# (argv, exit code, what stdout shows when it works / what the one line on stderr names when it does not)
WORKS = [
    (["validate"], "ok: "),
    (["schema"], "\"title\": \"Railyard config (railyard.yaml)\""),
    (["freeze", "status"], "freeze is off"),
    (["release", "list"], "driver-570"),
    (["release", "halt", "driver-570", "--reason", "a fresh clone halts a release"], "HALTED"),
    (["ops"], "no active operation"),
    (["runs"], "no run reports yet"),
    (["host", "gpu-a01"], "gpu-a01: no lease"),
    (["reconcile"], "nothing to reconcile"),
    (["size"], "<- best"),
    (["study", "--hosts", "64", "--cycle-days", "0.25", "--counts", "2,4"], "train x4"),
]
MISSING = [
    (["plan", "demo"], 4, [f"127.0.0.1:{SIM_PORT}", "cannot connect", "railyard sim serve", "--fleet-url"]),
    (["drift"], 4, [f"127.0.0.1:{SIM_PORT}", "cannot connect", "railyard sim serve", "--fleet-url"]),
    (["drift", "--json"], 4, [f"127.0.0.1:{SIM_PORT}", "railyard sim serve"]),
    (["plan"], 2, ["required: train"]),
    (["plan", "nightly"], 2, ["unknown train 'nightly'", "known: demo"]),
    (["host"], 2, ["required: host"]),
    (["report", "demo/manual__1"], 2, ["no report of the run 'demo/manual__1'", "railyard runs"]),
    (["op", "status", "outside/hw-repair/x/pod-a"], 2, ["no outside operation 'outside/hw-repair/x/pod-a'"]),
    (["op", "request", "--hosts", "gpu-a0l", "--kind", "hw-repair", "--reason", "a fresh clone asks"], 2,
     ["unknown host 'gpu-a0l' (did you mean 'gpu-a01'?)"]),
    (["host", "gpu-zz99"], 2, ["'gpu-zz99' is not a host"]),
    (["lease", "release", "demo/run/pod-a", "--reason", "nothing holds it on a fresh clone"], 2,
     ["no such operation"]),
    (["release", "promote"], 2, ["name the release"]),
    (["freeze", "on"], 2, ["--reason is required"]),
    (["sim"], 2, ["required: sim_cmd"]),
    (["size", "--input", "sizing.yaml"], 2, ["cannot read sizing input sizing.yaml"]),
    (["study", "--hosts", "4"], 2, ["hosts", "(value: 4)"]),
    ([], 2, ["required: cmd"]),
]
ELSEWHERE = {"demo": "tests/e2e/test_demo_stop.py", "sim": "test_sim_serve_makes_its_default_db_folder"}


def test_every_subcommand_is_tried_here() -> None:
    """A new subcommand gets a case here (or in the test named in ELSEWHERE)."""
    r = subprocess.run([str(RAILYARD), "--help"], capture_output=True, text=True, timeout=60,
                       env=fresh_env(Path("/nonexistent")))
    assert r.returncode == 0, r.stderr
    listed = set(re.search(r"\{([\w,-]+)\}", r.stdout).group(1).split(","))  # type: ignore[union-attr]
    tried = {argv[0] for argv, _ in WORKS} | {argv[0] for argv, _, _ in MISSING if argv} | set(ELSEWHERE)
    assert listed - tried == set(), f"subcommands with no fresh-clone case: {sorted(listed - tried)}"


@pytest.mark.parametrize(("argv", "shows"), WORKS, ids=[" ".join(a) for a, _ in WORKS])
def test_works_on_a_fresh_clone(run, argv: list[str], shows: str) -> None:
    r = run(*argv)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    assert shows in r.stdout


@pytest.mark.parametrize(("argv", "code", "names"), MISSING, ids=[" ".join(a) or "(none)" for a, _, _ in MISSING])
def test_says_in_one_line_what_is_missing(run, argv: list[str], code: int, names: list[str]) -> None:
    r = run(*argv)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    line = message(r)
    for word in names:
        assert word in line, (word, line)


def test_sim_serve_makes_its_default_db_folder(tmp_path: Path) -> None:
    """`railyard sim serve` as the README shows it: the default --db .railyard/sim.db lives in a folder a fresh
    clone does not have yet. (A port of the test's own, so a simulator already running here is no matter.)"""
    home, clone = tmp_path / "home", tmp_path / "clone"
    home.mkdir()
    clone.mkdir()
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(RAILYARD), "sim", "serve", "--port", str(port)], cwd=clone,
                                env=fresh_env(home), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                        break
                except requests.RequestException:
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            assert (clone / ".railyard" / "sim.db").is_file()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert "Traceback" not in log.read_text()

    # the port taken: one line that says so, no traceback
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        r = subprocess.run([str(RAILYARD), "sim", "serve", "--port", str(port)], cwd=clone, env=fresh_env(home),
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert "address already in use" in message(r)


@pytest.mark.parametrize("taken", ["simulator", "airflow"])
def test_demo_refuses_a_taken_port_before_it_touches_anything(tmp_path, taken):
    """A demo whose simulator or Airflow port is taken (another demo, another server) says so in one
    line, naming the port and what sets it, and leaves the demo home (an earlier demo's ledger and
    fleet) as it was."""
    from tests.support.configs import small_config, write_config

    data = small_config(domains=2)
    data["simulator"]["port"] = free_port()
    cfg = write_config(tmp_path / "railyard.yaml", data)
    home = tmp_path / "demo"
    home.mkdir()
    for f in ("ledger.db", "sim.db"):
        (home / f).write_bytes(b"an earlier demo's")
    airflow_port = free_port()
    env = fresh_env(tmp_path) | {"RAILYARD_CONFIG": str(cfg), "RAILYARD_DEMO_HOME": str(home),
                                 "RAILYARD_AIRFLOW_PORT": str(airflow_port)}
    port = data["simulator"]["port"] if taken == "simulator" else airflow_port
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", port))  # as airflow's api-server and uvicorn listen
        busy.listen()
        r = subprocess.run([str(RAILYARD), "demo", "--once"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    line = message(r)
    assert f"port {port} " in line and "in use" in line, line
    assert ("simulator.port" if taken == "simulator" else "RAILYARD_AIRFLOW_PORT") in line, line
    assert sorted(p.name for p in home.iterdir()) == ["ledger.db", "sim.db"]
    assert all((home / f).read_bytes() == b"an earlier demo's" for f in ("ledger.db", "sim.db"))
