"""Test-wide setup. Airflow reads its environment at import, so this runs before anything imports it."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="railyard-tests-"))
atexit.register(shutil.rmtree, _HOME, True)  # what the session's Airflow and ledger wrote

os.environ["AIRFLOW_HOME"] = str(_HOME / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["RAILYARD_HOME"] = str(_HOME / "railyard")
os.environ.pop("RAILYARD_CONFIG", None)
os.environ.pop("RAILYARD_LEDGER_URL", None)
if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))


# ---- no process the session started outlives it ---------------------------------------------------------------
# This process is made a child subreaper: whatever a test starts, and whatever that starts, is reparented here
# (not to init) when its parent dies, so at the end every process the session started and that still runs is a
# descendant of this one, however it detached (new session, new process group, double fork, a parent SIGKILLed).
# Every process started from here also inherits RAILYARD_TEST_SESSION: a second net for anything that left
# the tree (`setproctitle` wipes the environment of some Airflow processes, so the tree is the first one).
import ctypes  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

SESSION_MARK = ("RAILYARD_TEST_SESSION", uuid.uuid4().hex)
os.environ[SESSION_MARK[0]] = SESSION_MARK[1]
_PR_SET_CHILD_SUBREAPER = 36
if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
_STARTED: list[tuple[float, str]] = []  # (seconds since boot, test) as each test starts: who started a leftover
_TICKS = os.sysconf("SC_CLK_TCK")


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _started_s(pid: int) -> float:
    """When a process started, in seconds since boot (the clock of /proc/uptime)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2:].split()[19]) / _TICKS


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _STARTED.append((_uptime(), nodeid))


def _marked(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{SESSION_MARK[0]}={SESSION_MARK[1]}".encode() in env.split(b"\0")


def session_leftovers() -> list[psutil.Process]:
    """Live processes (not zombies) that this pytest run started, but for this process itself."""
    me = psutil.Process()
    found = {p.pid: p for p in me.children(recursive=True)}
    for p in psutil.process_iter():
        if p.pid not in found and p.pid != me.pid and _marked(p.pid):
            found[p.pid] = p
    out = []
    for p in found.values():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _reap() -> None:
    """Collect the exit status of every child that has ended (orphans adopted by the subreaper among them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _describe(p: psutil.Process) -> str:
    try:
        started = _started_s(p.pid)
        cmd = " ".join(p.cmdline())[:160] or p.name()
    except (OSError, psutil.Error):
        return f"{p.pid} (gone)"
    test = next((t for at, t in reversed(_STARTED) if at <= started + 0.01), "before the first test")
    return f"{p.pid} {cmd!r}, started during {test}"


def _end_leftovers() -> list[str]:
    """End what this pytest run started that still runs; returns their descriptions (none: all is well)."""
    deadline = time.monotonic() + 5  # a process that was told to stop may take a moment
    left = session_leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        _reap()
        left = session_leftovers()
    if not left:
        _reap()
        return []
    lines = [_describe(p) for p in left]
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(left, timeout=5)
    for p in alive:  # Airflow's orphaned LocalExecutor workers ignore SIGTERM
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    _reap()
    return lines


_FROM_WORKERS: list[str] = []  # what the xdist workers found left running (`make test LANES=...`)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller: a worker is done; keep what it found left running (its exit status is not sent)."""
    _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("railyard_leftovers", []))


@pytest.hookimpl(trylast=True)  # after the session-scoped fixtures' teardown (and xdist's workers' end)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    lines = _end_leftovers()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller reports them and fails the run
        workeroutput["railyard_leftovers"] = lines
        return
    lines += _FROM_WORKERS
    if not lines:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = f"{len(lines)} process(es) started by this test session outlived it (now killed):"
    if tr is not None:
        tr.write_sep("=", "processes left running", red=True, bold=True)
        tr.write_line(msg, red=True)
        for ln in lines:
            tr.write_line(f"  {ln}", red=True)
    else:
        print(msg, *lines, sep="\n  ", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---- two lanes: `make test` runs two pytest-xdist workers (`-n 2 --dist loadscope`), one lane each ------------
# Each worker runs one lane whole, in order: a lane is the scope xdist schedules by. Lane "a" holds every test
# that runs an Airflow stack of its own (standalone, Celery), one at a time: two stacks at once on 2 cores kept
# an api-server from answering in 30 s. Lane "b" holds the rest (in-process Airflow, the simulator, Slurm, sshd,
# PostgreSQL, the model). Run alone (`LANES=`), the lanes change nothing.
LANE_A = ("tests/distributed/", "tests/e2e/")


def lane_of(nodeid: str) -> str:
    return "a" if nodeid.startswith(LANE_A) else "b"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return Lanes(config, log)  # type: ignore[arg-type]
