"""The planner's web page in a real browser: Debian's headless Chromium, driven by selenium
through chromium-driver, against a real control plane (`loomd --standalone`, two CPU ranks).

1. The jobs page loads and lists a running train job with its state.
2. The job's page draws its loss curve, and the curve gains points as the job trains; its ranks,
   memory per rank, events and rank 0's log are shown.
3. `loomctl cancel` of the job: the page shows CANCELLED.
A screenshot of the job's page is kept as a test artifact (--artifacts, default
<bin>/../test-artifacts/web-page.png).

  python3 tests/oracles/web_page_test.py --bin build/bin
"""
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import ControlPlane, bin_and_artifacts, check, exit_code, small_llama  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(DRIVER))


def wait_for(what, predicate, timeout=120):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = predicate()
        except Exception as e:  # the element is being redrawn: try again
            last = e
            continue
        if last:
            return last
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what} (last: {last})")


def points(driver, metric):
    charts = driver.find_elements(By.CSS_SELECTOR, f'.chart[data-metric="{metric}"]')
    return int(charts[0].get_attribute("data-points")) if charts else 0


def main():
    bin_dir, artifacts = bin_and_artifacts("the screenshot")
    for path in (CHROMIUM, DRIVER):
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: scripts/setup installs chromium and chromium-driver")

    with tempfile.TemporaryDirectory() as work:
        plane = ControlPlane(bin_dir, work)
        driver = None
        try:
            # Slow enough that the page sees it run: a few steps a second.
            job = plane.submit(small_llama(bin_dir, work, steps=100000, name="web-page"))
            url = f"http://{plane.http_address()}/"
            driver = browser()

            # Without a token the page asks for one; given, it shows the jobs.
            driver.get(url)
            field = wait_for("the sign-in form", lambda: driver.find_element(By.ID, "token"))
            check("bearer token" in driver.find_element(By.ID, "sign-in").text, "the page asks for a token")
            field.send_keys("loom_wrong")
            field.submit()
            wait_for("the refusal", lambda: "not one this planner knows" in driver.find_element(By.ID, "sign-in").text)
            check(True, "a wrong token is refused on the page, saying why")
            field = driver.find_element(By.ID, "token")
            field.send_keys(plane.token())
            field.submit()
            row = wait_for("the job's row", lambda: driver.find_element(By.CSS_SELECTOR, f'tr[data-job="{job}"]'))
            check(row is not None, f"the jobs page lists {job}")
            wait_for("RUNNING in the jobs table", lambda: "RUNNING" in driver.find_element(
                By.CSS_SELECTOR, f'tr[data-job="{job}"]').text)
            check(True, "the jobs table shows the job RUNNING")

            driver.find_element(By.LINK_TEXT, job).click()
            first = wait_for("the loss curve's first points", lambda: points(driver, "loss"))
            check(first > 0, f"the job's page draws a loss curve ({first} points)")
            more = wait_for("the curve to gain points", lambda: points(driver, "loss") > first and points(driver, "loss"))
            check(more > first, f"the curve gains points as the job trains ({first} -> {more})")
            check(driver.find_element(By.ID, "job-state").text == "RUNNING", "the job's state reads RUNNING")
            check(len(driver.find_elements(By.CSS_SELECTOR, "#ranks tbody tr")) == 2, "the ranks table has both ranks")
            memory = driver.find_element(By.ID, "memory").text.lower()  # (headers are shown in capitals)
            check("optimizer state" in memory and ("mib" in memory or "kib" in memory),
                  "memory per rank is shown (optimizer state, in bytes' units)")
            log = wait_for("rank 0's log", lambda: "step" in driver.find_element(By.ID, "log").text and
                           driver.find_element(By.ID, "log").text)
            check("loss" in log, "the tail of rank 0's log is shown")
            driver.save_screenshot(os.path.join(artifacts, "web-page.png"))
            check(os.path.getsize(os.path.join(artifacts, "web-page.png")) > 10000,
                  f"a screenshot is kept: {os.path.join(artifacts, 'web-page.png')}")

            r = plane.ctl("cancel", job, "--reason", "the web page test is done")
            check(r.returncode == 0, "loomctl cancel")
            state = wait_for("CANCELLED on the page",
                             lambda: driver.find_element(By.ID, "job-state").text == "CANCELLED" and "CANCELLED")
            check(state == "CANCELLED", "the job's page shows CANCELLED")
            events = driver.find_element(By.ID, "events").text
            check("the web page test is done" in events, "the events table gives the cancel's reason")
            driver.save_screenshot(os.path.join(artifacts, "web-page-cancelled.png"))

            driver.get(url + "#/nodes")
            nodes = wait_for("the nodes table", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#nodes tbody tr"))
                             and driver.find_element(By.ID, "nodes").text)
            check("yes" in nodes, "the nodes page lists the connected node")
            # Chromium logs the sign-in's two 401s (no token, a wrong one): those were asked for.
            logged = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
            browser_errors = [e for e in logged if "status of 401" not in e.get("message", "")]
            check(len(logged) - len(browser_errors) == 2 and not browser_errors,
                  f"the browser logged no errors but the sign-in's two 401s ({logged[:3]})")
        finally:
            if driver:
                driver.quit()
            plane.close()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
