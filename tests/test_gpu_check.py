"""The GPU check and its carry, kept from rotting between GPU sessions: `bench/gpu/gpu_check.py --dry-run` plays the
two device calls' items in their order on the CPU (tiny model, toy dataset), the real run's sizes hold, the sampling tap
follows rows that leave the batch, captures that failed are counted with their batch size, and the carry's cut, join
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


#: What the check's process must not inherit from the session (a device call starts with none of them).
UNSET = ("OUT", "SQLENV_RUNS_DIR", "SQLENV_DATA_DIR", "SQLENV_DECODER")


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory) -> Path:
    """`$SQLENV_RUNS_DIR` of this module's dry runs: the toy dataset's tiny model (~7 CPU-s to build) is built by the
    first and read by the rest, where each would build its own in its scratch folder."""
    return tmp_path_factory.mktemp("gpu_check_runs")


def _check_in_process(args: list[str], capsys, tiny_cache: Path, **env: str) -> str:
    """`gpu_check.main(args)` in this process (a second interpreter would spend ~11 CPU-s importing torch and TRL
    again), its environment as a subprocess's would be (`UNSET` removed, `env` set), and restored after (the script
    sets defaults in it); returns what it printed."""
    import gpu_check

    before = dict(os.environ)
    capsys.readouterr()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(REPO)
            for key in UNSET:
                patch.delenv(key, raising=False)
            patch.setenv("SQLENV_RUNS_DIR", str(tiny_cache))
            for key, value in env.items():
                patch.setenv(key, value)
            assert gpu_check.main(args) == 0
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        os.environ.update(before)
    return capsys.readouterr().out


def _dry_call(items: str, out: Path, state: Path, tiny_cache: Path, capsys=None) -> dict:
    """`gpu_check.py --dry-run` playing `items` in order (as a device call does), the state shared with the other
    call; returns its summary (the last line printed). With `capsys`, in this process; else a process of its own,
    which starts with nothing but the state file (as a device call does)."""
    args = ["--dry-run", "--items", items, "--out", str(out), "--state", str(state)]
    if capsys is not None:
        stdout = _check_in_process(args, capsys, tiny_cache)
    else:
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        env["SQLENV_RUNS_DIR"] = str(tiny_cache)
        done = subprocess.run([sys.executable, "bench/gpu/gpu_check.py", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        stdout = done.stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["dry_run"] is True and summary["capture_failures"] == 0
    assert json.loads((out / "gpu_check.json").read_text())["summary"] == summary
    assert len(list(out.iterdir())) <= 8  # what comes back from the device
    return summary


@pytest.mark.slow
def test_dry_run_plays_the_two_calls_in_their_order(tmp_path, tiny_cache, capsys):
    """Both calls as `gpu_carry` orders them, on the CPU: call 1 compares the decoders (continuous batching at its
    one row count only); call 2 plays the learning runs first, spider10's planned on at least its floor with call 1's
    rates, the built-in one after it, then items 3-6, each item reported. Call 1 runs in this process; call 2 in a
    process of its own, which knows of call 1 only what its state file holds."""
    state = tmp_path / "state.json"
    first = _dry_call(gpu_carry.CALL1_ITEMS, tmp_path / "call1", state, tiny_cache, capsys)
    assert first["status"] == {"imports": "ok", "decoders": "ok", "exactness": None, "grpo_step": None,
                               "logprob_gap": None, "bf16_step": None, "learning": None}
    items = json.loads((tmp_path / "call1" / "gpu_check.json").read_text())["items"]
    assert items["imports"]["import_errors"] == {} and items["imports"]["versions"]["trl"]

    # Item 2: every decoder at every precision and rows, timed, today's decoder's greedy tokens reproduced in fp32;
    # continuous batching (110x slower than the graph decoder on a lent H200) at the fewest rows only.
    rates = items["decoders"]["rates"]
    measured = {(r["decoder"], r["precision"], r["rows"]) for r in rates}
    assert measured == {(d, p, n) for d in ("kept", "graph") for p in ("fp32", "bf16") for n in (2, 4)} | {
        ("graph", "fp32+bf16", n) for n in (2, 4)} | {("cb", p, 2) for p in ("fp32", "bf16")}
    for rate in rates:
        assert "error" not in rate and "skipped" not in rate, rate
        assert rate["generated"] == rate["rows"] * 2 * items["decoders"]["tokens_per_turn"]
        assert rate["tokens_per_s"] > 0 and rate["seconds"] > 0
        if rate["precision"] == "fp32":
            assert rate["greedy_identical"], rate
    assert set(items["decoders"]["best"]) == {"fp32@2", "fp32@4", "bf16@2", "bf16@4"}
    assert json.loads(state.read_text())["decode"]  # kept for the next call's plan

    out = tmp_path / "call2"
    summary = _dry_call(gpu_carry.CALL2_ITEMS, out, state, tiny_cache)
    assert summary["status"] == {"imports": "ok", "decoders": None, "exactness": "ok", "grpo_step": "ok",
                                 "logprob_gap": "ok", "bf16_step": "ok", "learning": "ok"}, summary
    report = json.loads((out / "gpu_check.json").read_text())
    items = report["items"]
    played = sorted(items, key=lambda item: items[item]["started_at_s"])
    assert played == ["imports", "learning", "exactness", "grpo_step", "logprob_gap", "bf16_step"]
    assert [int(n) for n in gpu_carry.CALL2_ITEMS.split(",")] == [1, 7, 3, 4, 5, 6]

    # Item 7 first: spider10's run, planned on every second left (at least its floor), then the built-in one.
    learning = items["learning"]
    runs = learning["runs"]
    assert learning["order"] == list(runs) == ["spider10", "builtin"]
    spider, builtin = runs["spider10"], runs["builtin"]
    assert spider["floor_s"] == gpu_learning.FIRST_RUN_FLOOR_S <= spider["budget_s"] == spider["plan"]["budget_s"]
    assert spider["budget_s"] > report["deadline_s"] - learning["started_at_s"] - 5  # all that was left
    assert spider["plan"]["grpo_step_from"].startswith("estimated")  # no step measured before it: call 1's rates
    assert spider["ended_at_s"] <= builtin["started_at_s"] and builtin["budget_s"] < spider["budget_s"]
    assert "floor_s" not in builtin
    assert summary["checks"][f"spider10: budget_s>={gpu_learning.FIRST_RUN_FLOOR_S:.0f}"] is True
    assert summary["checks"]["capture_failures==0"] is None  # no CUDA graphs on a CPU
    for name, run in runs.items():
        assert run["run_status"] == "completed" and run["grpo_steps_run"] == run["grpo_steps"] >= 1, name
        for policy in ("random", "base", "trained"):
            assert run["scores"][policy]["n"] == 10
        assert 0 <= run["after_grpo"] <= 1 and 0 <= run["warm_start"] <= 1
        assert set(run["phase_seconds"]) >= {"loading model", "sft", "base eval", "grpo", "comparison"}
        assert run["plan"]["grpo_steps"] == run["grpo_steps"]
        assert 0 < run["rollout_s"] and 0 < run["rollout_share"] <= 1
        archive, *archived = run["files"]
        with tarfile.open(out / archive) as files:
            assert sorted(files.getnames()) == sorted(archived) and f"{name}_comparison.jsonl" in archived
    assert summary["rollout_share"] == spider["rollout_share"]
    assert {"spider10: warm_start>=0.2", "spider10: after_grpo>=warm_start+0.05",
            "builtin: after_grpo>=warm_start+0.1", "logprob_gap_mean_abs<=1e-2"} <= set(summary["checks"])

    # Items 3-6 after the learning runs.
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
    assert (out / "gpu_check.log").read_text().count("item ") >= 12


def test_the_sizes_of_the_calls():
    """The real run's sizes without a GPU: continuous batching at 64 rows only; items 3, 4 and 6 start only with the
    seconds they need left; a learning run after the first only with `MIN_LEARNING_S` left, the first always, on
    everything left; the items in the order `--items` names them."""
    import gpu_check
    import gpu_profile

    profile = gpu_profile.real_profile(gpu_check.build_parser().parse_args([]))
    assert profile.rows == (16, 64, 256) and profile.cb_rows == (64,) and profile.deadline_s == 480
    assert gpu_check.DEFAULT_LEARN[0].name == "smollm2_spider10_gpu.json"
    assert gpu_check.run_names(list(gpu_check.DEFAULT_LEARN)) == ["spider10", "builtin"]
    assert gpu_check.parse_items("1,7,3,4,5,6,7") == [1, 7, 3, 4, 5, 6]
    need = profile.item_min_s
    assert set(need) == {3, 4, 6}
    for number, seconds in need.items():
        assert gpu_check.too_late(number, profile, profile.deadline_s - seconds + 1) is not None
        assert gpu_check.too_late(number, profile, profile.deadline_s - seconds - 1) is None
    assert gpu_check.too_late(7, profile, profile.deadline_s + 60) is None  # the learning item plans its own time
    assert gpu_learning.run_budget(0, 30.0) == (30.0, None)
    assert gpu_learning.run_budget(1, gpu_learning.MIN_LEARNING_S + 1)[1] is None
    assert "under" in gpu_learning.run_budget(1, gpu_learning.MIN_LEARNING_S - 1)[1]


def test_a_grpo_step_through_the_graph_decoder(tmp_path, tiny_cache, capsys):
    """Item 4 as a GPU plays it: the batched rollout decodes with the graph decoder (forced here; on a CPU its step
    runs eagerly), TRL's fp32 LM head on; the sampler's recorded log-probs are the trainer's. In this process."""
    out = tmp_path / "out"
    _check_in_process(["--dry-run", "--items", "4", "--out", str(out), "--set", "grpo.cast_lm_head_to_fp32=true"],
                      capsys, tiny_cache, SQLENV_DECODER="graph")
    items = json.loads((out / "gpu_check.json").read_text())["items"]
    assert items["grpo_step"]["decoder"] == "GraphDecoder" and items["grpo_step"]["graph_error"] is None
    assert items["logprob_gap"]["tokens"] == items["grpo_step"]["rollout_generated_tokens"] > 0
    assert items["logprob_gap"]["mean_abs"] < 1e-4


