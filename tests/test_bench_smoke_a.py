"""Bench scripts in their smallest form, each a real subprocess (half of them: `test_bench_smoke_b.py` has the others,
so that the two CI workers share them): it exits 0 and its last line is one JSON object with the figures it
promises. The figures themselves mean nothing at this size; the scripts are kept from rotting (bench/README.md).

Here: what a run learns and costs (`learning/`), and honest load on the environment, the server and the dashboard
(`serving/`).
`learning/grpo_sweep.py` runs end to end in tests/test_resume.py (its `main`, a try cut short and resumed), and
`learning/grpo_loss.py` in tests/test_grpo_loss.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench_smoke import REPO, run_bench
from serverproc import free_port

CHROMIUM = os.environ.get("SQLENV_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def tiny_model():
    """The built-in tiny model, built once for every test process before a bench's subprocess loads it."""
    from training_helpers import built_tiny_model

    return built_tiny_model()


# ------------------------------------------------------------------------------------------------------ learning/
@pytest.mark.slow
def test_step_profile(tiny_model):
    figures = run_bench("learning/step_profile.py", "--sft-steps", "2", "--sft-episodes", "8", "--grpo-steps", "1",
                        "--rounds", "1", "--set", "num_generations=2", "--set", "per_device_train_batch_size=2",
                        "--set", "step_budget=2", "--set", "max_turn_tokens=16")
    assert set(figures["sft_step_ms"]) == {"SFTTrainer", "WarmStartTrainer"}
    assert set(figures["grpo_step_ms"]) == {"checkpointing on (TRL default)", "checkpointing off"}
    assert all(ms > 0 for ms in [*figures["sft_step_ms"].values(), *figures["grpo_step_ms"].values()])
    assert figures["sft_step_speedup"] > 0 and figures["threads"] == 1
    assert set(figures["sft_split_ms"]["SFTTrainer"]) == {"forward + loss", "backward", "optimizer"}
    assert "warm_start" not in figures  # --warm-start (two whole warm starts, ~12 minutes) is not run here


@pytest.mark.slow
def test_warm_start_sweep(tiny_model, tmp_path):
    """One try, judged on a 4-question panel and 2 eval questions; then the same try longer, after its model is
    removed, as a session's end cuts a try before its model is saved: the second sitting goes on from the first
    one's checkpoint (`save_steps`) instead of from the start."""
    out = tmp_path / "sweep"
    common = ["--config", "configs/tiny_cpu.json", "--out", str(out), "--validation", "4", "--set", "step_budget=3",
              "--set", "max_turn_tokens=16", "--set", "save_steps=1"]
    figures = run_bench("learning/warm_start_sweep.py", *common, "--eval", "2",
                        "--try", "smoke:sft.max_steps=1,sft.episodes=8,sft.batch_size=2")
    [record] = figures["tries"]
    assert figures["best"] == "smoke" and "error" not in record, record.get("error")
    assert record["sft_steps"] == 1 and record["sft_episodes"] == 8 and record["sft_loss_last"] > 0
    assert record["sft_resumed_at"] is None
    assert record["panel_n"] == 4 and len(record["panel_correct"]) == 4 and 0 <= record["panel_success"] <= 1
    assert json.loads((out / "sweep.jsonl").read_text())["name"] == "smoke"
    try_dir = out / "tries" / "smoke"
    assert (try_dir / "warm_start" / "sft.json").is_file()  # the try's model, kept
    assert record["eval_n"] == 2 and sum(c["n"] for c in record["eval_hardness"].values()) == 2
    episodes = (try_dir / "eval_episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 2 and all("question_id" in json.loads(line) for line in episodes)  # what EX was made of

    assert any(try_dir.rglob("checkpoint-1")), sorted(p.name for p in try_dir.rglob("*"))
    shutil.rmtree(try_dir / "warm_start")  # as if the sitting had ended before the model was saved
    (out / "sweep.jsonl").unlink()
    figures = run_bench("learning/warm_start_sweep.py", *common,
                        "--try", "smoke:sft.max_steps=2,sft.episodes=8,sft.batch_size=2")
    [record] = figures["tries"]
    assert "error" not in record, record.get("error")
    assert record["sft_resumed_at"] == 1 and record["sft_steps"] == 2


def test_warm_start_sweep_checks_its_spider_dev_sample_before_any_try(tmp_path, monkeypatch, capsys):
    """`--spider-dev N` is checked before hours of SFT, not after: with spider_dev not prepared it is one line naming
    the command that prepares it, exit 2, and no try starts (`main` in this process: no model is loaded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("warm_start_sweep", REPO / "bench/learning/warm_start_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    monkeypatch.setenv("SQLENV_DATA_DIR", str(tmp_path / "data"))
    code = sweep.main(["--config", str(REPO / "configs/tiny_cpu.json"), "--out", str(tmp_path / "sweep"),
                       "--try", "x:sft.max_steps=1", "--spider-dev", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "python -m sqlenv data prepare spider --preset spider_dev" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "sweep" / "tries").exists()


# ------------------------------------------------------------------------------------------------------- serving/
def test_env_throughput(spider_source):
    figures = run_bench("serving/env_throughput.py", "--rounds", "1", env={"SQLENV_SPIDER_DIR": str(spider_source)})
    assert figures["rounds"] == 1 and figures["n_queries"] > 100  # spider10's gold queries
    for clock in ("wall", "cpu"):
        assert figures[f"raw_qps_{clock}"] > 0 and figures[f"env_steps_per_s_{clock}"] > 0
        assert figures[f"ratio_{clock}"] > 0 and figures[f"cold_ratio_{clock}"] > 0


def test_server_load(spider_source):
    sessions, episodes = 2, 1
    figures = run_bench("serving/server_load.py", "--sessions", str(sessions), "--episodes", str(episodes),
                        env={"SQLENV_SPIDER_DIR": str(spider_source)})
    assert figures["dataset"] == "spider10" and figures["sessions_open_after"] == 0
    for kind in ("oracle", "random"):
        for side in ("wire", "in_process"):
            run = figures[kind][side]
            assert run["episodes"] == sessions * episodes and run["errors"] == 0 and run["steps_per_s"] > 0
        assert figures[kind]["wire_vs_in_process"] > 0
    assert figures["oracle"]["wire"]["not_correct"] == 0 and figures["oracle"]["in_process"]["not_correct"] == 0


@pytest.mark.slow
def test_dashboard_tax(tiny_model):
    """Chromium drives the dashboard as the browser tests do: skipped without it (failed on CI)."""
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
        if os.environ.get("CI"):
            pytest.fail(f"Chromium not found at {CHROMIUM}")
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    small = ["sft=false", "num_generations=2", "per_device_train_batch_size=2", "step_budget=2", "max_turn_tokens=16",
             "max_completion_length=96", "trace_every=0", "eval_every=0", "eval_episodes=0", "compare_base=false",
             "validation_questions=0", "kl_probe_episodes=0"]  # the steps only: no evals, panel or probe
    figures = run_bench("serving/dashboard_tax.py", "--steps", "2", "--repeats", "1", "--port", str(free_port()),
                        *[arg for value in small for arg in ("--set", value)])
    assert figures["steps"] == 2 and figures["repeats"] == 1
    assert figures["cli_steps_per_s"] > 0 and figures["dashboard_steps_per_s"] > 0 and figures["ratio"] > 0
    assert figures["n_latency_samples"] >= 1 and figures["latency_max_s"] >= 0
