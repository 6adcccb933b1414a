"""One GRPO step's loss phase through TRL's loss and through `SQLEnvGRPOTrainer`'s, on the same rollouts.

    nice python bench/learning/grpo_loss.py --model builtin:tiny                   # minutes: the gradient check
    nice python bench/learning/grpo_loss.py --model smollm2-135m                   # the CPU recipe's step
    nice python bench/learning/grpo_loss.py --model smollm2-135m --rollouts model  # ...on the zero-shot model's own

The step has the shape of `--config` (default `configs/smollm2_cpu.json`: 16 episodes = 4 questions x 4 generations,
1 row per micro-batch, 16 accumulated, 400-token episodes of 96-token turns, `dr_grpo`, beta 0); `--model` replaces
its model. The rollouts are played once through the recipe's own rollout path (`BatchedRollout`: its environments,
turn and episode caps, truncation masking and rewards), by one of:

- `--rollouts teacher` (default): the warm start's teacher plays the model's turns, each turn's tokens being the tool
  call as the chat template renders it, i.e. what a warm-started model emits. `--mixed-groups K` (default 2) of the 4
  questions get a mixed group (half the oracle, half `--mistake`, default `wrong_query`: it describes and queries like
  the oracle, with a wrong filter), the others an all-oracle or an all-`guess` group, i.e. about 50% of the rows in
  groups of equal rewards, the middle of the 25-75% the CPU recipe's GRPO steps showed (issue 34). A zero-shot model fails every episode (all rows equal) and the tiny model needs thousands of warm-start steps
  before its groups mix, so neither gives a gradient to compare.
- `--rollouts model`: the model samples them as GRPO does: as loaded (zero-shot), after `--warm-start N` steps of its
  own warm-start recipe (`configs/tiny_cpu.json`'s for the tiny model, the step config's otherwise), or from `--init`.

The same generation batch is then replayed into three trainers built by `training.grpo.build_trainer` from copies of
the same weights, each running one real step (`train()`: TRL's buffering, shuffling and accumulation) up to the
optimizer step:

- `trl`: `lean_loss=False`, i.e. `GRPOTrainer.compute_loss` as TRL ships it;
- `trim only`: the lean loss with no row dropped (each micro-batch trimmed to its own longest row);
- `new`: the lean loss (zero-advantage and empty rows dropped, and trimmed).

Each loss phase is timed from its first `compute_loss` to the optimizer step (wall and process CPU seconds, the median
of `--repeats` interleaved rounds; CPU seconds barely move when other work shares the cores), and its gradients are
compared with `trl`'s: `max_rel_grad_diff` is the max over parameter tensors of max|g - g_trl| / max|g_trl|. Also printed: the rollouts'
success and mixed groups, the rows dropped, the tokens each loss fed the model (TRL pads every row to the batch's
longest prompt and completion), the prompt tokens per row and the prefix all prompts share (what prefix sharing
would save). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads on a shared machine
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
DEFAULT_CONFIG = REPO / "configs" / "smollm2_cpu.json"
TINY_RECIPE = REPO / "configs" / "tiny_cpu.json"

from training.generation.multi_turn import KeptRows  # noqa: E402 - after the path (no torch)


def log(message: str) -> None:
    print(message, flush=True)


class _Recorded(Exception):
    """Stops the recording trainer once its rollouts are recorded (its loss phase is not needed)."""


class _StepDone(Exception):
    """Stops a trainer at its optimizer step, once the gradients are read."""


class Recorder:
    """Wraps the real `rollout_func`: plays the generation batch once, keeps it, and stops the trainer."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.batch = None
        self.prompts = None
        self.seconds = 0.0

    def __call__(self, prompts, trainer):
        start = time.perf_counter()
        self.batch = self.rollout(prompts, trainer)
        self.seconds = time.perf_counter() - start
        self.prompts = copy.deepcopy(prompts)
        raise _Recorded


