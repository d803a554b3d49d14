"""The Railyard page in a real browser: Debian's headless Chromium through Selenium, on a real
`airflow standalone` and the simulator (one Stack for the module). Logged in as Airflow users through
Airflow's own login form; the page is the plugin's, served by the api-server. Screenshots of each step
land in the test's tmp dir (and the one after the train in docs/img/railyard-page.png). A real Prometheus
(Debian's) scrapes the api-server's `/railyard/metrics` every second with the scrape token throughout."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from railyard.devstack.stack import Stack, free_port
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.browser import chromium
from tests.support.browser import login as browser_login
from tests.support.configs import small_config, write_config
from tests.support.prometheus import PrometheusServer
from tests.support.waiting import until as _until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
FAILS = "gpu-b01"  # the one host whose deep check is made to fail
SCRAPE_TOKEN = "e2e-scrape-token-9f3c1d"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    data = small_config(domains=3, hosts_per_domain=2, speed=120, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                        host_failure_per_hour=0.0, trains=[
                            # pod-b (one host, failing) comes first: 1 of 1 failed must not halt the train
                            {"id": "demo", "releases": ["driver-570", "firmware-96"], "max_failure_fraction": 1.0},
                            {"id": "kernel", "releases": ["kernel-6-1-28"], "domains": ["pod-a", "pod-c"]},
                        ])
    data["domains"][1]["hosts"] = FAILS  # pod-b: one host, so exactly it fails its check
    data["simulator"]["jobs"] = {"count": 1, "hosts_per_job": 2, "checkpoint_interval_s": 1800,
                                 "checkpoint_duration_s": 30}
    data["timeouts"]["poll_s"] = 0.25
    cfg = write_config(tmp / "railyard.yaml", data)
    s = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port(),
              extra_env={"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
                         "RAILYARD_METRICS_TOKEN": SCRAPE_TOKEN})
    s.start_sim()
    try:
        s.start_airflow()
        s.ensure_pool()
        for d in ("railyard_train_demo", "railyard_train_kernel"):
            s.wait_dag(d)
        s.shots = tmp / "screenshots"  # type: ignore[attr-defined]
        s.shots.mkdir()  # type: ignore[attr-defined]
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def prom(stack):
    server = PrometheusServer(stack.home / "prometheus", target=stack.api.removeprefix("http://"),
                              path="/railyard/metrics", token=SCRAPE_TOKEN)
    server.start()
    try:
        until("Prometheus scraping Railyard", lambda: server.one('up{job="railyard"}') == 1, timeout=60)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(stack):
    driver = chromium(stack.home / "chromium")
    try:
        yield driver
    finally:
        driver.quit()


def until(what, probe, timeout: float = 120, every: float = 0.3):  # noqa: ANN001, ANN201
    return _until(what, probe, timeout, every)


def ledger(stack: Stack) -> Ledger:
    return Ledger(f"sqlite:///{stack.home}/ledger.db")


def maintenance_out(led: Ledger) -> dict[str, str]:
    """Domains out for maintenance (a repair's hold on its host's domain takes no maintenance slot)."""
    return {d: op for d, op in led.domains_out().items() if not op.startswith("repair/")}


def login(driver, stack: Stack, user: str) -> None:  # noqa: ANN001
    browser_login(driver, stack.api, user, stack.password_of(user))


def open_page(driver, stack: Stack) -> None:  # noqa: ANN001
    driver.get(f"{stack.api}/railyard/")
    until("the page's first refresh", lambda: driver.execute_script("return document.body.dataset.updated"))


def click(driver, css: str) -> None:  # noqa: ANN001
    """Click what `css` selects, once the page shows it. The page redraws itself every few seconds: an element
    found just before a redraw is gone ("stale") when clicked, so it is found again; one that a later refresh
    brings (a run that just ended, in the Runs panel) is waited for."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def attempt() -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False

    until(f"a click on {css}", attempt, timeout=20, every=0.1)


