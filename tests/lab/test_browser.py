"""The widgets in a real JupyterLab, in a real browser: Debian's chromium, headless, driven by Selenium.

JupyterLab runs on a loopback port with a token and the FusionLab kernel; the notebook (tiny models) shows the
layer-map editor and the attention layer/head view. The test changes a control in each and checks that what the
browser shows changed; a screenshot goes to figures/quick/browser_widgets.png.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fusionlab.paths import figures_dir

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [pytest.mark.notebook,
              pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                 reason="chromium / chromedriver not installed: the README's test command installs "
                                        "them with apt where it runs as root (apt-get install chromium chromium-driver)")]

CELLS = [
    "import fusionlab as fl\n"
    "from fusionlab.analysis.widgets import layer_map_widget\n"
    "m, s = fl.load('tiny-qwen2'), fl.load('tiny-llama')\n"
    "w = layer_map_widget(m, s)\n"
    "w.box",
    "from fusionlab.analysis.attention_capture import token_labels\n"
    "from fusionlab.analysis.attention_views import interactive_view\n"
    "text = 'The river conference will be held in Lisbon; the harbour decided it.'\n"
    "with fl.capture_attention(m) as cap:\n"
    "    m.model(m.encode(text))\n"
    "interactive_view(cap, token_labels(m, text))",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def lab(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "FusionLab (.venv)", "language": "python", "name": "fusionlab"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    root = tmp_path / "lab"
    root.mkdir()
    nbformat.write(nb, root / "widgets.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    jupyter = Path(sys.executable).parent / "jupyter"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    proc = subprocess.Popen([str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                             f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}",
                             "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False",
                             "--allow-root", "--LabApp.extension_manager=readonly"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.terminate()
        pytest.fail("jupyter lab did not start within 60 s")
    yield base, token
    proc.terminate()
    proc.wait(timeout=20)


def test_widgets_render_and_respond_in_a_real_browser(lab):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    base, token = lab
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1600"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    wait = WebDriverWait(driver, 180, poll_frequency=0.5)
    try:
        driver.get(f"{base}/lab/tree/widgets.ipynb?token={token}")
        wait.until(lambda d: d.execute_script(
            "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.name === 'fusionlab');"))
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".widget-dropdown select")) >= 3)
        wait.until(lambda d: "mapped layers" in d.find_element(By.TAG_NAME, "body").text)
        selects = driver.find_elements(By.CSS_SELECTOR, ".widget-dropdown select")
        strategy, layer = selects[0], selects[1]

        def message() -> str:
            return next(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".widget-html")
                        if "mapped layers" in e.text or "out of range" in e.text)

        def strip() -> str:
            return driver.execute_script(
                "return [...document.querySelectorAll('.widget-html')].map(e => e.innerHTML)"
                ".find(h => h.includes('rgba(220,60,40')) || '';")

        before_map, before_strip = message(), strip()
        assert before_map == "3 mapped layers" and before_strip  # proportional map of 4 x 3 layers; a token strip
        Select(strategy).select_by_visible_text("stride")
        wait.until(lambda d: message() != before_map)
        assert message() == "2 mapped layers"  # stride 2: slave layers 0, 1 -> master layers 0, 2
        Select(layer).select_by_visible_text("3")
        wait.until(lambda d: strip() != before_strip)  # layer 3's weights, not layer 0's
        out = figures_dir() / "quick"
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / "browser_widgets.png"))
        assert (out / "browser_widgets.png").stat().st_size > 10_000
    finally:
        driver.quit()
