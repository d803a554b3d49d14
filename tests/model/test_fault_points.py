"""The model's faults (a process killed between two calls, an answer lost, the fleet unreachable) live in the
test's wrappers only: no production module can reach them, and no config can turn one on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from railyard.backends.slurm.fleet import SlurmFleet
from railyard.backends.ssh.fleet import SshFleet
from railyard.domain.config import ConfigError, parse_config
from tests.model.test_model import CONFIG

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = [*sorted((ROOT / "include" / "railyard").rglob("*.py")), *sorted((ROOT / "plugins").rglob("*.py")),
              *sorted((ROOT / "dags").glob("*.py"))]


def test_no_production_module_imports_the_tests_or_their_fault_wrappers():
    assert len(PRODUCTION) > 40
    for path in PRODUCTION:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("tests", "hypothesis"), (path, name)
            if isinstance(node, ast.Name):
                assert node.id not in ("Faulty", "Killed", "Plan"), (path, node.id)


@pytest.mark.parametrize("key, value", [
    ("faults", {"kill": "offboard"}),
    ("fault_points", ["lost:drain"]),
    ("model", {"plan": "down"}),
])
def test_a_config_that_asks_for_a_fault_point_is_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=key):
        parse_config({**CONFIG, key: value})


def test_a_production_fleet_has_no_fault_injection():
    """Hosts that fail, jobs that hang: the simulator's, for the demo and the tests; the SSH and Slurm fleets
    have no such call, and a step's retry reaches only what they do."""
    for fleet in (SshFleet, SlurmFleet):
        for name in ("fail", "settings", "set_job", "add_job", "repaired"):
            assert not hasattr(fleet, name), (fleet.__name__, name)


def test_the_model_gives_only_its_own_ledger_its_clock():
    """The model's ledger reads the model's clock; a ledger made anywhere else reads the wall clock."""
    import time

    from railyard.ledger import Ledger
    from tests.model.test_model import Railyard

    m = Railyard()
    try:
        m.time_passes(seconds=600)
        assert m.ledger.clock() == 1.7e9 + m.clock()
    finally:
        m.teardown()
    assert Ledger("sqlite://").clock is time.time