def text_of(driver, css: str) -> str:  # noqa: ANN001
    """The text of what `css` selects; "" while the page redraws it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)
    except StaleElementReferenceException:
        return ""


def page_js(driver, script: str):  # noqa: ANN001, ANN201
    return driver.execute_script(script)


def shot(driver, stack: Stack, name: str) -> Path:  # noqa: ANN001
    path = stack.shots / f"{name}.png"  # type: ignore[attr-defined]
    driver.save_screenshot(str(path))
    return path


def test_a_request_not_logged_in_is_refused(stack) -> None:
    for path in ("/railyard/", "/railyard/api/overview", "/railyard/api/hosts/gpu-a01"):
        assert requests.get(f"{stack.api}{path}", timeout=10).status_code == 401, path
    r = requests.post(f"{stack.api}/railyard/api/freeze", json={"on": True, "reason": "nobody logged in here"},
                      timeout=10)
    assert r.status_code == 401
    assert ledger(stack).switch("freeze") is None
    # the plugin's page is in Airflow's navigation
    plugins = stack.rest("GET", "/plugins")["plugins"]
    views = [v for p in plugins for v in p["external_views"]]
    assert ({"name": "Railyard", "href": "/railyard/"}.items()
            <= next(v for v in views if v["name"] == "Railyard").items())


def test_the_trains_carry_airflow_s_own_schedule(stack) -> None:
    """Paused or not, and the next scheduled run, come from Airflow's records of the train DAGs (a bearer
    token from Airflow's own login works as the page's cookie does)."""
    h = {"Authorization": f"Bearer {stack.token()}"}
    ts = {t["id"]: t for t in requests.get(f"{stack.api}/railyard/api/trains", headers=h, timeout=30).json()}
    assert ts["demo"]["paused"] is False and ts["kernel"]["paused"] is False  # the stack creates DAGs unpaused
    assert ts["demo"]["next_run"] is None and ts["kernel"]["next_run"] is None  # no schedule: no next run
    stack.rest("PATCH", "/dags/railyard_train_kernel", json={"is_paused": True})
    try:
        ts = {t["id"]: t for t in requests.get(f"{stack.api}/railyard/api/trains", headers=h, timeout=30).json()}
        assert ts["kernel"]["paused"] is True and ts["demo"]["paused"] is False
    finally:
        stack.rest("PATCH", "/dags/railyard_train_kernel", json={"is_paused": False})


def test_the_page_follows_a_train(stack, browser, prom) -> None:
    from selenium.webdriver.common.by import By

    fleet = stack.fleet()
    login(browser, stack, "admin")
    browser.get(f"{stack.api}/plugin/railyard")  # the page inside Airflow's UI (an iframe under the nav)
    until("the page in Airflow's UI", lambda: browser.find_elements(By.TAG_NAME, "iframe"), timeout=60)
    time.sleep(2)
    shot(browser, stack, "0-in-airflow-nav")
    open_page(browser, stack)
    # the one job (on gpu-a02 and gpu-b01) asks that pod-a not be taken for 2,400 fleet seconds (20 s here):
    # pod-a is postponed and visited last, in the revisit slot; pod-b, first, has its only host fail its check
    [job] = fleet.jobs()
    assert set(job.hosts) == {"gpu-a02", FAILS}, job
    fleet.set_job(job.id, dodge_until=fleet.now() + 2400)
    fleet.settings(check_fail_rate=1.0)
    run = stack.trigger("railyard_train_demo")
    led = ledger(stack)
    out = until("a domain leased", lambda: maintenance_out(led), timeout=180)
    domain = next(iter(out))

    def page_shows_it_out():
        return page_js(browser, f"""const d = document.querySelector('.dom[data-domain="{domain}"]');
            const line = document.getElementById('capacity-line');
            return d && d.classList.contains('out') && line && +line.dataset.now < 1 ? +line.dataset.now : null""")

    now = until(f"the page shows {domain} out and capacity below 1", page_shows_it_out, timeout=30)
    assert 0 < now < 1
    # Prometheus, scraping the api-server, sees what the ledger holds now: the domain out, its hosts leased,
    # the serving fraction of the fleet as the stop's drain read it
    selector = f'railyard_domain_out{{domain="{domain}",op_kind="train_stop"}}'
    until(f"Prometheus sees {domain} out", lambda: prom.one(selector) == 1 and prom.one("railyard_domains_out") == 1,
          timeout=30)

    def serving_as_the_ledger_holds_it() -> bool:
        rows, at = led.fleet_counts()
        [sku] = {a for k, a, _b, _n in rows if k == "state"} or {None}
        states = {b: n for k, _a, b, n in rows if k == "state"}
        fraction = states.get("serving", 0) / max(sum(states.values()), 1)
        return at is not None and fraction < 1 and prom.one(f'railyard_serving_fraction{{sku="{sku}"}}') == fraction

    until("Prometheus's serving fraction is the ledger's", serving_as_the_ledger_holds_it, timeout=60)

    def leased_as_the_ledger_holds_it() -> bool:
        held = len([op for op in led.holdings().values() if not op.startswith("repair/")])
        return held > 0 and prom.one('railyard_hosts_leased{op_kind="train_stop"}') == held

    until("Prometheus's leased hosts are the ledger's", leased_as_the_ledger_holds_it, timeout=30)
    shot(browser, stack, "1-during-the-train")
    # pod-b's only host fails its deep check; the rate is cleared once it is in repair
    until(f"{FAILS} in repair", lambda: fleet.hosts([FAILS])[0].state == HostState.REPAIR, timeout=300)
    fleet.settings(check_fail_rate=0.0)
    assert stack.wait_run("railyard_train_demo", run, timeout=600) in ("success", "failed")
    for h in fleet.hosts():
        assert h.state == (HostState.REPAIR if h.name == FAILS else HostState.SERVING), h
    # the counters after the train, as the ledger counts them; a scrape without the token is refused
    done = len([o for o in led.operations_like("demo/") if o["kind"] == "train_stop" and o["state"] == "done"])
    until("Prometheus counts the train's stops", lambda: prom.one(
        'railyard_stops_total{train="demo",outcome="done"}') == done > 0, timeout=30)
    until("Prometheus counts the offboard", lambda: prom.one("sum(railyard_hosts_offboarded_total)") == 1, timeout=30)
    assert prom.one("railyard_domains_out") == 0
    assert requests.get(f"{stack.api}/railyard/metrics", timeout=10).status_code == 401
    scrape = requests.get(f"{stack.api}/railyard/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"},
                          timeout=10)
    check = subprocess.run(["promtool", "check", "metrics"], input=scrape.text, capture_output=True, text=True,
                           timeout=60)
    assert scrape.status_code == 200 and check.returncode == 0, check.stdout + check.stderr

    def page_after():
        return page_js(browser, """const hs = [...document.querySelectorAll('.host')];
            const off = document.querySelector('[data-offboarded]');
            const bad = hs.filter(h => h.dataset.state !== 'serving').map(h => h.dataset.host);
            return off && !document.querySelector('.dom.out') ? {bad, text: off.textContent} : null""")

    after = until("the page after the run", page_after, timeout=30)
    assert after["bad"] == [FAILS], after
    reason = fleet.hosts([FAILS])[0].reason
    assert reason and reason in after["text"], (reason, after)
    # a host's history on click: its failed check with the evidence
    click(browser, f'.host[data-host="{FAILS}"]')
    until("the host history", lambda: "FAILED" in text_of(browser, "#history"), timeout=20)
    path = shot(browser, stack, "2-after-the-train")
    (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ROOT / "docs" / "img" / "railyard-page.png")
    check_the_run_report(stack, browser, run, fleet)
    # the emergency button shows the selection as the form's conf and opens railyard_emergency's page
    # (Airflow 3.3.2 has no URL that opens its trigger form pre-filled: /dags/<id>/trigger/single is a 404)
    click(browser, '.dom[data-domain="pod-c"] .name')
    click(browser, "#emergency")
    conf = browser.find_element(By.ID, "emergency-conf").text
    assert '"domains":["pod-c"]' in conf and f'"hosts":["{FAILS}"]' in conf and '"dry_run":true' in conf, conf
    until("the emergency DAG's page", lambda: browser.current_url.endswith("/dags/railyard_emergency"), timeout=30)
    until("the DAG's page rendered", lambda: "railyard_emergency" in browser.find_element(By.TAG_NAME, "body").text,
          timeout=30)
    assert "Page Not Found" not in browser.find_element(By.TAG_NAME, "body").text
    shot(browser, stack, "3-emergency-dag")


def check_the_run_report(stack: Stack, browser, run: str, fleet) -> None:  # noqa: ANN001
    """The train's report, as the page's API, Airflow's REST API (the last task's XCom) and `railyard report`
    give it: every host the run touched with its outcome, pod-a's dodge and revisit, gpu-b01's evidence."""
    reason = fleet.hosts([FAILS])[0].reason
    key = f"demo/{run}"
    h = {"Authorization": f"Bearer {stack.token()}"}
    listed = requests.get(f"{stack.api}/railyard/api/runs", headers=h, timeout=30).json()
    assert [r for r in listed if r["run"] == key and r["grid"] == f"/dags/railyard_train_demo/runs/{run}"], listed
    page = requests.get(f"{stack.api}/railyard/api/runs/{key}", headers=h, timeout=30).json()
    xcom = stack.rest("GET", f"/dags/railyard_train_demo/dagRuns/{run}/taskInstances/end_run/xcomEntries/return_value")
    cli = subprocess.run([str(ROOT / ".venv" / "bin" / "railyard"), "report", key, "--json"], env=stack.env(),
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    value = json.loads(xcom["value"]) if isinstance(xcom["value"], str) else xcom["value"]
    for seen in (page, value["report"] if isinstance(value, dict) else None, json.loads(cli.stdout)):
        assert seen is not None, xcom
        assert set(seen["hosts"]) == {"gpu-a01", "gpu-a02", FAILS, "gpu-c01", "gpu-c02"}, seen["hosts"]
        for name, host in seen["hosts"].items():
            want = "to repair" if name == FAILS else "upgraded"
            assert host["outcome"] == want, (name, host)
        assert reason and reason in seen["hosts"][FAILS]["evidence"], (reason, seen["hosts"][FAILS])
        [a] = [st for st in seen["stops"] if st["domain"] == "pod-a"]
        assert a["dodged"] and a["revisit"] and a["state"] == "done", a
        assert seen["summary"]["revisits"] == 1 and seen["summary"]["to_repair"] == 1
        assert seen["jobs"]["asked_to_checkpoint"] == ["job-01"]
        assert seen["run"]["triggered_by"] == "admin" and seen["run"]["outcome"] in ("success", "failed")
    # the page's Runs panel: the run, and its report on click
    click(browser, f'#runs a[data-run="{key}"]')
    until("the run's report on the page", lambda: page_js(
        browser, f"""const r = document.querySelector('#report-hosts tr[data-host="{FAILS}"]');
                     return r ? r.dataset.outcome : null""") == "to repair", timeout=30)
    shot(browser, stack, "2b-run-report")


def test_a_viewer_reads_the_page_but_may_not_act(stack, browser) -> None:
    from selenium.webdriver.common.by import By

    login(browser, stack, "viewer")
    open_page(browser, stack)
    assert page_js(browser, "return document.querySelectorAll('.host').length") == 5
    browser.find_element(By.ID, "reason").send_keys("viewer wants a freeze")
    browser.find_element(By.ID, "freeze-on").click()
    until("the refusal shown", lambda: "HTTP 403" in text_of(browser, "#msg"), timeout=20)
    shot(browser, stack, "4-viewer-refused")
    led = ledger(stack)
    assert led.switch("freeze") is None
    refused = [a for a in led.audit_rows(limit=100000) if a["action"] == "ui_refused"]
    assert refused and refused[-1]["actor"] == "viewer" and "viewer wants a freeze" in refused[-1]["reason"]


def test_freeze_from_the_page_stops_a_train_at_the_next_domain_boundary(stack, browser) -> None:
    from selenium.webdriver.common.by import By

    login(browser, stack, "admin")
    open_page(browser, stack)
    led = ledger(stack)
    fleet = stack.fleet()
    run = stack.trigger("railyard_train_kernel")
    until("pod-a leased", lambda: "pod-a" in led.domains_out(), timeout=180)
    browser.find_element(By.ID, "reason").send_keys("freeze for the launch event")
    browser.find_element(By.ID, "freeze-on").click()
    until("freeze on", lambda: led.switch("freeze"), timeout=20)
    assert led.switch("freeze")["actor"] == "admin"
    # the stop in flight finishes; the next domain is not taken while the freeze is on
    until("pod-a back", lambda: not maintenance_out(led), timeout=300)
    assert all(h.state == HostState.SERVING for h in fleet.hosts(["gpu-a01", "gpu-a02"]))
    time.sleep(8)
    assert maintenance_out(led) == {}
    assert stack.run_state("railyard_train_kernel", run) == "running"
    assert all(h.versions["kernel"] == "6.1.0-25" for h in fleet.hosts(["gpu-c01", "gpu-c02"]))
    until("the page shows the freeze", lambda: "FROZEN" in text_of(browser, "#freeze"), timeout=20)
    shot(browser, stack, "5-frozen")
    browser.find_element(By.ID, "reason").clear()
    browser.find_element(By.ID, "reason").send_keys("launch is over, thaw")
    browser.find_element(By.ID, "freeze-off").click()
    until("freeze off", lambda: led.switch("freeze") is None, timeout=20)
    assert stack.wait_run("railyard_train_kernel", run, timeout=600) == "success"
    assert all(h.versions["kernel"] == "6.1.0-28" for h in fleet.hosts(["gpu-c01", "gpu-c02"]))