class Replay:
    """A `rollout_func` returning the recorded generation batch (for the same prompts: the trainers are seeded)."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def __call__(self, prompts, trainer):
        if prompts != self.recorder.prompts:
            raise RuntimeError("the replaying trainer drew other questions than the recording one")
        return copy.deepcopy(self.recorder.batch)


class TeacherDecoder(KeptRows):
    """Stands in for the model in `play_batched`: each turn, the episode's teacher picks its action and the turn's
    tokens are that tool call as the chat template renders an assistant turn (up to its end-of-turn token).

    It plays a kept-cache decoder's part (`KeptRows`, what `play_batched` asks of a decoder it is handed): its rows
    are the episodes whose teacher has started, each with the turns it emitted (`ids`; no keys or values are
    computed), so `forget` restarts a teacher; a teacher samples nothing, so `last_logprobs` stays empty."""

    def __init__(self, renderer, episodes, envs, policies):
        self.renderer = renderer
        self.by_key = {id(e): (env, policy) for e, env, policy in zip(episodes, envs, policies)}
        self._rows: dict = {}
        self._turns: dict = {}
        self.last_logprobs: dict = {}

    def generate(self, sequences, max_new_tokens, *, sample=False, temperature=1.0):
        out = {}
        for key in sequences:
            env, policy = self.by_key[key]
            if key not in self._rows:
                policy.reset(env.environment, env.observation)
                self._rows[key] = SimpleNamespace(ids=[])
            out[key] = self.turn_ids(policy.act(env.environment, env.observation))
            self._rows[key].ids += out[key]
        return out

    def turn_ids(self, action) -> list[int]:
        from sqlenv.agent.prompts import action_to_tool_call

        key = (action.action_type, action.argument)
        if key not in self._turns:
            # The turn's text after the generation prompt, tokenized alone: what a model sampling it emits (the
            # template's tokens across that boundary may merge differently).
            r = self.renderer
            render = dict(tokenize=False, chat_template=r.chat_template, **r.chat_template_kwargs)
            user = [{"role": "user", "content": "dummy"}]
            prefix = r.tokenizer.apply_chat_template(user, add_generation_prompt=True, **render)
            turn = {"role": "assistant", "content": "", "tool_calls": [action_to_tool_call(action)]}
            full = r.tokenizer.apply_chat_template(user + [turn], add_generation_prompt=False, **render)
            if not full.startswith(prefix):
                raise RuntimeError("the chat template does not render an assistant turn after its generation prompt")
            ids = r.tokenizer.encode(full[len(prefix):], add_special_tokens=False)
            end = next((i for i, t in enumerate(ids) if t in r.eos_token_ids), len(ids) - 1)
            self._turns[key] = ids[: end + 1]
        return list(self._turns[key])


def teacher_policies(n: int, num_generations: int, mixed_groups: int, mistake: str, seed: int = 0) -> list:
    """One teacher per row of the generation batch (rows come in groups of `num_generations`): the first
    `mixed_groups` groups half oracle, half `mistake`; the others all oracle or all `guess`, alternately (a wrong
    query can still find the right answer, a guess almost never does, so those groups are all equal). TRL pads every
    row to the batch's longest, so a dropped row's own length does not change TRL's time."""
    from sqlenv.evaluation.policies import MISTAKES, OraclePolicy

    policies = []
    for row in range(n):
        group, member = divmod(row, num_generations)
        if group < mixed_groups:
            policy = MISTAKES[mistake](seed=seed + row) if member % 2 else OraclePolicy(describe=True)
        else:
            policy = MISTAKES["guess"](seed=seed + row) if (group - mixed_groups) % 2 else OraclePolicy(describe=True)
        policies.append(policy)
    return policies


class TeacherRollout:
    """The recipe's `BatchedRollout`, its turns played by teachers (`TeacherDecoder`) instead of the model."""

    def __init__(self, rollout, num_generations: int, mixed_groups: int, mistake: str):
        self.rollout = rollout
        self.num_generations, self.mixed_groups, self.mistake = num_generations, mixed_groups, mistake

    def __call__(self, prompts, trainer):
        import training.grpo.rollout as batched

        play = batched.play_batched
        rollout = self.rollout
        policies = teacher_policies(len(prompts), self.num_generations, self.mixed_groups, self.mistake)

        def teacher_play(model, renderer, episodes, **kwargs):
            envs = rollout.environments(len(episodes))  # the pool BatchedRollout reset for these episodes, in order
            decoder = TeacherDecoder(renderer, episodes, envs, policies)
            return play(None, renderer, episodes, **{**kwargs, "generation_config": None, "keep_cache": True,
                                                     "decoder": decoder})

        batched.play_batched = teacher_play  # BatchedRollout calls it by this module name
        try:
            return rollout(prompts, trainer)
        finally:
            batched.play_batched = play


