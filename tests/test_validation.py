"""The validation panel, keep_best and the RL-health metrics, on real runs of the tiny model on the built-in data.

- the panel is held out of GRPO's draws and of the warm start's teacher, and is disjoint from the eval split;
- keep_best hands back the kept weights: `final/` holds them (checked tensor by tensor) and the comparison plays them;
- the health metrics are in metrics.jsonl on both rollout paths.
"""

from __future__ import annotations

import json
import os

import pytest
from training_helpers import small_train_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_panel_is_held_out_of_grpo_and_the_warm_start_and_apart_from_eval(tmp_path, tiny):
    import copy

    from training.grpo import build_trainer
    from training.environment.trl_env import SQLEnvTRL
    from training.phases import sft_settings
    from training.plan import RunPlan
    from training.warm_start import teacher_conversations

    plan = RunPlan.resolve(small_train_config(tmp_path, validation_questions=40, rollout="rollout_func"))
    panel = set(plan.validation_ids)
    assert len(panel) == 40
    assert plan.config.keep_best is True  # auto: on with a panel
    train = {q.question_id for q in plan.episodes().questions}
    assert train and not panel & train
    assert not panel & {q.question_id for q in plan.episodes(plan.config.eval_split).questions}
    # The panel is the same for the same seed (a resumed run, the sweep's tries) and another for another seed.
    assert RunPlan.resolve(small_train_config(tmp_path, validation_questions=40)).validation_ids == plan.validation_ids
    assert set(RunPlan.resolve(small_train_config(tmp_path, validation_questions=40, seed=1)).validation_ids) != panel
    # keep_best asked for with no panel to judge by is refused, not quietly ignored.
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="keep_best: true needs a validation panel"):
        RunPlan.resolve(small_train_config(tmp_path, validation_questions=0, keep_best=True))

    # GRPO: its dataset holds no panel question, and its environments refuse one.
    model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    trainer = build_trainer(plan, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    drawn = set(trainer.train_dataset["question_id"])
    assert drawn and not drawn & panel
    env = SQLEnvTRL(plan.episodes())
    with pytest.raises(ValueError, match="unknown question_id"):
        env.reset(question_id=sorted(panel)[0])

    # The warm start's teacher is handed the panel, and never plays a held-out question: on the toy dataset (10
    # questions), one episode per question plays exactly the others.
    assert set(sft_settings(plan).held_out) == panel
    from sqlenv.checker import build_toy_dataset

    questions_path, _ = build_toy_dataset(tmp_path / "toy")
    ids = [q["question_id"] for q in json.loads(questions_path.read_text())]
    played = teacher_conversations(tmp_path / "toy", "train", step_budget=3, episodes=None, seed=0, prompt="full",
                                   held_out=ids[:4])
    assert sorted(c["question_id"] for c in played) == sorted(ids[4:])


def test_auto_panel_size_follows_the_split():
    from training.panel import auto_panel_size, choose_panel

    assert auto_panel_size(3400) == 64
    assert auto_panel_size(473) == 59  # spider10's train split
    assert auto_panel_size(100) == 0
    assert choose_panel([str(i) for i in range(10)], None, 0) == ()
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="more than half"):
        choose_panel([str(i) for i in range(10)], 6, 0)


def _destructive(tmp_path, name, **overrides):
    """A clean-oracle warm start, then GRPO at a rate that wrecks the model (issue 45's destructive run, small)."""
    values = dict(
        rollout="rollout_func", step_budget=4, max_turn_tokens=24, max_completion_length=128,
        num_generations=4, per_device_train_batch_size=8, learning_rate=0.05, max_steps=3, eval_every=0,
        validation_questions=16, comparison_episodes=6, compare_base=True,
        sft={"enabled": True, "max_steps": 60, "learning_rate": 0.003, "batch_size": 4, "describe": False,
             "teacher_error_rate": 0.0, "eval_every": 0})
    return small_train_config(tmp_path / name, **{**values, **overrides})


