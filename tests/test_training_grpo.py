"""Real short GRPO runs on CPU with the built-in tiny model: environment_factory and rollout_func paths,
run_training end to end (run directory, comparison), the stop flag, failed runs, torn JSONL lines, the CLI.

Kept small (2-step runs, 2-step episodes, 16-token turns, SFT off or 1 step) so the file stays within a few
minutes on 2 cores.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from training_helpers import small_train_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _small_config(tmp_path, **overrides):
    return small_train_config(tmp_path, **{"trace_every": 1, "eval_every": 1, **overrides})


def _fresh(tiny):
    model, tokenizer = tiny
    return copy.deepcopy(model), copy.deepcopy(tokenizer)


METRIC_KEYS = ("reward", "reward_std", "rewards/reward_correctness/mean", "rewards/reward_progress/mean",
               "rewards/reward_operational/mean", "tools/call_frequency", "tools/failure_frequency",
               "completions/clipped_ratio", "frac_reward_zero_std", "step_time", "loss", "learning_rate")


def test_grpo_through_environment_factory(tiny, tmp_path):
    from training.grpo import build_trainer
    from training.environment.trl_env import SQLEnvTRL

    config = _small_config(tmp_path)
    model, tokenizer = _fresh(tiny)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    assert trainer.max_tool_calling_iterations == config.step_budget
    factory = trainer.environment_factories[None]
    assert factory.func is SQLEnvTRL and factory.args[0].step_budget == config.step_budget  # bound to the run's data
    assert [t.__name__ for t in trainer.tools] == ["answer", "describe", "query", "sample"]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for key in METRIC_KEYS:
        assert key in logs[-1], key
    # Every rollout's environment played a real train question; a group shares its question.
    envs = trainer.environments
    assert len(envs) == config.generation_batch_size and all(isinstance(e, SQLEnvTRL) for e in envs)
    questions = [e.observation.question for e in envs]
    assert all(questions) and questions[0] == questions[1]


def test_grpo_through_rollout_func(tiny, tmp_path):
    from training.grpo import build_trainer
    from training.grpo.rewards import reward_operational
    from training.grpo.rollout import BatchedRollout

    config = _small_config(tmp_path, rollout="rollout_func")
    model, tokenizer = _fresh(tiny)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    assert isinstance(trainer.rollout_func, BatchedRollout)
    prompts = [trainer.train_dataset[i]["prompt"] for i in (0, 0, 1)]
    out = trainer.rollout_func(prompts, trainer)
    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "correctness", "progress",
                        "operational", "tool_calls", "tool_failures"}
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        assert len(ids) == len(mask) and 0 < len(ids) <= config.resolved_max_completion_length()
        assert mask[0] == 1  # the completion starts with generated tokens
    question = trainer.train_dataset[0]["prompt"][1]["content"].splitlines()[0]
    assert question in tokenizer.decode(out["prompt_ids"][0])
    # The untrained model's text is played as QUERY actions: each costs the step cost, so operational < 0.
    assert reward_operational(prompts, [None] * 3, **out) == out["operational"]
    assert all(v < 0 for v in out["operational"])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for key in METRIC_KEYS:
        assert key in logs[-1], key
    assert logs[-1]["tools/call_frequency"] > 0


def test_a_kept_decoder_reads_nothing_cached_by_an_earlier_play(tiny):
    """The batched rollout keeps one decoder across GRPO steps (its graphs, on a GPU), and play_batched keys its rows
    by the episodes' `id()`, which Python reuses once a step's episodes are gone: a row cached by an earlier play,
    computed by the weights of its step, must never be read for a later one. Here the same episode objects (the same
    ids, the same prompt tokens) are played again after every weight moved."""
    import torch

    from training.generation.chat import ChatRenderer
    from training.generation.decoders import kept_cache_decoder
    from training.generation.episodes import Episode, play_batched
    from sqlenv.environment import SQLEnvironment
    from sqlenv.agent.prompts import format_tool_result, initial_messages

    model, tokenizer = _fresh(tiny)
    renderer = ChatRenderer(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    decoder = kept_cache_decoder(model, pad, set(renderer.eos_token_ids))
    envs = [SQLEnvironment.from_dataset("builtin", "train", step_budget=2) for _ in range(3)]

    def episodes(reuse=None):
        out = reuse or [Episode(messages=[], prompt_ids=[], step=None) for _ in envs]
        for e, env, seed in zip(out, envs, (0, 0, 1)):
            obs = env.reset(seed=seed)
            e.__init__(messages=initial_messages(obs, "full"), prompt_ids=renderer.prompt_ids(initial_messages(obs, "full")),
                       step=lambda a, env=env: (lambda o: (format_tool_result(o), o, o.done))(env.step(a)),
                       observation=obs)
        return out

    played = episodes()
    play_batched(model, renderer, played, max_turn_tokens=12, sample=False, decoder=decoder)
    with torch.no_grad():  # an optimizer step: every weight moves
        for p in model.parameters():
            p.mul_(1.25)
    again = play_batched(model, renderer, episodes(played), max_turn_tokens=12, sample=False, decoder=decoder)
    fresh = play_batched(model, renderer, episodes(), max_turn_tokens=12, sample=False)
    assert [e.completion_ids for e in again] == [e.completion_ids for e in fresh]
    for env in envs:
        env.close()


def _shared_text_dataset(root: Path) -> Path:
    """The toy dataset plus `music_copy`, the music database with fewer singers, asked the same question as music:
    two questions with the same text and the same table list, different answers."""
    import shutil
    import sqlite3

    from sqlenv.checker import build_toy_dataset

    questions_path, db_dir = build_toy_dataset(root)
    (db_dir / "music_copy").mkdir()
    copy_db = db_dir / "music_copy" / "music_copy.sqlite"
    shutil.copy(db_dir / "music" / "music.sqlite", copy_db)
    with sqlite3.connect(copy_db) as conn:
        conn.execute("DELETE FROM singer WHERE singer_id > 7")
    questions = json.loads(questions_path.read_text())
    original = next(q for q in questions if q["question_id"] == "music_q1")
    questions.append({**original, "question_id": "music_copy_q1", "database_name": "music_copy", "gold_answer": 7})
    questions_path.write_text(json.dumps(questions))
    return root


def test_rollout_plays_the_question_of_its_row_when_two_databases_share_its_text(tiny, tmp_path):
    """The question id travels with the row into `rollout_func`: prompts that read the same (same question text,
    same tables) still play their own database's question."""
    from training.grpo import build_trainer
    from training.grpo.rollout import prompt_question_id

    root = _shared_text_dataset(tmp_path / "shared")
    config = _small_config(tmp_path, rollout="rollout_func", dataset=str(root), eval_split="train", step_budget=1)
    model, tokenizer = _fresh(tiny)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    rows = {row["question_id"]: row for row in trainer.train_dataset}
    original, copy_ = rows["music_q1"]["prompt"], rows["music_copy_q1"]["prompt"]
    assert original[-1]["content"] == copy_[-1]["content"]  # nothing in the text tells them apart
    assert (prompt_question_id(original), prompt_question_id(copy_)) == ("music_q1", "music_copy_q1")
    trainer.rollout_func([copy_, original, copy_], trainer)
    played = [env.environment.transcript() for env in trainer.rollout_func.environments(3)]
    assert [(t["question_id"], t["database"], t["gold_answer"]) for t in played] == [
        ("music_copy_q1", "music_copy", 7), ("music_q1", "music", 30), ("music_copy_q1", "music_copy", 7)]
    # A prompt that names no question is refused, not guessed from its text.
    unnamed = [{k: v for k, v in m.items() if k != "question_id"} for m in original]
    with pytest.raises(ValueError, match="names no question"):
        trainer.rollout_func([unnamed], trainer)


