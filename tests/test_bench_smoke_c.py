"""Bench scripts in their smallest form (see `test_bench_smoke_a.py`): the decoders side by side, and the measurements
behind the CPU recipe's choices (threads, the compact prompt, the question sampler). Each is a real subprocess that
exits 0 with one JSON object of figures as its last line.

And `serving/visitors.py`: a dashboard training while visitors poll and play (its last change, per-visitor addresses,
crashed it before any visitor came, unseen: it had no smoke test).

The security benches wait out the server's own timeouts: `security/websocket_holds.py` runs in
`test_bench_smoke_d.py`, which says why `soak.py` and `web_server.py` have no smoke test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench_smoke import REPO, run_bench


@pytest.fixture(scope="module")
def tiny_model():
    """The built-in tiny model, built once before a bench's subprocess loads it."""
    from training_helpers import built_tiny_model

    return built_tiny_model()


def test_decoders_side_by_side(tiny_model):
    """`decoding/decoder.py`: the three decoders play the same greedy eval episodes token for token, and one GRPO
    step's rollouts; the cached ones read fewer tokens than the one that re-reads every turn."""
    figures = run_bench("decoding/decoder.py", "--model", "builtin:tiny", "--episodes", "4", "--step-budget", "2",
                        "--turn-tokens", "8", "--completion", "64", "--threads", "1")
    played = figures["eval"]
    assert set(played) >= {"old", "new", "graph"}
    assert all(played[name]["generated"] > 0 for name in ("old", "new", "graph"))
    assert played["new"]["fed"] < played["old"]["fed"]
    assert figures["eval"]["identical_episodes"] == "4/4" and figures["rollout"]["old"]["generated"] > 0


def test_decoder_bench_refuses_a_batch_of_partial_groups():
    done = subprocess.run([sys.executable, "bench/decoding/decoder.py", "--episodes", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "multiple of 4" in done.stderr.strip().splitlines()[-1]


def test_cpu_step(tiny_model):
    """`learning/cpu_step.py`: one step of the built-in recipe's shape, old against new (forced bf16: it runs on any
    CPU), on the tiny model: each group's prompt is read once, the bf16 decoder samples what the bf16 loss scores."""
    figures = run_bench("learning/cpu_step.py", "--model", "builtin:tiny", "--recipes", "builtin", "--groups", "2",
                        "--turn-tokens", "12", "--completion", "48", "--precision", "bf16")
    step = figures["builtin"]
    assert step["rows"] == 8 and step["new_precision"] == "bf16" and step["new_decoder"] == "GraphDecoder"
    assert step["new"]["fed"] < step["old"]["fed"]  # 2 prompts read for 8 rows, not 8
    assert step["old"]["loss"]["rows"] == step["new"]["loss"]["rows"] > 0  # the same episodes, both ways
    assert step["new"]["logprob_gap"] is not None and figures["checks"]["builtin_logprob_gap<=1e-2"]
    assert isinstance(figures["bf16_units"], bool) and step["step_speedup"] > 0


def test_cpu_threads(tiny_model):
    figures = run_bench("learning/cpu_threads.py", "--model", "builtin:tiny", "--tokens", "64", "--reps", "1",
                        "--variants", "1:PASSIVE")
    (variant,) = figures["variants"]
    assert variant["threads"] == 1 and variant["wait_policy"] == "PASSIVE" and variant["wall_s"] > 0


def test_episode_tokens():
    """`learning/episode_tokens.py`: the compact prompt is the shorter one, counted by SmolLM2's own tokenizer (on 4
    train questions, not the default 200: ~190 tokens against ~550, whichever questions)."""
    figures = run_bench("learning/episode_tokens.py", "--episodes", "4", "--split", "eval", "--questions", "4")
    prompts = figures["prompt_tokens"]
    assert figures["model"] == "smollm2-135m" and prompts["compact"]["mean"] < prompts["full"]["mean"]
    teacher = figures["teacher"]
    assert teacher["episodes"] == 4 and teacher["split"] == "eval" and teacher["completion"]["mean"] > 0
    assert teacher["by_tool"]["answer"]["n"] == 4  # one answering turn an episode
    over = [teacher["answers_over_cap"][str(cap)] for cap in (160, 256, 512, 1024)]
    assert over == sorted(over, reverse=True) and 0 <= over[0] <= 4


def test_question_sampler():
    figures = run_bench("learning/question_sampler.py", "--seeds", "1")
    for scenario in ("static_8x8", "static_4x4", "learning_8x8", "learning_4x4"):
        assert 0 <= figures[scenario]["uniform"] <= 1 and 0 <= figures[scenario]["mixed"] <= 1


def test_visitors(tiny_model):
    figures = run_bench("serving/visitors.py", "--pollers", "2", "--players", "2", "--phase-s", "6", "--rounds", "1",
                        "--think-s", "0.5")
    assert figures["errors"] == 0 and figures["cross_talk"] == 0 and figures["play_steps"] > 0
    assert figures["grpo_steps_quiet"] > 0 and figures["grpo_steps_visitors"] > 0
