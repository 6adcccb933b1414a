"""Browser-test fixtures: the dashboard as a real server on 127.0.0.1, driven by Debian's Chromium.

Playwright never downloads a browser here: it is pointed at /usr/bin/chromium. Without Chromium the tests
skip locally and fail under CI (env CI set), so CI cannot silently lose them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# tests/, the root conftest's folder, is on sys.path
from app_server import copy_built_models, end_process, free_port, wait_http

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SQLENV_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"

# A tiny, quick config for the Train form: GRPO on builtin:tiny with short episodes (short completions keep a
# step to about a second on 2 busy cores), metrics every step, a trace every 2 steps, no periodic eval, and a
# two-question comparison at the end. No SFT, no validation panel or KL probe (64 questions before GRPO's first step,
# which most tests wait for): the tests check the dashboard, not learning or its health. max_steps is far
# beyond what a test waits for: the run must still be training when a test stops it, however fast the host.
TEST_CONFIG = {
    "model": "builtin:tiny",
    "dataset": "builtin",
    "step_budget": 2,
    "num_generations": 2,
    "per_device_train_batch_size": 2,
    "max_steps": 5000,
    "max_completion_length": 48,
    "max_turn_tokens": 16,
    "plot_every": 1,
    "trace_every": 2,
    "eval_every": 0,
    "eval_episodes": 0,
    "comparison_episodes": 2,
    "compare_base": False,
    "sft": False,
    "validation_questions": 0,
    "kl_probe_episodes": 0,
}


def _chromium_or_skip() -> str:
    if shutil.which(CHROMIUM) or Path(CHROMIUM).is_file():
        return CHROMIUM
    message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    return _chromium_or_skip()


@pytest.fixture(scope="session")
def dashboard(chromium_path):
    """(url, runs_dir, data_dir): `python app.py` in a subprocess on a free port with its own runs and data."""
    pytest.importorskip("playwright.sync_api")
    # Our own temp folder, not pytest's numbered tmp dirs: a concurrent pytest session prunes those.
    root = Path(tempfile.mkdtemp(prefix="sqlenv-dashboard-"))
    runs, data = root / "runs", root / "data"
    runs.mkdir()
    data.mkdir()
    copy_built_models(runs)  # the built tiny model, reused instead of rebuilt
    config = root / "test_config.json"
    config.write_text(json.dumps(TEST_CONFIG))
    port = free_port()
    env = dict(os.environ, SQLENV_RUNS_DIR=str(runs), SQLENV_DATA_DIR=str(data), GRADIO_ANALYTICS_ENABLED="False",
               PYTHONUNBUFFERED="1")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log_path = SCREENSHOTS.parent / "browser-app.log"  # kept for post-mortems (artifacts/ is gitignored)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), "--config", str(config)],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http(url, proc)
        yield {"url": url, "runs": runs, "data": data, "log": log_path, "proc": proc}
    finally:
        end_process(proc)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def _screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    # A dropdown just picked from keeps its option list open while it has focus (and fades it out after):
    # close it so the picture shows the page, not a half-transparent list over it.
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(400)
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture(scope="session")
def screenshot():
    """`screenshot(page, name)` saves a full-page PNG under artifacts/screenshots/ (gitignored)."""
    return _screenshot
