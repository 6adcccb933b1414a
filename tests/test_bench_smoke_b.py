"""Bench scripts in their smallest form, each a real subprocess (half of them: `test_bench_smoke_a.py` has the others,
so that the two CI workers share them): it exits 0 and its last line is one JSON object with the figures it
promises. The figures themselves mean nothing at this size; the scripts are kept from rotting (bench/README.md).

Here: the model playing (`decoding/`), a GRPO step of a GPU-shaped model on the CPU (`gpu/`) and hostile inputs
(`security/`). `gpu/gpu_decoders.py` is no script: tests/test_gpu_check.py
runs it as item 2 of `gpu_check.py --dry-run`.
"""

from __future__ import annotations

import pytest

from bench_smoke import run_bench


@pytest.fixture(scope="module")
def tiny_model():
    """The built-in tiny model, built once for every test process before a bench's subprocess loads it."""
    from training_helpers import built_tiny_model

    return built_tiny_model()


# ------------------------------------------------------------------------------------------------------ decoding/
@pytest.mark.slow
def test_openai_eval(tiny_model):
    """The tiny model warm-started for one step, served by `training.generation.openai_server`, one episode at 1
    and at 2 in flight."""
    figures = run_bench("decoding/openai_eval.py", "--episodes", "1", "--concurrency", "1,2", "--sft-steps", "1",
                        "--budget", "2", "--max-tokens", "8", "--device", "cpu")
    assert [row["concurrency"] for row in figures["results"]] == [1, 2] and figures["ratio_between"] == [1, 2]
    for row in figures["results"]:
        assert row["episodes"] == 1 and row["errors"] == 0 and row["episodes_per_s"] > 0
        assert row["requests_per_s"] > 0 and 1 <= row["avg_steps"] <= 2
    assert figures["ratio"] > 0 and figures["sft_steps"] == 1


@pytest.mark.slow
def test_rollout_throughput(tiny_model):
    figures = run_bench("decoding/rollout_throughput.py", "--episodes", "2", "--step-budget", "1",
                        "--turn-tokens", "8")
    assert figures["episodes"] == 2 and figures["single_eps_per_s"] > 0 and figures["batched_eps_per_s"] > 0
    assert figures["ratio"] > 0
    for side in ("single_tokens", "batched_tokens"):  # 2 episodes of one turn of at most 8 tokens
        assert 0 < figures[side] <= 2 * 8


# ----------------------------------------------------------------------------------------------------------- gpu/
@pytest.mark.slow
def test_gpu_step_on_the_cpu(tiny_model):
    """The CPU fallback: the scaled-down Qwen3 shape, one LoRA variant (continuous batching on a CPU sizes its
    cache to the free memory: ~20 s), one step."""
    figures = run_bench("gpu/gpu_step.py", "--shape", "tiny", "--device", "cpu", "--steps", "1", "--variants",
                        "lora+generate", "--num-generations", "2", "--step-budget", "2", "--max-turn-tokens", "16",
                        "--max-completion-length", "64", "--cpu-threads", "1")
    assert figures["shape"] == "tiny" and figures["steps"] == 1
    [variant] = figures["variants"]
    assert variant["error"] is None and variant["variant"] == "lora+generate" and variant["steps"] == 1
    assert variant["seconds_per_step"] > 0 and variant["tokens_per_step"] > 0
    if figures["device"] == "cpu":
        assert variant["peak_gpu_memory_gib"] is None


# ------------------------------------------------------------------------------------------------------ security/
def test_sql_function_costs():
    figures = run_bench("security/sql_function_costs.py", "--calls", "1", "--reps", "1")
    assert figures["functions"] > 50 and isinstance(figures["over_price"], list) and figures["max_ratio"] > 0
    shapes = figures["shapes"]
    one_more = [name for name in shapes if " x" in name and not name.startswith(("longest", "trim(x, y)", "x GLOB"))]
    assert len(one_more) == 9  # the costly functions, each one call past its longest statement: refused
    assert all(shapes[name]["outcome"] != "ran" for name in one_more), {n: shapes[n] for n in one_more}
    assert all(s["outcome"] == "ran" for name, s in shapes.items() if name.startswith("longest"))


def test_result_memory():
    """The two shapes that do not run to the 5 s time limit: rows of 128 integers (2,000 of them: 20,000 took 1.1 s
    at rest and over 5 s beside a loaded suite), the issue's 1,990 columns (refused)."""
    figures = run_bench("security/result_memory.py", "--settle", "0", "--shapes", "5,6", "--rows", "2000")
    shapes = figures["shapes"]
    assert list(shapes) == ["2,000 rows of 128 integers", "the issue's 1,990 columns of 10 KB"]
    assert shapes["2,000 rows of 128 integers"]["reply"].endswith("2000 rows")
    assert "too many columns" in shapes["the issue's 1,990 columns of 10 KB"]["reply"]
    assert figures["bound_mb"] > 64 and figures["rss_end_mb"] > 0 and isinstance(figures["all_held"], bool)


def test_app_memory():
    """One session per phase, inputs of 1 MB, no settling: the hostile inputs refused, the largest allowed taken."""
    figures = run_bench("security/app_memory.py", "--sessions", "1", "--input-mb", "1", "--allowed-sessions", "1",
                        "--expire-sessions", "1", "--settle", "0")
    assert sum(figures["hostile_statuses"].values()) == 3 and sum(figures["allowed_statuses"].values()) == 3
    assert all(status.split()[1] in ("413", "0") for status in figures["hostile_statuses"]), figures
    assert all(status.split()[1] == "200" for status in figures["allowed_statuses"]), figures
    for key in ("rss_idle_mb", "rss_after_hostile_mb", "rss_after_allowed_mb", "rss_after_expiry_mb"):
        assert figures[key] > 0
    assert figures["growth_after_expiry_mb"] == pytest.approx(figures["rss_after_expiry_mb"] - figures["rss_idle_mb"],
                                                              abs=0.2)


def test_dashboard_hostile():
    """The shapes one app serves in seconds: 300 half-sent heads (watched 1 s) and a long run's detail (1,000
    lines). The flood (a fixed 17 s of waits), Play (5 s queries) and the two shapes on apps of their own (play_full,
    throttle: ~10 s each to start) are left to the full run."""
    figures = run_bench("security/dashboard_hostile.py", "--phases", "heads,run_detail", "--heads-wait", "1",
                        "--metrics-lines", "1000")
    assert figures["heads_300_closed_within_1s"] + figures["heads_300_held_at_1s"] <= 300
    assert figures["detail_metrics_lines"] == 1000 and figures["detail_six_views_ok"] == 6
    assert figures["detail_first_view_s"] > 0 and figures["detail_second_view_s"] > 0
    assert len(figures["detail_six_views_s"]) == 6 and figures["detail_rss_after_mb"] > 0
    assert not any(key.startswith(("flood_", "play_", "throttled_")) for key in figures)