def test_kl_reference_is_the_policy_in_memory(tiny, tmp_path):
    """With beta > 0 the KL anchor must be the model GRPO starts from (e.g. after SFT warm-start in memory), not
    the weights TRL would reload from `config._name_or_path` on disk."""
    import torch

    from training.grpo import build_trainer

    model, tokenizer = _fresh(tiny)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)  # differs from the cached weights on disk, as a warm-started model does
    config = _small_config(tmp_path, rollout="rollout_func", beta=0.1)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    reference = dict(trainer.ref_model.named_parameters())
    for name, parameter in trainer.model.named_parameters():
        assert torch.equal(parameter.detach(), reference[name].detach()), name


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradient_checkpointing_setting_reaches_the_grpo_trainer(tiny, tmp_path, checkpointing):
    """TRL's GRPOConfig defaults gradient_checkpointing to True: our False must reach the trainer too."""
    from training.grpo import build_trainer

    model, tokenizer = _fresh(tiny)
    config = _small_config(tmp_path, rollout="rollout_func", gradient_checkpointing=checkpointing)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    assert trainer.args.gradient_checkpointing is checkpointing  # the Trainer enables it from its args at train()


def test_run_training_end_to_end(tiny, tmp_path):
    from training.run.directory import RunDir
    from training.train import run_training

    events: list[tuple[str, dict]] = []
    config = _small_config(tmp_path, sft={"enabled": True, "max_steps": 1, "episodes": 4, "batch_size": 2},
                           compare_base=True)
    run_path = run_training(config, listener=lambda e, p: events.append((e, p)))
    run = RunDir(run_path)
    status = run.read_status()
    assert status["status"] == "completed", status
    assert status["step"] == 2 and status["total_steps"] == 2 and status["sft"]["steps"] == 1
    saved = run.read_config()
    assert saved["max_tool_calling_iterations"] == 2 and saved["sft"]["enabled"] is True
    # Every line says its phase; SFT's lines come first (loss, token accuracy, learning rate), then GRPO's.
    metrics = run.read("metrics")
    assert [(m["phase"], m["step"]) for m in metrics] == [("sft", 1), ("grpo", 1), ("grpo", 2)]
    assert all(k in metrics[0] for k in ("loss", "mean_token_accuracy", "learning_rate", "time"))
    assert all("reward" in m and "time" in m for m in metrics[1:])
    # Evals during SFT too (from the random-init model at step 0); GRPO continues from SFT's last eval.
    evals = run.read("evals")
    assert {(e["phase"], e["step"], e["split"]) for e in evals} == {
        (phase, step, split) for phase, step in (("sft", 0), ("sft", 1), ("grpo", 1), ("grpo", 2))
        for split in ("train", "eval")}
    traces = run.read("transcripts")
    assert [(t["phase"], t["step"]) for t in traces] == [("sft", 1), ("grpo", 1), ("grpo", 2)]
    assert traces[0]["transcript"]["steps"]
    comparison = run.read("comparison")
    pairs = [c for c in comparison if c["kind"] == "pair"]
    summary = [c for c in comparison if c["kind"] == "summary"]
    assert len(pairs) == 2 and len(summary) == 1
    for pair in pairs:  # same question, same seed, for both policies
        assert pair["random"]["question_id"] == pair["trained"]["question_id"] == pair["base"]["question_id"]
        assert pair["random"]["seed"] == pair["trained"]["seed"] == pair["seed"]
    assert set(summary[0]["random"]) >= {"success_rate", "avg_reward", "avg_steps"}
    assert summary[0]["trained"] and summary[0]["base"]
    for who in ("random", "base", "trained"):  # EX and the breakdown beside success, on the same episodes
        scores = summary[0][who]
        assert isinstance(scores["execution_accuracy"], float) and scores["breakdown"]["overall"]["n"] == 2
        assert scores["success_ci"][0] <= scores["success_rate"] <= scores["success_ci"][1]
        assert all(isinstance(pair[who]["execution_match"], bool) for pair in pairs)
    assert all(e["breakdown"]["overall"]["n"] == e["n_episodes"] and "execution_accuracy" in e for e in evals)
    assert (run.final_dir / "config.json").exists() and (run.final_dir / "tokenizer_config.json").exists()
    assert not (run.path / ".trainer").exists()
    kinds = {e for e, _ in events}
    assert kinds == {"status", "metrics", "evals", "transcripts", "comparison"}
    statuses = [p["status"] for e, p in events if e == "status"]
    assert statuses[0] == "queued" and "running" in statuses and statuses[-1] == "completed"
    # the saved model loads back through the same path as any local model
    from training.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(run.final_dir), device="cpu")
    assert model.config.model_type == "qwen3"