def _tensors(folder):
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, folder
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def test_keep_best_hands_back_the_kept_weights_by_content(tmp_path):
    import torch

    from training.train import run_training

    kept_run = _destructive(tmp_path, "kept")
    run_training(kept_run)
    run = tmp_path / "kept" / "run"
    status = json.loads((run / "status.json").read_text())
    keep = status["keep_best"]
    panel = [e for e in _read(run / "evals.jsonl") if e["split"] == "validation"]
    assert [e["step"] for e in panel] == [0, 3] and len(panel[0]["correct"]) == 16
    final, start = _tensors(run / "final"), _tensors(run / "warm_start")
    if keep["kept"] == "start":
        assert keep["step"] == 0 and "GRPO did not beat the warm start" in keep["reason"]
        assert final.keys() == start.keys()
        assert all(torch.equal(final[k], start[k]) for k in final)
        # The comparison played the kept weights: greedy, same seeds, same weights as the base eval.
        pairs = [r for r in _read(run / "comparison.jsonl") if r.get("kind") == "pair"]
        moves = lambda t: [(s["action_type"], s["argument"]) for s in t["steps"]]  # noqa: E731
        assert pairs and all(moves(p["trained"]) == moves(p["base"]) for p in pairs)
    else:  # GRPO did beat the start on the panel: the last step was validated and kept
        assert keep["kept"] == "last" and keep["step"] == 3
    summary = _read(run / "comparison.jsonl")[-1]
    assert summary["trained_weights"]["kept"] == keep["kept"]

    # The same run with keep_best off hands back GRPO's last weights, which the rate moved away from the start. Its
    # start is the one above, read from warm_start/ (the same 60 SFT steps on the same seed would write the same
    # weights again, ~15 CPU-s): GRPO, its panel and the comparison as above, one thread as the built-in model takes.
    run_training(_destructive(tmp_path, "last", keep_best=False, model=str(run / "warm_start"), sft=False,
                              cpu_threads=1))
    last = tmp_path / "last" / "run"
    assert json.loads((last / "status.json").read_text())["keep_best"]["kept"] == "last"
    moved = _tensors(last / "final")
    assert any(not torch.equal(moved[k], start[k]) for k in moved)
    if keep["kept"] == "start":  # ... and the panel said the start was better (or as good): that is what was kept
        assert panel[-1]["success_rate"] <= panel[0]["success_rate"]


@pytest.mark.parametrize("rollout", ["environment", "rollout_func"])
def test_health_metrics_on_both_rollout_paths(tmp_path, rollout):
    from training.train import run_training

    # The environment path's entropy is TRL's, over the tokens the loss computes: all of them without the lean loss
    # (an untrained model's groups are all-equal, which the lean loss would leave out) and with cut episodes kept (an
    # untrained model's are all cut by the 96-token budget).
    # The batched rollout's run reads the KL every 2 steps: at step 2 (its last), not at step 1.
    kl_every = 2 if rollout == "rollout_func" else 1
    config = small_train_config(tmp_path, rollout=rollout, kl_probe_episodes=2, kl_probe_every=kl_every,
                                validation_questions=8, eval_every=1, lean_loss=rollout == "rollout_func",
                                grpo={"mask_truncated_completions": rollout == "rollout_func"})
    run_training(config)
    metrics = [m for m in _read(tmp_path / "run" / "metrics.jsonl") if m.get("phase") == "grpo" and "loss" in m]
    assert len(metrics) == 2
    for record in metrics:
        for key in ("health/sampled_entropy", "grad_norm", "reward_std", "groups_mixed_success_frac"):
            assert isinstance(record.get(key), (int, float)), (key, record)
        assert record["health/sampled_entropy"] > 0
    assert [("health/kl_start" in m) for m in metrics] == [kl_every == 1, True]
    assert metrics[-1]["health/kl_start"] >= 0
    panel = [e for e in _read(tmp_path / "run" / "evals.jsonl") if e["split"] == "validation"]
    assert [e["step"] for e in panel] == [0, 1, 2]


