"""The page at / and the offline API docs, in headless Chromium driven over the DevTools protocol."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving_registry import MOLECULE_NAME, SENSOR_NAME, serve, shared_registry

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"),
]


class Browser:
    """One page of a headless Chromium, driven with Runtime.evaluate."""

    def __init__(self, websocket):
        self.ws, self.next_id = websocket, 0

    def command(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str):
        result = self.command("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.1)
        return value

    def open(self, url: str) -> None:
        self.command("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Browser]:
    process = subprocess.Popen(
        ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline and process.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().splitlines()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json").json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None) as websocket:
            yield Browser(websocket)
    finally:
        process.terminate()
        process.wait(timeout=10)


API_KEY = "page-key"


@pytest.fixture(scope="module")
def browser_and_url(tmp_path_factory):
    """Chromium, the service without an API key, and the same service with one (the URL of each)."""
    registry = shared_registry(tmp_path_factory.getbasetemp())
    store = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion", registry.verify_key,
                      prefer_cuda=False)
    settings = dict(poll_seconds=3600, prefer_cuda=False, featurize_workers=1, monitor_seconds=0.5)
    with serve(create_app(ServingSettings(**settings), store=store)) as url, \
            serve(create_app(ServingSettings(**settings, api_key=API_KEY), store=store)) as guarded_url, \
            chromium(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser, url, guarded_url


def test_page_predicts_a_molecule_names_the_property_and_draws_it(browser_and_url):
    browser, url, _ = browser_and_url
    browser.open(url + "/")
    browser.wait_for("document.getElementById('models').innerText.includes('molecule')")  # model info loaded
    browser.evaluate("document.getElementById('smiles').value = 'c1ccccc1O\\nnot a molecule'")
    browser.evaluate("document.getElementById('predict-molecule').click()")
    browser.wait_for("document.querySelectorAll('#molecule-table img.molecule').length === 1 && "
                     "document.querySelector('#molecule-table img.molecule').complete && "
                     "document.querySelector('#molecule-table img.molecule').naturalWidth > 0")
    table = browser.evaluate("document.getElementById('molecule-table').innerText")
    assert f"{MOLECULE_NAME} version 1: solubility" in table and "solubility" in table.split("c1ccccc1O")[1]
    assert browser.evaluate("document.querySelectorAll('#molecule-table .error').length") == 1
    # the tests' card has no interval calibration: the spread is said to be one standard deviation
    assert "1 standard deviation" in browser.evaluate("document.getElementById('uncertainty-meaning').innerText")
    assert "in domain (nearest training similarity 1.000)" in table  # phenol is a training molecule


def test_page_says_what_the_interval_covers(browser_and_url):
    browser, url, _ = browser_and_url
    browser.open(url + "/")
    model = "{task: 'regression', interval: {z: 1.96, coverage: 0.95}}"
    assert browser.evaluate(f"uncertaintyMeaning({model})").startswith("± 95 % interval (value ± 1.96 × uncertainty")
    assert browser.evaluate(f"halfWidth({model}, 0.5)") == pytest.approx(0.98)


def test_page_plots_a_sensor_window_with_axes_and_its_failure_probability(browser_and_url):
    browser, url, _ = browser_and_url
    browser.open(url + "/")
    browser.wait_for("document.getElementById('window').value.split('\\n').length === 17")  # header + 16 steps
    browser.evaluate("document.getElementById('predict-sensor').click()")
    text = browser.wait_for("document.getElementById('sensor-probability')?.innerText")
    assert "failure probability" in text and f"{SENSOR_NAME} version 2" in text
    assert browser.evaluate("document.querySelectorAll('#plot path.channel').length") == 3
    titles = browser.evaluate("[...document.querySelectorAll('#plot .axis-title')].map(t => t.textContent)")
    assert titles == ["time step", "reading"]
    ticks = browser.evaluate("[...document.querySelectorAll('#plot .tick')].map(t => t.textContent)")
    assert {"0", "15"} <= set(ticks)


@pytest.mark.parametrize("window", ["a,b,c\\n1,2,high", "1,2,3\\n4,5,6"], ids=["not a number", "too short"])
def test_a_rejected_window_is_not_drawn(browser_and_url, window):
    browser, url, _ = browser_and_url
    browser.open(url + "/")
    browser.wait_for("document.getElementById('window').value.length > 0")
    browser.evaluate("document.getElementById('predict-sensor').click()")  # the example is drawn first
    browser.wait_for("document.getElementById('sensor-probability') !== null")
    browser.evaluate(f"document.getElementById('window').value = '{window}'")
    browser.evaluate("document.getElementById('predict-sensor').click()")
    message = browser.wait_for("document.querySelector('#sensor-result .error')?.innerText")
    assert "not a number" in message or "time steps" in message
    assert browser.evaluate("document.querySelectorAll('#plot path').length") == 0
    assert "NaN" not in browser.evaluate("document.getElementById('plot').innerHTML")


def test_with_an_api_key_the_example_window_needs_no_key(browser_and_url):
    browser, _, guarded_url = browser_and_url
    browser.open(guarded_url + "/")  # another origin than the open service's: no key stored for it
    browser.wait_for("document.getElementById('models').innerText.includes('401')")  # no key entered
    lines = browser.evaluate("document.getElementById('window').value").split("\n")
    assert lines[0] == "vibration,temperature,pressure" and len(lines) == 17


def test_the_monitoring_panel_loads_with_the_api_key_entered(browser_and_url):
    browser, _, guarded_url = browser_and_url
    browser.open(guarded_url + "/")
    browser.wait_for("document.querySelector('#monitoring-result .error')?.innerText.includes('401')")
    key = "document.getElementById('api-key')"
    browser.evaluate(f"{key}.value = '{API_KEY}'; {key}.dispatchEvent(new Event('change'))")
    try:
        browser.wait_for("(document.getElementById('refresh-monitoring').click(), "
                         "document.querySelectorAll('#monitoring-result table.drift tr.channel').length === 3 && "
                         "document.querySelector('#monitoring-result .domain') !== null)")
        panel = browser.evaluate("document.getElementById('monitoring-result').innerText")
        assert f"sensor: {SENSOR_NAME} version 2" in panel and f"molecule: {MOLECULE_NAME} version 1" in panel
        assert "vibration" in panel and "applicability domain" in panel
    finally:
        browser.evaluate("localStorage.removeItem('serving-api-key')")


def test_api_docs_render_offline(browser_and_url):
    browser, url, _ = browser_and_url
    browser.open(url + "/docs")
    browser.wait_for("document.querySelectorAll('.opblock').length > 0")
    assert browser.evaluate("document.body.innerText").count("/v1/sensor/predict") >= 1