@pytest.mark.parametrize("args", [["--items", "8"], ["--items", "x"], ["--deadline-minutes", "0"], ["--cb-rows", "0"],
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
    captures that failed in it, whatever decoder made them (a run's evals, the KL probe), with the graph's batch size,
    window and sampling, and counts them; the summary counts them all; the next item starts with none of them."""
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
        return {"tokens": sum(map(len, decoder.generate({0: [1, 2, 3], 1: [4, 5], 2: [6]}, 6).values()))}

    report = Report(tmp_path, {})
    report.run("exactness", item)
    report.run("grpo_step", dict)
    items = report.data["items"]
    assert items["exactness"]["status"] == "ok" and items["exactness"]["tokens"] > 0
    assert items["exactness"]["capture_failures"] == 1
    [error] = items["exactness"]["graph_errors"]
    assert (error["batch"], error["sampled"]) == (4, False) and error["window"] >= 4  # 3 rows: a batch of 4
    assert decoders[0].graphs.error in error["error"] and "batch 4" in error["error"]
    assert items["grpo_step"]["status"] == "ok" and "graph_errors" not in items["grpo_step"]
    summary = report.summary()
    assert summary["capture_failures"] == 1 and summary["capture_failures_by_item"] == {"exactness": 1}
    assert summary["checks"]["capture_failures==0"] is None  # judged on a CUDA device only
    report.data["device"] = "NVIDIA H200"
    assert report.summary()["checks"]["capture_failures==0"] is False


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
    # A step not measured (call 2 plans its first run before item 4): bounded from the decoding rate at its rows.
    fields = dict(rows_step_s=0.01, prompt_tokens=560, train_tokens_per_s=200_000.0)
    estimate = gpu_learning.grpo_step_estimate(config, **fields)
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps
    turns = min(config.step_budget * config.max_turn_tokens, config.resolved_max_completion_length())
    assert estimate > turns * 0.01 and estimate > rows * (560 + config.resolved_max_completion_length()) / 200_000
    assert gpu_learning.grpo_step_estimate(config.with_overrides({"step_budget": 2}), **fields) < estimate
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
