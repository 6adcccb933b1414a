"""The GPU check and its carry, kept from rotting between GPU sessions: `bench/gpu/gpu_check.py --dry-run` plays every
item on the CPU (tiny model, toy dataset), the sampling tap follows rows that leave the batch, and the carry's cut, join
and sha256 check work on a generated file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "bench" / "gpu")]

import gpu_carry  # noqa: E402
import gpu_learning  # noqa: E402
import gpu_measures  # noqa: E402


@pytest.mark.slow
def test_dry_run_reports_every_item(tmp_path):
    out = tmp_path / "out"
    state = tmp_path / "state.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "SQLENV_RUNS_DIR", "SQLENV_DATA_DIR",
                                                            "SQLENV_DECODER")}
    done = subprocess.run([sys.executable, "bench/gpu/gpu_check.py", "--dry-run", "--out", str(out), "--state",
                           str(state)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["dry_run"] is True
    assert summary["status"] == {item: "ok" for item in ("imports", "decoders", "exactness", "grpo_step",
                                                          "logprob_gap", "bf16_step", "learning")}, done.stdout[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["summary"] == summary
    items = report["items"]

    assert items["imports"]["import_errors"] == {} and items["imports"]["versions"]["trl"]

    # Item 2: every decoder at every precision and rows, timed, today's decoder's greedy tokens reproduced in fp32.
    rates = items["decoders"]["rates"]
    measured = {(r["decoder"], r["precision"], r["rows"]) for r in rates}
    assert measured == {(d, p, n) for d in ("kept", "graph", "cb") for p in ("fp32", "bf16") for n in (2, 4)} | {
        ("graph", "fp32+bf16", n) for n in (2, 4)}
    for rate in rates:
        assert "error" not in rate and "skipped" not in rate, rate
        assert rate["generated"] == rate["rows"] * 2 * items["decoders"]["tokens_per_turn"]
        assert rate["tokens_per_s"] > 0 and rate["seconds"] > 0
        if rate["precision"] == "fp32":
            assert rate["greedy_identical"], rate
    assert set(items["decoders"]["best"]) == {"fp32@2", "fp32@4", "bf16@2", "bf16@4"}
    assert json.loads(state.read_text())["decode"]  # kept for the next call's plan

    exact = items["exactness"]
    assert exact["identical"] and exact["decoders"] == {"kept": "MultiTurnDecoder", "graph": "GraphDecoder"}

    step = items["grpo_step"]
    assert step["episodes"] == 4 and step["rollout_generated_tokens"] > 0 and step["decoder"] == "MultiTurnDecoder"
    assert step["step_s"] >= step["rollout_s"] > 0 and step["loss_s"] >= 0 and 0 < step["rollout_share"] <= 1
    assert [p["rows"] for p in step["memory_probe"]] == [2, 4] and not any(p["oom"] for p in step["memory_probe"])

    gap = items["logprob_gap"]
    assert gap["tokens"] == step["rollout_generated_tokens"] and gap["precision"] == "fp32"
    # In fp32 the trainer's forward and the decoder's sampling distribution are the same numbers up to rounding.
    assert 0 <= gap["mean_abs"] < 1e-4 and gap["max_abs"] < 1e-3
    assert items["bf16_step"]["skipped"]  # bf16 autocast needs CUDA

    run = items["learning"]["runs"]["toy"]
    assert run["run_status"] == "completed" and run["grpo_steps_run"] == run["grpo_steps"] >= 1
    for policy in ("random", "base", "trained"):
        assert run["scores"][policy]["n"] == 10
    assert 0 <= run["after_grpo"] <= 1 and 0 <= run["warm_start"] <= 1
    assert set(run["phase_seconds"]) >= {"loading model", "sft", "base eval", "grpo", "comparison"}
    assert run["plan"]["grpo_steps"] == run["grpo_steps"]
    assert 0 < run["rollout_s"] and 0 < run["rollout_share"] <= 1 and summary["rollout_share"] == run["rollout_share"]
    archive, *archived = run["files"]
    with tarfile.open(out / archive) as files:
        assert sorted(files.getnames()) == sorted(archived) and "toy_comparison.jsonl" in archived
    assert len(list(out.iterdir())) <= 8  # what comes back from the device
    assert (out / "gpu_check.log").read_text().count("item ") >= 7
    assert {"tokens_per_s_at_64>=10000", "logprob_gap_mean_abs<=1e-2", "rollout_share<=0.60",
            "toy: after_grpo>=0.3", "toy: after_grpo>=warm_start+0.05"} <= set(summary["checks"])


def test_a_grpo_step_through_the_graph_decoder(tmp_path):
    """Item 4 as a GPU plays it: the batched rollout decodes with the graph decoder (forced here; on a CPU its step
    runs eagerly), TRL's fp32 LM head on; the sampler's recorded log-probs are the trainer's."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "SQLENV_RUNS_DIR", "SQLENV_DATA_DIR")}
    env["SQLENV_DECODER"] = "graph"
    done = subprocess.run([sys.executable, "bench/gpu/gpu_check.py", "--dry-run", "--items", "4", "--out", str(out),
                           "--set", "grpo.cast_lm_head_to_fp32=true"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    items = json.loads((out / "gpu_check.json").read_text())["items"]
    assert items["grpo_step"]["decoder"] == "GraphDecoder" and items["grpo_step"]["graph_error"] is None
    assert items["logprob_gap"]["tokens"] == items["grpo_step"]["rollout_generated_tokens"] > 0
    assert items["logprob_gap"]["mean_abs"] < 1e-4


@pytest.mark.parametrize("args", [["--items", "8"], ["--items", "x"], ["--deadline-minutes", "0"],
                                  ["--config", "no/such.json"], ["--learn", "no/such.json"],
                                  ["--shape", "no/such.json"]])
def test_bad_arguments_exit_2(args, tmp_path):
    done = subprocess.run([sys.executable, "bench/gpu/gpu_check.py", "--dry-run", "--out", str(tmp_path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "error:" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", ["kept", "graph"])
def test_sampling_tap_follows_rows_that_leave_the_batch(kind):
    """Rows end their turns at different steps (half the vocabulary ends a turn) over two turns, the second reusing
    each row's cache: every drawn token goes back to its row, and its recorded log-probability is the one a full fp32
    forward of the row's sequence gives at the sampling temperature; for both kept-cache decoders (the graph
    decoder as a GPU batches its rows: padding rows, a check every 4 steps)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    model = Qwen3ForCausalLM(config).eval()
    originals = (MultiTurnDecoder.generate, GraphDecoder.generate)
    if kind == "kept":
        decoder = MultiTurnDecoder(model, pad_id=0, eos_ids=set(range(32, 64)), min_shared_prefix=4)
    else:
        decoder = GraphDecoder(model, pad_id=0, eos_ids=set(range(32, 64)), min_shared_prefix=4, buckets=True,
                               sync_every=4)
    prompts = {f"row{i}": [1, 2, 3, 4, 5] + [6 + i] * (i + 1) for i in range(6)}
    temperature = 0.7
    with gpu_measures.SamplingTap() as tap:
        first = decoder.generate(prompts, 12, sample=True, temperature=temperature)
        second = decoder.generate({k: prompts[k] + first[k] + [7, 8, 9] for k in prompts}, 12, sample=True,
                                  temperature=temperature)
    assert (MultiTurnDecoder.generate, GraphDecoder.generate) == originals  # restored
    assert len({len(v) for v in first.values()}) > 1  # rows left the first turn at different steps
    rows = tap.per_row()
    assert tap.first_keys() == list(prompts) and tap.generated() == sum(map(len, first.values())) + sum(
        map(len, second.values()))
    for key, prompt in prompts.items():
        sequence = prompt + first[key] + [7, 8, 9] + second[key]
        drawn = rows[key]
        assert [t for _, t, _ in drawn] == first[key] + second[key]
        with torch.no_grad():
            logps = torch.log_softmax(model(torch.tensor([sequence])).logits[0].float() / temperature, -1)
        for position, token, logp in drawn:
            assert sequence[position] == token
            assert abs(float(logps[position - 1, token]) - logp) < 1e-4


def test_an_item_records_the_captures_that_failed_in_it(tmp_path):
    """A capture that fails leaves its decoder decoding eagerly, silently but for a warning: each item records the
    captures that failed in it, whatever decoder made them (a run's evals, the KL probe), and the next item starts
    with none of them."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gpu_report import Report
    from training.generation.graph_decoder import GraphDecoder

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    model = Qwen3ForCausalLM(config).eval()
    decoders = []

    def item() -> dict:
        decoder = GraphDecoder(model, pad_id=0, eos_ids={63}, buckets=True, sync_every=4)
        decoder.graphs.enabled = True  # as on a GPU; on a CPU the capture fails
        decoders.append(decoder)
        return {"tokens": sum(map(len, decoder.generate({0: [1, 2, 3], 1: [4, 5]}, 6).values()))}

    report = Report(tmp_path, {})
    report.run("exactness", item)
    report.run("grpo_step", dict)
    items = report.data["items"]
    assert items["exactness"]["status"] == "ok" and items["exactness"]["tokens"] > 0
    errors = items["exactness"]["graph_errors"]
    assert len(errors) == 1 and decoders[0].graphs.error in errors[0]
    assert items["grpo_step"]["status"] == "ok" and "graph_errors" not in items["grpo_step"]
    assert report.summary()["graph_errors"] == {"exactness": 1}


def test_plan_learning_sizes_grpo_to_the_budget():
    from training.config import TrainConfig

    config = TrainConfig.from_json(REPO / "configs" / "smollm2_spider10_gpu.json")
    rates = dict(n_eval=203, n_train=473, device="cuda", prompt_tokens=560, load_s=10.0, eval_step_s=0.012,
                 grpo_step_s=8.0, train_tokens_per_s=200_000.0)
    small, large = (gpu_learning.plan_learning(config, budget_s=b, **rates) for b in (250.0, 340.0))
    assert 1 <= small["grpo_steps"] < large["grpo_steps"] <= config.max_steps
    assert large["estimated_s"]["total"] <= 340.0 and not large["over_budget"]
    assert gpu_learning.plan_learning(config, budget_s=10_000.0, **rates)["grpo_steps"] == config.max_steps
    short = gpu_learning.plan_learning(config, budget_s=30.0, **rates)
    assert short["grpo_steps"] == 1 and short["over_budget"]
    # A shortened run keeps at most a fifth of its steps for warmup (a lent H100 ran its one step at learning rate 0).
    config = config.with_overrides(["grpo.lr_scheduler_type=constant_with_warmup", "grpo.warmup_steps=5"])
    for steps, warmup in ((1, 0), (4, 0), (10, 2), (24, 4)):
        shortened = config.with_overrides(gpu_learning.sized_overrides(config, steps, 203))
        assert (shortened.max_steps, shortened.grpo["warmup_steps"], shortened.comparison_episodes) == (steps, warmup, 203)
        assert shortened.grpo["lr_scheduler_type"] == config.grpo["lr_scheduler_type"]
    # The decoder's rate between and beyond the rows measured.
    decode = [{"rows": 16, "seconds_per_step": 0.01}, {"rows": 64, "seconds_per_step": 0.02}]
    assert gpu_measures.step_seconds(decode, 8) == 0.01
    assert gpu_measures.step_seconds(decode, 40) == pytest.approx(0.015)
    assert gpu_measures.step_seconds(decode, 112) == pytest.approx(0.03)


def test_carry_cut_join_and_check(tmp_path):
    """A generated file cut where both calls keep the same room, joined back byte for byte; a damaged or missing
    part is refused with a message that says so."""
    data = os.urandom(300_000)
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    first = gpu_carry.plan_cut(len(data), tree=50_000, wheels=40_000, data=10_000, limit=300_000, margin=1_000)
    assert 50_000 + 40_000 + first == 50_000 + (len(data) - first) + 10_000  # same room in both calls
    parts = (tmp_path / "call1" / "model.part1", tmp_path / "call2" / "model.part2")
    records = gpu_carry.split_file(source, first, parts)
    assert [r["size"] for r in records] == [first, len(data) - first]
    assert records[0]["sha256"] == hashlib.sha256(data[:first]).hexdigest()
    digest = hashlib.sha256(data).hexdigest()
    joined = gpu_carry.join_parts(list(parts), tmp_path / "model" / "joined.gguf", size=len(data), sha256=digest)
    assert joined.read_bytes() == data and gpu_carry.sha256_file(joined) == digest

    damaged = bytearray(parts[1].read_bytes())
    damaged[100] ^= 1
    parts[1].write_bytes(bytes(damaged))
    with pytest.raises(gpu_carry.CarryError, match="damaged"):
        gpu_carry.join_parts(list(parts), tmp_path / "model" / "again.gguf", size=len(data), sha256=digest)
    assert not (tmp_path / "model" / "again.gguf").exists() and not list((tmp_path / "model").glob("*.joining"))
    parts[1].unlink()
    with pytest.raises(gpu_carry.CarryError, match="missing"):
        gpu_carry.join_parts(list(parts), tmp_path / "model" / "again.gguf", size=len(data), sha256=digest)
    with pytest.raises(gpu_carry.CarryError, match="does not fit"):
        gpu_carry.plan_cut(len(data), tree=50_000, wheels=40_000, data=10_000, limit=200_000)


def test_call2_assembles_on_the_machine_call1_warmed(tmp_path):
    """Call 2 joins the GGUF from call 1's part (left on the warm machine) and its own; on a machine that went back
    (call 1's files absent) it says to run call 1 again."""
    data = os.urandom(50_000)
    source = tmp_path / "m.gguf"
    source.write_bytes(data)
    carry = tmp_path / ".gpucarry"
    parts = (carry / "call1" / "model.part1", carry / "call2" / "model.part2")
    records = gpu_carry.split_file(source, 20_000, parts)
    manifest = {"gguf": {"name": "m.gguf", "size": len(data), "sha256": gpu_carry.sha256_file(source),
                         "parts": [{"file": f"{p.parent.name}/{p.name}", **r} for p, r in zip(parts, records)]},
                "wheels": []}
    (carry / "call2" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(gpu_carry.CarryError, match="run call 1 again"):
        gpu_carry.assemble(carry)
    (carry / "call1" / "manifest.json").write_text(json.dumps(manifest))
    (carry / "site").mkdir()
    assert gpu_carry.assemble(carry).read_bytes() == data
