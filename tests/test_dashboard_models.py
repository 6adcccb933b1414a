"""The Train form's model picker, its configs, and the GPU readout (hidden without a GPU)."""

from __future__ import annotations

import json

import pytest

from dashboard.gpu import readout_html
from dashboard.run_data import RunSnapshot
from dashboard.train_tab import PICKER_MODELS, default_values, model_choices, model_config_file, status_html
from training.config import TrainConfig
from training.models.gguf import PACKAGED_MODELS


def test_picker_lists_models_with_size_and_device():
    choices = dict((value, label) for label, value in model_choices())
    assert "0.66M · CPU" in choices["builtin:tiny"]
    if PACKAGED_MODELS["smollm2-135m"].installed():
        assert "135M · GPU" in choices["smollm2-135m"]
    else:
        assert "smollm2-135m" not in choices


@pytest.mark.parametrize("name", [name for name, *_ in PICKER_MODELS])
def test_each_picker_model_has_valid_configs_for_itself(name, tmp_path):
    if name in PACKAGED_MODELS and not PACKAGED_MODELS[name].installed():
        pytest.skip(f"{name} is not installed: {PACKAGED_MODELS[name].install_command}")
    _, _, _, cpu_file, gpu_file = next(m for m in PICKER_MODELS if m[0] == name)
    for path in (cpu_file, gpu_file):
        if path is None:
            continue
        values = json.loads(path.read_text())
        assert values["model"] == name
        if values["dataset"] == "builtin":
            TrainConfig.from_json(path)  # validates every field (spider10 needs its data prepared)


def test_picked_model_loads_its_cpu_config_without_a_gpu_or_without_its_dataset(tmp_path):
    assert model_config_file("builtin:tiny", gpu=False) == PICKER_MODELS[0][3]
    assert model_config_file("smollm2-135m", gpu=False).name == "smollm2_cpu.json"
    # On a GPU machine whose data folder lacks spider10, the GPU recipe cannot run: the CPU config is loaded.
    assert model_config_file("smollm2-135m", gpu=True, data_root=tmp_path).name == "smollm2_cpu.json"
    assert model_config_file("Qwen/Qwen3-0.6B", gpu=True) is None
    assert default_values(model_config_file("smollm2-135m", gpu=False))["model"] == "smollm2-135m"


def test_gpu_readout_is_hidden_on_cpu():
    import torch

    from training.gpu import gpu_readout

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_readout() is None and readout_html(None) == ""
    snap = RunSnapshot("r1", {"status": "running", "phase": "grpo", "device": "cpu", "step": 1, "total_steps": 2},
                       {"model": "smollm2-135m", "dataset": "builtin"}, None)
    bar = status_html(snap, None)
    assert 'id="train-gpu"' not in bar and "smollm2-135m" in bar


def test_status_bar_shows_the_gpu_readout_of_a_running_run_only():
    gpu = {"name": "NVIDIA H100", "allocated_gb": 3.2, "reserved_gb": 4.0, "peak_gb": 5.5, "total_gb": 79.6,
           "used_gb": None, "utilization": None}
    running = RunSnapshot("r1", {"status": "running", "phase": "grpo", "device": "cuda", "gpu": gpu}, {}, None)
    assert 'id="train-gpu"' in status_html(running, None)
    done = RunSnapshot("r1", {"status": "completed", "phase": "done", "device": "cuda", "gpu": gpu}, {}, None)
    assert 'id="train-gpu"' not in status_html(done, None)


def test_gpu_readout_line_names_memory_and_utilisation():
    line = readout_html({"name": "NVIDIA H100", "allocated_gb": 3.2, "reserved_gb": 4.0, "peak_gb": 5.5,
                         "total_gb": 79.6, "used_gb": 6.1, "utilization": 87.0})
    assert 'id="train-gpu"' in line and 'data-utilization="87"' in line
    assert "3.2 GiB allocated (peak 5.5, reserved 4.0) of 80 GiB" in line and "utilisation 87%" in line


