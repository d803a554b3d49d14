"""Railyard's provider metadata, for Airflow's providers manager (entry point `apache_airflow_provider`): what
`airflow providers list` and the UI's providers page show. The plugin (the Railyard page, the audit middleware)
is registered through the `airflow.plugins` entry point alone, so it is never loaded twice."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any


def get_provider_info() -> dict[str, Any]:
    """The provider's description in the shape of Airflow's provider_info.schema.json. No connection type of its
    own: the hooks read Airflow's `http` (the fleet API) and `ssh` (hosts) connections."""
    pkg = "railyard_airflow"
    return {
        "package-name": "railyard",
        "name": "Railyard",
        "description": "Maintenance trains for GPU fleets: drain, upgrade, check and return one maintenance "
                       "domain at a time, under an operations ledger.",
        "versions": [version("railyard")],
        "integrations": [{"integration-name": "Railyard", "tags": ["software"]}],
        "hooks": [{"integration-name": "Railyard", "python-modules": [f"{pkg}.hooks.fleet", f"{pkg}.hooks.ssh"]}],
        "operators": [{"integration-name": "Railyard", "python-modules": [
            f"{pkg}.operators.stop", f"{pkg}.operators.emergency", f"{pkg}.operators.release",
            f"{pkg}.operators.repair", f"{pkg}.operators.reconcile", f"{pkg}.operators.report",
            f"{pkg}.operators.outside"]}],
        "sensors": [{"integration-name": "Railyard", "python-modules": [f"{pkg}.sensors.stop"]}],
        "triggers": [{"integration-name": "Railyard",
                      "python-modules": [f"{pkg}.triggers.stop", f"{pkg}.triggers.outside"]}],
        "notifications": [f"{pkg}.notifiers.escalation.EscalationNotifier"],
    }