def test_stop_flag_ends_training_within_one_step(tmp_path):
    from training.run.directory import RunDir
    from training.train import run_training

    stop = threading.Event()
    steps_seen: list[int] = []

    def listener(event, payload):
        if event == "metrics":
            steps_seen.append(payload["step"])
            stop.set()

    config = _small_config(tmp_path, max_steps=50, eval_every=0, trace_every=0, comparison_episodes=1)
    run_path = run_training(config, stop_event=stop, listener=listener)
    run = RunDir(run_path)
    status = run.read_status()
    assert status["status"] == "stopped", status
    assert steps_seen == [1] and status["step"] == 1
    assert (run.final_dir / "config.json").exists()
    assert [c["kind"] for c in run.read("comparison")] == ["pair", "summary"]


def test_stop_before_start_marks_stopped(tmp_path):
    from training.run.directory import RunDir
    from training.train import run_training

    stop = threading.Event()
    stop.set()
    run = RunDir(run_training(_small_config(tmp_path), stop_event=stop))
    assert run.read_status()["status"] == "stopped"
    assert not run.final_dir.exists()


def test_failed_run_is_marked_with_message(tmp_path):
    from training.run.directory import RunDir
    from training.train import run_training

    config = _small_config(tmp_path, model=str(tmp_path / "no-such-model"))
    with pytest.raises(Exception) as info:
        run_training(config)
    status = RunDir(tmp_path / "run").read_status()
    assert status["status"] == "failed"
    assert "no-such-model" in status["error"] and str(info.value) in status["error"]
    assert status["finished_at"]


