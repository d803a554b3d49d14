"""Registers Railyard's Airflow plugin from this folder, as an Astro-style deployment that ships `plugins/`
instead of the installed package needs; where the `railyard` distribution is installed, its `airflow.plugins`
entry point registers the plugin and this file adds nothing, so it is never registered twice."""

from railyard_airflow.plugin import folder_plugin

RailyardPlugin = folder_plugin()