def test_cost_line_names_the_config_and_its_measured_figures():
    from dashboard.config_costs import cost_html

    table = {"smollm2_cpu.json": {"model": "smollm2-135m", "dataset": "builtin", "machine": "2-core CPU",
                                  "minutes": 41.6, "peak_memory_gb": 5.43, "disk_written_gb": 4.2}}
    from dashboard.config_costs import MEASURED_FILE

    line = cost_html(MEASURED_FILE.parent / "smollm2_cpu.json", table)
    assert "configs/smollm2_cpu.json" in line and "2-core CPU" in line
    assert "~42 min" in line and "5.4 GiB" in line and "4.2 GiB written" in line
    assert "not measured yet" in cost_html(MEASURED_FILE.parent / "other.json", table)
    # a file elsewhere with a measured config's name is not that config
    assert "not measured yet" in cost_html("/tmp/x/smollm2_cpu.json", table)
    # the file the repository ships parses, and names only configs that exist
    from dashboard.config_costs import measured

    for name, entry in measured().items():
        assert (MEASURED_FILE.parent / name).is_file() and entry["model"] == TrainConfig.from_json(
            MEASURED_FILE.parent / name).model


def test_remaining_time_counts_the_warm_start_and_the_evals_still_to_come():
    from dashboard.config_costs import remaining_seconds

    table = {"x.json": {"model": "m", "dataset": "builtin", "sft_steps": 40, "grpo_episodes": 128,
                        "comparison_episodes": 100,
                        "phase_seconds": {"loading model": 20, "zero-shot eval": 200, "sft": 800, "base eval": 100,
                                          "grpo": 1000, "saving": 10, "comparison": 300}}}
    config = {"model": "m", "dataset": "builtin", "sft": {"max_steps": 20}, "max_steps": 8,
              "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "comparison_episodes": 50}
    # half-way through a 20-step warm start that took 300 s so far: 300 s more, then the later phases as measured,
    # scaled to this config (50 comparison episodes instead of 100)
    sft = {"status": "running", "phase": "sft", "phase_step": 10, "phase_total": 20}
    assert remaining_seconds(sft, config, 300.0, table) == pytest.approx(300 + 50 + 1000 + 10 + 150)
    # in the zero-shot eval (no steps): what is left of its measured time, then the rest
    zero = {"status": "running", "phase": "zero-shot eval"}
    assert remaining_seconds(zero, config, 50.0, table) == pytest.approx(150 + 400 + 50 + 1000 + 10 + 150)
    # GRPO at its own pace, then saving and the comparison
    grpo = {"status": "running", "phase": "grpo", "step": 2, "total_steps": 8}
    assert remaining_seconds(grpo, config, 240.0, table) == pytest.approx(720 + 10 + 150)
    # another model: the current phase alone, where it has steps; nothing known otherwise
    other = {**config, "model": "n"}
    assert remaining_seconds(sft, other, 300.0, table) == pytest.approx(300)
    assert remaining_seconds(zero, other, 50.0, table) is None


def test_status_bar_remaining_time_covers_the_phases_after_the_warm_start(monkeypatch):
    import datetime as dt

    import dashboard.config_costs as costs
    from training.run_dir import now_iso

    table = {"x.json": {"model": "m", "dataset": "builtin", "sft_steps": 10, "phase_seconds": {"grpo": 600}}}
    monkeypatch.setattr(costs, "measured", lambda path=None: table)
    started = (dt.datetime.now() - dt.timedelta(seconds=100)).isoformat(timespec="seconds")
    status = {"status": "running", "phase": "sft", "phase_step": 5, "phase_total": 10, "phase_started_at": started,
              "started_at": now_iso()}
    snap = RunSnapshot("r1", status, {"model": "m", "dataset": "builtin", "sft": {"max_steps": 10}}, None)
    bar = status_html(snap, None)
    assert "remaining 11m" in bar  # 100 s more of warm start, then 600 s of GRPO (not "estimating")
