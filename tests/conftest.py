"""Test-wide setup. Airflow reads its environment at import, so this runs before anything imports it."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="railyard-tests-"))

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
