"""A run's own events (train started, train finished) are sent once per run: a retried task that sends one
again finds it marked in the ledger's database. Through a real `http` route to a local server."""

from __future__ import annotations

import json

from railyard.domain.config import parse_config
from railyard.ledger import Ledger
from railyard_airflow.notifiers.route import Event, send
from tests.support.configs import small_config
from tests.support.webhook import webhook_server


def test_a_runs_event_is_sent_once_however_often_its_task_runs(tmp_path, monkeypatch) -> None:
    data = small_config()
    data["notify"] = [{"connection": "ops_json"}]
    cfg = parse_config(data)
    led = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    with webhook_server("/json") as (url, got):
        host, port = url.removeprefix("http://").split("/", 1)[0].split(":")
        monkeypatch.setenv("AIRFLOW_CONN_OPS_JSON", json.dumps(
            {"conn_type": "http", "host": host, "port": int(port), "schema": "http", "extra": {"path": "/json"}}))
        done = Event("train_finished", "train demo run r1 ended success", train="demo", run_id="r1")
        assert send(cfg, led, done, once_for_run="demo/r1") == 1
        assert send(cfg, led, done, once_for_run="demo/r1") == 0  # the retry: already sent
        assert send(cfg, led, Event("train_finished", "train demo run r2 ended failed", train="demo", run_id="r2"),
                    once_for_run="demo/r2") == 1  # another run's is its own
        assert send(cfg, led, done) == 1  # unmarked sends are not held back
    assert [b["kind"] for b in got] == ["train_finished"] * 3 and [b["run_id"] for b in got] == ["r1", "r2", "r1"]
