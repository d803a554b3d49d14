"""Events through Airflow's notifiers: a train under `dag.test()` on the simulator server, its `notify:` routes to
a Slack webhook connection (the Slack provider's own `SlackWebhookNotifier`, posting to a local server that
records every request), an `http` connection (Railyard's JSON POST) and one that cannot be reached."""

from __future__ import annotations

import json
import threading
import time

import pytest

from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config
from tests.support.webhook import webhook_server

SLACK_TOKEN = "T0000/B0000/sEcReTsLaCkPaTh"
FAILS = "gpu-b01"  # pod-b's only host: the one whose deep check is made to fail


@pytest.fixture
def hooks():
    with (webhook_server("/slack", must_hold=SLACK_TOKEN, answer=(200, b"ok")) as slack,
          webhook_server("/json") as plain):
        yield slack, plain


def test_each_event_of_a_train_with_an_offboarded_host_is_one_message(train_env, hooks, monkeypatch, tmp_path) -> None:
    (slack_url, slack_got), (json_url, json_got) = hooks
    base = slack_url.rsplit("/slack", 1)[0]
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_OPS", json.dumps(
        {"conn_type": "slackwebhook", "host": base, "password": f"/slack/{SLACK_TOKEN}"}))
    host, port = json_url.removeprefix("http://").split("/", 1)[0].split(":")
    monkeypatch.setenv("AIRFLOW_CONN_OPS_JSON", json.dumps(
        {"conn_type": "http", "host": host, "port": int(port), "schema": "http", "extra": {"path": "/json"}}))
    monkeypatch.setenv("AIRFLOW_CONN_GONE_HOOK", json.dumps(
        {"conn_type": "http", "host": "127.0.0.1", "port": 9, "schema": "http"}))
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["domains"][1]["hosts"] = FAILS
    data["notify"] = [{"connection": "slack_ops"},
                      {"connection": "ops_json", "events": ["host_offboarded", "stop_done"]},
                      {"connection": "gone_hook", "events": ["stop_done"]}]
    _stack, fleet, tmp = train_env(data)

    def fail_pod_bs_check() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if "pod-b" in fleet.capacity().domains_out:
                fleet.settings(check_fail_rate=1.0)
                while time.monotonic() < deadline and fleet.hosts([FAILS])[0].state != HostState.REPAIR:
                    time.sleep(0.05)
                fleet.settings(check_fail_rate=0.0)
                return
            time.sleep(0.05)

    t = threading.Thread(target=fail_pod_bs_check)
    t.start()
    dr = load_dag("railyard_train_demo").test()
    t.join()
    assert dr.state == "success", states(dr)
    reason = fleet.hosts([FAILS])[0].reason
    assert reason and fleet.hosts([FAILS])[0].state == HostState.REPAIR

    texts = [b["text"] for b in slack_got]
    kinds = {"started": [t for t in texts if " started " in t],
             "offboarded": [t for t in texts if "offboarded to repair:" in t],
             "done": [t for t in texts if "stop of" in t], "ended": [t for t in texts if " ended " in t]}
    assert len(texts) == 1 + 1 + 3 + 1, texts  # started, one offboard, three stops, finished: each once
    assert [len(v) for v in kinds.values()] == [1, 1, 3, 1], kinds
    assert kinds["started"][0].startswith("train demo started")
    assert kinds["offboarded"][0] == f"train demo: {FAILS} in pod-b offboarded to repair: {reason}"
    assert sorted(t.split("stop of ")[1].split(" ")[0] for t in kinds["done"]) == ["pod-a", "pod-b", "pod-c"]
    assert "1 in repair" in next(t for t in kinds["done"] if "pod-b" in t)
    assert kinds["ended"][0].startswith("train demo run ") and "1 offboarded to repair" in kinds["ended"][0]
    assert " ended success: " in kinds["ended"][0]  # with the outcome of the run's report
    assert all(SLACK_TOKEN not in t for t in texts)

    # the http route: Railyard's JSON, only the events it asked for
    assert sorted(b["kind"] for b in json_got) == ["host_offboarded", "stop_done", "stop_done", "stop_done"]
    off = next(b for b in json_got if b["kind"] == "host_offboarded")
    assert (off["train"], off["domain"], off["host"], off["reason"]) == ("demo", "pod-b", FAILS, reason)

    # the unreachable one failed every time, failed nothing, and is counted in the audit without its URL
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    failed = [r for r in led.audit_rows(limit=None) if r["action"] == "notify_failed"]
    assert len(failed) == 3 and all(r["reason"].startswith("stop_done via gone_hook: ") for r in failed), failed
    assert all(SLACK_TOKEN not in r["reason"] for r in led.audit_rows(limit=None))