def test_torn_jsonl_line_is_skipped(tmp_path):
    from training.run.recorder import RunRecorder
    from training.run.directory import RunDir
    from training.run.listing import list_runs

    run = RunDir.create(tmp_path, "torn")
    recorder = RunRecorder(run)
    recorder.config({"model": "builtin:tiny", "dataset": "builtin"})
    recorder.status("running", step=1)
    recorder.append("metrics", {"step": 1, "reward": 0.5, "bad": float("nan")})
    with open(run.file("metrics.jsonl"), "a", encoding="utf-8") as f:
        f.write('{"step": 2, "rew')  # a writer mid-append
    assert run.read("metrics") == [{"step": 1, "reward": 0.5, "bad": None}]
    assert list_runs(tmp_path)[0]["run_id"] == "torn"


def test_non_main_process_writes_nothing(tmp_path):
    from training.run.recorder import RunRecorder
    from training.run.directory import RunDir

    run = RunDir(tmp_path / "r")
    recorder = RunRecorder(run, is_main=False)
    recorder.config({"a": 1})
    recorder.status("running")
    recorder.append("metrics", {"step": 1})
    assert not run.path.exists()


def test_cli_bad_arguments_exit_2_with_one_line(tmp_path):
    env = {**os.environ, "SQLENV_RUNS_DIR": str(tmp_path)}
    for args in (["--set", "nosuchkey=1"], ["--config", str(tmp_path / "missing.json")],
                 ["--set", "num_generations=1"], ["--bogus-flag"]):
        proc = subprocess.run([sys.executable, "-m", "training.train", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())  # nothing was created


def test_model_policy_matches_batched_evaluation(tiny):
    """ModelPolicy (one episode at a time through sqlenv.evaluate) and the batched evaluate_model render and
    decode the same way: greedy decoding gives the same actions on the same seeds."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.evaluation.evaluate import evaluate
    from training.generation.model_policy import ModelPolicy, evaluate_model

    model, tokenizer = tiny
    env = SQLEnvironment.from_dataset("builtin", split="eval", step_budget=2)
    try:
        one = evaluate(env, ModelPolicy(model, tokenizer, max_turn_tokens=8), n_episodes=2, seed=3)
    finally:
        env.close()
    batched = evaluate_model(model, tokenizer, dataset="builtin", split="eval", n_episodes=2, seed=3,
                             step_budget=2, max_turn_tokens=8)
    assert [e["question_id"] for e in one.episodes] == [e["question_id"] for e in batched.episodes]
    assert [[(s["action_type"], s["argument"]) for s in e["steps"]] for e in one.episodes] == \
        [[(s["action_type"], s["argument"]) for s in e["steps"]] for e in batched.episodes]
    assert all(e["policy"] == "model" and e["n_steps"] == 2 for e in batched.episodes)


def _scripted(tokenizer, text: str, anchor: list[int]) -> dict:
    """Generation kwargs that make any model write `text` after `anchor` (the end of the generation prompt):
    a +100 logit bias on each next token of `text` given everything since the anchor. The model, TRL's
    tool loop and the environment stay real; only what the model says is fixed, so outcomes are exact."""
    target = tokenizer(text, add_special_tokens=False)["input_ids"]
    bias = {}
    for i, token in enumerate(target):
        bias[tuple(anchor + target[:i] + [token])] = 100.0
    return {"sequence_bias": bias}


def _scripted_query_trainer(tiny, tmp_path, **config_overrides):
    """(config, trainer, tokenizer) whose model always calls query("SELECT 1"), steered by a logit bias."""
    from training.generation.chat import ChatRenderer
    from training.grpo import build_trainer

    config = _small_config(tmp_path, max_completion_length=400, max_turn_tokens=40, **config_overrides)
    model, tokenizer = _fresh(tiny)
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    anchor = renderer.prompt_ids([{"role": "user", "content": "x"}])[-4:]
    call = '<tool_call>\n{"name": "query", "arguments": {"sql": "SELECT 1"}}\n</tool_call><|im_end|>'
    generation = {"max_new_tokens": 40, **_scripted(tokenizer, call, anchor)}
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"),
                            generation_kwargs=generation, max_steps=1)
    return config, trainer, tokenizer


def test_environment_path_runs_tool_calls_within_the_budget(tiny, tmp_path):
    """A model that always calls query("SELECT 1"): TRL runs exactly step_budget calls per episode through
    SQLEnvTRL, then stops; the rewards are the environment's: +0.01 (ran, new) then -0.03 (repeat)."""
    config, trainer, _ = _scripted_query_trainer(tiny, tmp_path)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "reward" in h)
    assert log["tools/call_frequency"] == pytest.approx(config.step_budget)
    assert log["tools/failure_frequency"] == 0.0
    assert log["rewards/reward_operational/mean"] == pytest.approx(0.01 - 0.03)
    assert log["rewards/reward_correctness/mean"] == 0.0
    for env in trainer.environments:
        assert env.done and env.tool_calls == config.step_budget and env.post_episode_calls == 0
        assert [s["argument"] for s in env.transcript["steps"]] == ["SELECT 1"] * config.step_budget