def step_config(args):
    from training.config import TrainConfig

    # No KL probe: it samples episodes at each trainer's start (4 trainers here), none of them part of the loss phase.
    overrides = {"model": args.model, "sft": False, "max_steps": 1, "save_steps": 0, "plot_every": 1,
                 "kl_probe_episodes": 0, "trace_every": 0, "eval_every": 0, "compare_base": False,
                 "output_dir": tempfile.mkdtemp(prefix="sqlenv-grpo-loss-")}
    return TrainConfig.from_json(args.config).with_overrides(overrides)


def warm_start(model, tokenizer, args, config) -> dict:
    from training.config import BUILTIN_MODEL, TrainConfig
    from training.warm_start import SFTSettings, run_sft

    recipe = TrainConfig.from_json(TINY_RECIPE) if args.model == BUILTIN_MODEL else config
    # The step's prompt (a warm start on another prompt would play these rollouts off its own distribution).
    recipe = recipe.with_overrides({"prompt": config.prompt, "sft": {
        **_sft_dict(recipe), "enabled": True, "max_steps": args.warm_start, "eval_every": 0}})
    settings = SFTSettings.from_config(recipe)
    result = run_sft(model, tokenizer, settings)
    return {"steps": result.steps, "seconds": round(result.seconds, 1), "learning_rate": settings.learning_rate,
            "batch": settings.batch_size}


def _sft_dict(config) -> dict:
    import dataclasses

    return dataclasses.asdict(config.sft)


def record_rollouts(config, model, tokenizer, args) -> Recorder:
    from training.grpo import build_trainer

    trainer = build_trainer(config, copy.deepcopy(model), tokenizer, output_dir=str(Path(config.output_dir) / "rec"))
    rollout = trainer.rollout_func
    if args.rollouts == "teacher":
        rollout = TeacherRollout(rollout, config.num_generations, args.mixed_groups, args.mistake)
    recorder = Recorder(rollout)
    trainer.rollout_func = recorder
    try:
        trainer.train()
    except _Recorded:
        pass
    del trainer
    gc.collect()
    return recorder


