"""Railyard's Airflow side: the DAG builders, operators, sensors, triggers, hooks, the notifier and the plugin.

A deployment's whole DAG file, naming its config:

    from railyard_airflow import railyard_dags
    globals().update(railyard_dags("/opt/railyard/railyard.yaml"))

Each builder returns {dag_id: DAG}. Without a path they read `RAILYARD_CONFIG`. The builders are imported only
when called, so loading the plugin in every Airflow process costs none of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import DAG

ConfigPath = str | os.PathLike[str] | None


def railyard_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """Every Railyard DAG: one per train, the emergency train, and the releases, repairs, reconcile and outside
    work DAGs."""
    from railyard_airflow.factory import build_all_dags
    return build_all_dags(_str(path))


def train_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """One maintenance-train DAG per train in the config."""
    from railyard_airflow.factory import build_train_dags
    return build_train_dags(_str(path))


def emergency_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """The emergency train, triggered from the UI with a form."""
    return _single("railyard_emergency", path)


def release_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """Promote, halt or resume a release's rollout, triggered from the UI."""
    return _single("railyard_releases", path)


def repair_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """Return repaired hosts through the health gate, on `schedules.repairs`."""
    return _single("railyard_repairs", path)


def reconcile_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """Finish the stops of runs that are gone, on `schedules.reconcile`."""
    return _single("railyard_reconcile", path)


def outside_dags(path: ConfigPath = None) -> dict[str, DAG]:
    """Drive the outside work requested over the Railyard page's API."""
    return _single("railyard_outside", path)


def _single(dag_id: str, path: ConfigPath) -> dict[str, DAG]:
    from railyard_airflow.factory import SINGLE_DAGS
    return {dag_id: SINGLE_DAGS[dag_id](_str(path))}


def _str(path: ConfigPath) -> str | None:
    return None if path is None else os.fspath(path)


__all__ = ["emergency_dags", "outside_dags", "railyard_dags", "reconcile_dags", "release_dags", "repair_dags",
           "train_dags"]