def test_rollout_path_runs_tool_calls_within_the_budget(tiny, tmp_path):
    """The same scripted model on the rollout_func path: the episode ends when the budget is spent, the
    reward fields and env_mask say so."""
    config, trainer, tokenizer = _scripted_query_trainer(tiny, tmp_path, rollout="rollout_func")
    prompts = [trainer.train_dataset[i]["prompt"] for i in (0, 0)]
    out = trainer.rollout_func(prompts, trainer)
    assert out["operational"] == pytest.approx([0.01 - 0.03] * 2) and out["correctness"] == [0.0, 0.0]
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        text = tokenizer.decode(ids)
        assert text.count("<tool_call>") == config.step_budget and text.endswith("<|im_end|>")
        # model tokens, then the tool result (masked), then model tokens again
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
        masked = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
        assert "<tool_response>" in masked and "1 step left" in masked
    trainer.train()
    log = next(h for h in trainer.state.log_history if "reward" in h)
    assert log["tools/call_frequency"] == pytest.approx(config.step_budget)
    assert log["rewards/reward_operational/mean"] == pytest.approx(0.01 - 0.03)


def test_an_existing_run_is_never_overwritten(tmp_path):
    from training.run.directory import RunDir
    from training.train import run_training

    run = RunDir.create(tmp_path, "taken")
    run.write_status("completed", step=5)
    with pytest.raises(FileExistsError, match="already holds a run"):
        run_training(_small_config(tmp_path, output_dir=str(run.path)))
    assert run.read_status()["status"] == "completed" and run.read_status()["step"] == 5


def test_cli_trains_and_prints_progress(tmp_path):
    out = tmp_path / "cli-run"
    args = ["--config", str(REPO / "configs" / "tiny_cpu.json"), "--set", f"output_dir={out}"]
    for key, value in dict(max_steps=1, num_generations=2, per_device_train_batch_size=2, step_budget=2,
                           max_completion_length=64, max_turn_tokens=12, sft="false", eval_every=0,
                           trace_every=0, comparison_episodes=1, compare_base="false").items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.run([sys.executable, "-m", "training.train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 1/1" in proc.stdout and "trained:" in proc.stdout
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last == {"run_dir": str(out), "status": "completed"}
    again = subprocess.run([sys.executable, "-m", "training.train", *args], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 2 and "already holds a run" in again.stderr