def loss_phase(label: str, config, model, tokenizer, recorder: Recorder, *, drop: bool = True,
               reference: dict | None = None) -> tuple[dict, dict]:
    """One step of a fresh copy of `model` on the recorded rollouts: (figures, gradients)."""
    from transformers import TrainerCallback

    from training.grpo import build_trainer

    clock: dict = {}
    grads: dict = {}

    class _AtOptimizerStep(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            clock["wall"] = time.perf_counter() - clock["wall0"]
            clock["cpu"] = time.process_time() - clock["cpu0"]
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads[name] = p.grad.detach().clone()
            raise _StepDone

    trainer = build_trainer(config, copy.deepcopy(model), tokenizer, callbacks=[_AtOptimizerStep()],
                            output_dir=str(Path(config.output_dir) / label.replace(" ", "_")))
    trainer.rollout_func = Replay(recorder)
    if not drop:
        droppable = trainer.droppable_rows
        trainer.droppable_rows = lambda inputs: None if (d := droppable(inputs)) is None else d & False
    compute_loss = trainer.compute_loss

    def timed(*a, **k):
        clock.setdefault("wall0", time.perf_counter())
        clock.setdefault("cpu0", time.process_time())
        return compute_loss(*a, **k)

    trainer.compute_loss = timed
    try:
        trainer.train()
    except _StepDone:
        pass
    stats = trainer.loss_phase
    out = {"loss_s": round(clock["wall"], 2), "loss_cpu_s": round(clock["cpu"], 2), "loss_type": trainer.loss_type}
    if trainer.lean_loss:
        out.update(rows=stats.rows, rows_dropped=stats.rows_dropped, micro_batches_skipped=stats.micro_batches_skipped,
                   tokens_padded=stats.tokens_padded, tokens_fed=stats.tokens_fed, prompt_tokens=stats.prompt_tokens)
    if reference is not None:
        out["max_rel_grad_diff"] = max_rel_diff(grads, reference)
    del trainer
    gc.collect()
    return out, grads


def max_rel_diff(new: dict, ref: dict) -> float:
    """Max over parameter tensors of max|g_new - g_ref| / max|g_ref| (the absolute difference where g_ref is 0). A
    parameter without a gradient (no backward reached it: every row was dropped) has a zero one."""
    import torch

    worst = 0.0
    for name in new.keys() | ref.keys():
        g = ref[name] if name in ref else torch.zeros_like(new[name])
        other = new[name] if name in new else torch.zeros_like(g)
        scale = float(g.abs().max())
        diff = float((other - g).abs().max())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def median_phase(runs: list[dict]) -> dict:
    """The runs of one loss phase: their median seconds, their worst gradient difference, the rest as the first's."""
    import statistics

    out = dict(runs[0])
    for key in ("loss_s", "loss_cpu_s"):
        out[key] = round(statistics.median(r[key] for r in runs), 2)
    if "max_rel_grad_diff" in out:
        out["max_rel_grad_diff"] = max(r["max_rel_grad_diff"] for r in runs)
    return out


def rollout_summary(batch: dict, num_generations: int) -> dict:
    import os.path

    rewards = batch["correctness"]
    groups = [rewards[i:i + num_generations] for i in range(0, len(rewards), num_generations)]
    prompts = batch["prompt_ids"]
    completions = [len(ids) for ids in batch["completion_ids"]]
    shared = len(os.path.commonprefix([list(p) for p in prompts]))
    return {"episodes": len(rewards), "success": round(sum(r >= 1.0 for r in rewards) / len(rewards), 3),
            "mixed_groups": sum(len(set(g)) > 1 for g in groups), "groups": len(groups),
            "prompt_tokens_per_row": round(sum(map(len, prompts)) / len(prompts), 1),
            "prefix_shared_by_all_rows": shared,
            "completion_tokens": {"mean": round(sum(completions) / len(completions), 1), "min": min(completions),
                                  "max": max(completions)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:tiny", help="the policy (default builtin:tiny)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="the config whose GRPO step is played (default configs/smollm2_cpu.json)")
    parser.add_argument("--rollouts", choices=("teacher", "model"), default="teacher",
                        help="who plays the rollouts: the warm start's teacher (default) or the model")
    parser.add_argument("--mixed-groups", type=int, default=2, metavar="K",
                        help="teacher rollouts: groups played half by the oracle, half by --mistake (default 2; the "
                             "others all oracle or all guess)")
    parser.add_argument("--mistake", default="wrong_query", help="teacher rollouts: the failing teacher's mistake "
                        "(default wrong_query; see sqlenv.evaluation.policies.MISTAKES)")
    parser.add_argument("--warm-start", type=int, default=0, metavar="STEPS",
                        help="model rollouts: warm-start steps first (default 0: the model as loaded)")
    parser.add_argument("--init", default=None, metavar="DIR",
                        help="model rollouts: play them with this saved model (the loss runs on it too)")
    parser.add_argument("--repeats", type=int, default=None, metavar="N",
                        help="rounds of the three loss phases, interleaved; medians are reported (default 3 for the "
                             "tiny model, whose phases take seconds; 1 otherwise)")
    args = parser.parse_args(argv)
    from sqlenv.evaluation.policies import MISTAKES
    from training.config import BUILTIN_MODEL

    if args.repeats is None:
        args.repeats = 3 if args.model == BUILTIN_MODEL else 1
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    if args.warm_start < 0:
        parser.error("--warm-start must be >= 0")
    if args.mixed_groups < 0:
        parser.error("--mixed-groups must be >= 0")
    if args.mistake not in MISTAKES:
        parser.error(f"--mistake must be one of {sorted(MISTAKES)}")
    if args.rollouts == "teacher" and (args.warm_start or args.init):
        parser.error("--warm-start and --init choose the model that plays the rollouts: add --rollouts model")
    if args.init and args.warm_start:
        parser.error("--init and --warm-start both choose the rollouts' model: give one")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file")
    import warnings

    warnings.filterwarnings("ignore")
    import datasets
    import torch
    from transformers.utils import logging as hf_logging

    from training.models import load_model_and_tokenizer
    from training.device import resolve_cpu_threads

    hf_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    config = step_config(args)
    threads = resolve_cpu_threads(config)
    torch.set_num_threads(threads)
    model, tokenizer = load_model_and_tokenizer(args.init or config.model, device="cpu")
    out: dict = {"model": args.model, "config": str(Path(args.config).relative_to(REPO)
                                                       if Path(args.config).resolve().is_relative_to(REPO)
                                                       else args.config),
                 "threads": threads,
                 "step": {"episodes": config.per_device_train_batch_size * config.gradient_accumulation_steps,
                          "per_device_train_batch_size": config.per_device_train_batch_size,
                          "gradient_accumulation_steps": config.gradient_accumulation_steps,
                          "max_completion_length": config.resolved_max_completion_length(),
                          "max_turn_tokens": config.max_turn_tokens, "beta": config.beta}}
    rollouts_by = f"saved model {args.init}" if args.init else "zero-shot model"
    if args.rollouts == "teacher":
        rollouts_by = (f"teacher: {args.mixed_groups} of {config.generation_batch_size // config.num_generations} "
                       f"groups half oracle, half {args.mistake}; the others all oracle or all guess")
    if args.warm_start:
        log(f"warm start: {args.warm_start} steps ...")
        out["warm_start"] = warm_start(model, tokenizer, args, config)
        rollouts_by = f"model after a {args.warm_start}-step warm start"
        log(f"  {out['warm_start']}")
    out["rollouts_by"] = rollouts_by
    log(f"rollouts ({rollouts_by}) ...")
    recorder = record_rollouts(config, model, tokenizer, args)
    out["rollouts"] = {**rollout_summary(recorder.batch, config.num_generations),
                       "seconds": round(recorder.seconds, 1)}
    log(f"  {out['rollouts']}")

    trl_config = config.with_overrides({"lean_loss": False})
    rounds: dict = {"trl": [], "trim": [], "new": []}
    reference = None
    for round_ in range(args.repeats):  # interleaved, so that each sees the same machine
        trl, grads = loss_phase("trl", trl_config, model, tokenizer, recorder, reference=reference)
        reference = grads if reference is None else reference
        rounds["trl"].append(trl)
        log(f"trl loss:       {trl}")
        rounds["trim"].append(loss_phase("trim only", config, model, tokenizer, recorder, drop=False,
                                         reference=reference)[0])
        log(f"trim only:      {rounds['trim'][-1]}")
        rounds["new"].append(loss_phase("new", config, model, tokenizer, recorder, reference=reference)[0])
        log(f"new loss:       {rounds['new'][-1]}")
    trl, trim, new = (median_phase(rounds[k]) for k in ("trl", "trim", "new"))

    real = sum(map(len, recorder.batch["prompt_ids"])) + sum(map(len, recorder.batch["completion_ids"]))
    out.update({
        "repeats": args.repeats, "loss_type": trl["loss_type"], "trl_loss_s": trl["loss_s"], "new_loss_s": new["loss_s"], "trim_only_loss_s": trim["loss_s"],
        "ratio": round(new["loss_s"] / trl["loss_s"], 3), "trim_only_ratio": round(trim["loss_s"] / trl["loss_s"], 3),
        "trl_loss_cpu_s": trl["loss_cpu_s"], "new_loss_cpu_s": new["loss_cpu_s"],
        "trim_only_loss_cpu_s": trim["loss_cpu_s"],
        "cpu_ratio": round(new["loss_cpu_s"] / trl["loss_cpu_s"], 3),
        "max_rel_grad_diff": max(new["max_rel_grad_diff"], trim["max_rel_grad_diff"],
                                 trl.get("max_rel_grad_diff", 0.0)),
        "rows_dropped_frac": round(new["rows_dropped"] / new["rows"], 3),
        "tokens": {"trl_fed": new["tokens_padded"], "real": real, "trim_only_fed": trim["tokens_fed"],
                   "new_fed": new["tokens_fed"]},
        "padding_tokens_removed": new["tokens_padded"] - trim["tokens_fed"],
        "padding_frac_of_trl": round(1 - real / new["tokens_padded"], 3),
        "prompt_tokens_per_row": out["rollouts"]["prompt_tokens_per_row"],
    })
    log(f"loss phase: trl {out['trl_loss_s']} s, new {out['new_loss_s']} s (x{out['ratio']}; CPU x{out['cpu_ratio']}), "
        f"trim only {out['trim_only_loss_s']} s (x{out['trim_only_ratio']}); rows dropped "
        f"{out['rows_dropped_frac']:.0%}; padding removed {out['padding_tokens_removed']} of "
        f"{new['tokens_padded']} tokens fed by TRL; max relative gradient difference {out['max_rel_grad_diff']:.2e}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
