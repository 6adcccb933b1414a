"""A public dashboard in a real browser: a visitor watches the live run but cannot start or stop it; the owner
logs in with the password (SQLENV_ADMIN_PASSWORD) and controls the run, across a reload.

Its own app server in password mode (the Hub login of a Space is tested without the Hub in
tests/test_access_api.py). Screenshots go to artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import json

import pytest

from app_server import serve

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "a long owner password"
# A tiny run (as in conftest.TEST_CONFIG): the test watches a few steps, then stops it long before max_steps. No
# validation panel and no KL probe (tests/test_validation.py's): the test reads the live run, not its health, and the
# panel's 64 questions at GRPO's step 0 only delayed the first step it waits for.
CONFIG = {"model": "builtin:tiny", "dataset": "builtin", "step_budget": 2, "num_generations": 2,
          "per_device_train_batch_size": 2, "max_steps": 5000, "max_completion_length": 48, "max_turn_tokens": 16,
          "plot_every": 1, "trace_every": 2, "eval_every": 0, "eval_episodes": 0, "comparison_episodes": 2,
          "compare_base": False, "sft": False, "validation_questions": 0, "kl_probe_episodes": 0}


@pytest.fixture(scope="module")
def owned_app(chromium_path):
    pytest.importorskip("playwright.sync_api")
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD}, config=CONFIG, log_name="owned") as app:
        yield app


def owner_state(page) -> str:
    page.wait_for_function("() => document.querySelector('#owner-state') !== null")
    return page.locator("#owner-state").get_attribute("data-owner")


def wait_owner(page, value: str) -> None:
    page.wait_for_function(f"() => document.querySelector('#owner-state')?.dataset.owner === '{value}'")


def controls_disabled(page) -> list[bool]:
    return [page.locator(sel).is_disabled() for sel in ("#train-start", "#train-stop", "#cfg-max_steps input")]


def run_dirs(app):
    return sorted(p.name for p in app["runs"].iterdir() if p.name != "models")


def test_visitor_watches_and_the_owner_controls_the_run(owned_app, browser, screenshot):
    url = owned_app["url"]
    visitor = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    owner = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    for page in (visitor, owner):
        page.set_default_timeout(30_000)
    try:
        # A visitor: told what they may do, the Train controls greyed out, and a forced click starts nothing.
        visitor.goto(url)
        assert owner_state(visitor) == "false"
        assert "Visitor mode" in visitor.locator("#owner-state").inner_text()
        assert controls_disabled(visitor) == [True, True, True]
        visitor.locator("#train-start").click(force=True)
        visitor.wait_for_timeout(1500)
        assert visitor.locator("#train-status").get_attribute("data-status") == "none"
        assert run_dirs(owned_app) == []
        screenshot(visitor, "access_visitor")

        # The owner: a wrong password is refused, the right one enables the controls.
        owner.goto(url)
        owner.locator("#owner-password input").fill("not it")
        owner.locator("#owner-login").click()
        owner.wait_for_function("() => document.querySelector('#owner-note')?.innerText.includes('Wrong password')")
        assert owner_state(owner) == "false" and controls_disabled(owner) == [True, True, True]
        owner.locator("#owner-password input").fill(PASSWORD)
        owner.locator("#owner-login").click()
        wait_owner(owner, "true")
        assert controls_disabled(owner) == [False, False, False]
        assert not owner.locator("#owner-password").is_visible() and owner.locator("#owner-logout").is_visible()
        owner.locator("#train-start").click()
        owner.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'ok'")
        run_id = owner.locator("#train-status").get_attribute("data-run")
        assert run_id.startswith("run-")

        # The visitor's page shows the owner's live run, charts and all, and still no working controls.
        visitor.wait_for_function(f"() => document.querySelector('#train-status')?.dataset.run === '{run_id}'",
                                  timeout=60_000)
        visitor.wait_for_function(
            "() => +(document.querySelector('#train-status')?.dataset.plottedStep || 0) >= 1", timeout=180_000)
        visitor.wait_for_function(
            "() => (document.querySelector('#chart-reward .js-plotly-plot')?.data || [])"
            ".some(t => t.name === 'reward (mean)' && t.x && t.x.length >= 1)")
        assert controls_disabled(visitor) == [True, True, True]
        visitor.locator("#train-stop").click(force=True)
        visitor.wait_for_timeout(1500)
        assert visitor.locator("#train-status").get_attribute("data-status") == "running"
        screenshot(visitor, "access_visitor_live")

        # A reload keeps the owner logged in (the token is in the browser's localStorage); the owner stops it.
        owner.reload()
        wait_owner(owner, "true")
        owner.wait_for_function("() => !document.querySelector('#train-stop')?.disabled")
        owner.locator("#train-stop").click()
        visitor.wait_for_function(
            "() => ['stopped', 'completed'].includes(document.querySelector('#train-status')?.dataset.status)",
            timeout=120_000)
        status = json.loads((owned_app["runs"] / run_id / "status.json").read_text())
        assert status["status"] == "stopped", status
        screenshot(owner, "access_owner")

        # Logging out greys the controls out again, and a reload stays logged out.
        owner.locator("#owner-logout").click()
        wait_owner(owner, "false")
        assert controls_disabled(owner) == [True, True, True]
        owner.reload()
        wait_owner(owner, "false")
        assert run_dirs(owned_app) == [run_id]
    finally:
        visitor.context.close()
        owner.context.close()