def test_a_stopped_run_hands_back_its_best_validated_weights_not_the_unvalidated_last(tmp_path):
    """A stop ends GRPO at a step the panel never played: keep_best puts the best validated weights back (here the
    start's), so final/ holds them, tensor for tensor, though the rate moved every weight."""
    import threading

    import torch

    from training.run.directory import RunDir
    from training.train import run_training

    stop = threading.Event()

    def listener(event, payload):
        if event == "metrics" and payload.get("phase") == "grpo":
            stop.set()  # after GRPO step 1

    from training.validation import WeightsSnapshot

    written = []  # the best weights go to disk with a checkpoint, for a resume, never at each new best
    checkpoints = tmp_path / "stopped" / "run" / "checkpoints" / "grpo"
    save = WeightsSnapshot.save

    def counted(snapshot, path):
        written.append((snapshot.step, sorted(p.name for p in checkpoints.glob("checkpoint-*"))))
        save(snapshot, path)

    config = _destructive(tmp_path, "stopped", max_steps=3, save_steps=10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WeightsSnapshot, "save", counted)
        run = RunDir(run_training(config, stop_event=stop, listener=listener))
    status = run.read_status()
    assert status["status"] == "stopped" and status["step"] == 1
    keep = status["keep_best"]
    assert keep["kept"] == "start" and keep["step"] == 0 and "stopped at step 1" in keep["reason"], keep
    final, start = _tensors(run.final_dir), _tensors(run.path / "warm_start")
    assert all(torch.equal(final[k], start[k]) for k in final)
    assert written == [(0, ["checkpoint-1"])]  # the start's weights, once, with the stop's checkpoint
    beside = json.loads((checkpoints / "best_weights.json").read_text())
    assert beside["checkpoint_step"] == 1 and beside["weights_step"] == 0 and beside["keep_best"]["best_step"] == 0

    # Resumed, the run reads the best as of its checkpoint back (the start is not played again) and finishes.
    from training.train import resume_training

    resume_training(run.path)
    status = run.read_status()
    assert status["status"] == "completed" and status["resumes"] == 1
    panel = [e["step"] for e in _read(run.path / "evals.jsonl") if e["split"] == "validation"]
    assert panel == [0, 3] and status["keep_best"]["start_step"] == 0
    if status["keep_best"]["kept"] == "start":  # read back: the weights before the destructive steps
        final = _tensors(run.final_dir)
        assert all(torch.equal(final[k], start[k]) for k in final)


def test_a_resume_that_lost_the_best_s_record_plays_the_panel_again_in_place_of_the_old_line(tmp_path):
    """A process killed after its checkpoint was written and before `on_save` wrote the best beside it (CI's SIGKILL
    once landed there) resumes without the record: it plays the panel again at the checkpoint's step, and that line
    replaces the one the killed process wrote, so the run holds one validation line per step."""
    import threading

    from training.run.directory import RunDir
    from training.train import resume_training, run_training

    stop = threading.Event()

    def listener(event, payload):
        if event == "metrics" and payload.get("phase") == "grpo":
            stop.set()  # after GRPO step 1, which the panel has played (eval_every 1)

    config = _destructive(tmp_path, "lost", max_steps=2, eval_every=1, save_steps=10)
    run = RunDir(run_training(config, stop_event=stop, listener=listener))
    assert run.read_status()["status"] == "stopped"
    panel = [e["step"] for e in _read(run.path / "evals.jsonl") if e["split"] == "validation"]
    assert panel == [0, 1]
    for name in ("best_weights.json", "best_weights.pt"):  # what the killed process never wrote
        (run.path / "checkpoints" / "grpo" / name).unlink(missing_ok=True)

    resume_training(run.path)
    status = run.read_status()
    assert status["status"] == "completed" and status["resumes"] == 1
    panel = [e["step"] for e in _read(run.path / "evals.jsonl") if e["split"] == "validation"]
    assert panel == [0, 1, 2], panel
    assert status["keep_best"]["start_step"] == 1  # the start's record was lost with the file: judged from step 1
