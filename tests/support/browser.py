"""Debian's headless Chromium through Selenium, logged in through Airflow's own login form
(SimpleAuthManager): the Railyard page's e2e tests and bench/bench_grid.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def chromium(profile: Path, *, size: str = "1400,1300", script_timeout: float = 30) -> Any:
    """A headless Chromium with its own profile folder (chromium and chromium-driver: `make deps`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", f"--window-size={size}",
              f"--user-data-dir={profile}"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(script_timeout)
    return driver


def login(driver: Any, api: str, user: str, password: str | None, timeout: float = 60) -> None:
    """Airflow's login form: two inputs, then the sign-in button; done when the `_token` cookie is set."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{api}/")
    deadline = time.monotonic() + timeout
    while True:
        inputs = [i for i in driver.find_elements(By.TAG_NAME, "input") if i.is_displayed()][:2]
        if len(inputs) == 2:
            break
        if time.monotonic() > deadline:
            raise AssertionError("Airflow's login form never showed")
        time.sleep(0.3)
    inputs[0].send_keys(user)
    inputs[1].send_keys(password or "")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    while driver.get_cookie("_token") is None:
        if time.monotonic() > deadline + timeout:
            raise AssertionError(f"{user} was not logged in")
        time.sleep(0.3)
