"""The batched rollout path of GRPOTrainer: `BatchedRollout`, TRL's `rollout_func` for SQLEnv.

`config.rollout="rollout_func"` trains through it instead of TRL's `environment_factory` tool loop: every episode of a
generation batch is played at once (`training.generation.episodes.play_batched`: one batched generation per turn for all live
episodes), several times faster than TRL's loop on small models. It returns what GRPOTrainer trains on —
`prompt_ids`, `completion_ids`, `logprobs` (None: TRL recomputes them), `env_mask` (1 on model tokens, 0 on tool
results; all 0 for an episode cut by `max_completion_length` when `mask_truncated_completions` is on) — plus the
per-completion fields the reward functions read (`correctness`, `progress`, `operational`) and the tool counts
`reward_operational` logs through TRL's `log_metric` (TRL logs them itself on the other path).

    rollout = BatchedRollout(plan.episodes("train"), max_turn_tokens=64)
    trainer = GRPOTrainer(..., train_dataset=rollout_rows(plan.episodes("train")), rollout_func=rollout)

Each prompt names its question (`QUESTION_ID_KEY` on its user turn, written by `rollout_rows`): the question id travels
with the dataset row, as the `question_id` column does to `SQLEnvTRL.reset(**row)` on the other path. The instance
holds what the path needs — its episode source, a pool of environments, the renderer — so nothing lives in module
globals and two trainers never share state.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlenv.types import SQLAction, SQLObservation
from training.generation.chat import ChatRenderer
from training.generation.episodes import Episode, play_batched
from sqlenv.agent.prompts import initial_messages

__all__ = ["BatchedRollout", "QUESTION_ID_KEY", "prompt_question_id", "rollout_rows"]

#: The key of a rollout prompt's user turn that names its question. TRL hands `rollout_func` only the prompts (not the
#: rest of the dataset row), so the question id rides on the prompt itself: `rollout_rows` writes it, the rollout reads
#: it and drops it before rendering. Reading the question back from the prompt text would be ambiguous (two databases
#: may share a question text, even a table list).
QUESTION_ID_KEY = "question_id"


def prompt_question_id(prompt: list) -> str | None:
    """The question id a rollout prompt carries (on its last user turn), None when it carries none."""
    for message in reversed(prompt):
        if message.get("role") == "user":
            return message.get(QUESTION_ID_KEY)
    return None


class BatchedRollout:
    """GRPOTrainer's `rollout_func` over one episode source: `rollout(prompts, trainer) -> dict of lists`.

    Args:
        source: the `training.environment.source.EpisodeSource` the prompts were made from (`rollout_rows(source)`).
        max_turn_tokens: most tokens one assistant turn may generate (default 256); the episode's whole budget is
            the trainer's `max_completion_length`.
        renderer: the `ChatRenderer` to play with; default: built from the trainer on the first call (same template,
            template kwargs and end-of-turn ids as GRPOTrainer).
        keep_cache: each episode keeps its KV cache from turn to turn (default True; see `play_batched`); False
            re-reads every conversation each turn (the older decoder, for comparison). The kept-cache decoder
            (`kept_cache_decoder`: on a GPU the graph decoder) lives as long as the rollout, so the graphs it captures
            and its slots serve every step; under the trainer's bf16 (fp16) autocast it decodes as that autocast
            computes (bf16 linear layers and attention over the fp32 weights, the LM head in fp32 with TRL's
            `cast_lm_head_to_fp32`), so the episodes are sampled from the distribution the loss scores.
        prompt: the prompt the dataset's rows start with (`rollout_rows(source, prompt)`;
            `sqlenv.agent.prompts.PROMPTS`, default `"full"`): the default renderer renders the tool schemas for it or
    not. """

    def __init__(self, source: Any, *, max_turn_tokens: int = 256, renderer: ChatRenderer | None = None,
                 keep_cache: bool = True, prompt: str = "full"):
        self.source = source
        self.max_turn_tokens = max_turn_tokens
        self.prompt = prompt
        self.renderer = renderer
        self.keep_cache = keep_cache
        self._pool: list[Any] = []
        self._lock = threading.Lock()
        self._decoder: Any = None

    def environments(self, n: int) -> list[Any]:
        """The first `n` environments of the pool (one `SQLEnvTRL` per episode of a batch), created as needed."""
        from training.environment.trl_env import SQLEnvTRL

        with self._lock:
            while len(self._pool) < n:
                self._pool.append(SQLEnvTRL(self.source))
            return self._pool[:n]

    def decoder(self, model: Any, trainer: Any) -> Any:
        """The kept-cache decoder of `model` (made on the first call, again if the trainer's model changes), decoding
        at the trainer's precision; None when the model's cache cannot be kept."""
        if self._decoder is None or self._decoder.model is not model:
            import torch

            from training.generation.decoders import kept_cache_decoder

            tokenizer = self.renderer.tokenizer
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            args = trainer.args
            compute = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
            self._decoder = kept_cache_decoder(model, pad, set(self.renderer.eos_token_ids), compute_dtype=compute,
                                               lm_head_fp32=bool(getattr(args, "cast_lm_head_to_fp32", False)))
        return self._decoder

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """Play one episode per prompt, batched, and return the training record (see the module docstring).

        Each prompt is `[system, user]` where the user turn is the episode's first observation and names its question
        (`rollout_rows`).
        """
        from trl.models import unwrap_model_for_generation

        if self.renderer is None:
            self.renderer = ChatRenderer.from_trainer(trainer, prompt=self.prompt)
        renderer = self.renderer
        question_ids = [prompt_question_id(prompt) for prompt in prompts]
        if None in question_ids:
            raise ValueError(f"rollout_func: a prompt names no question (no {QUESTION_ID_KEY!r} on its user turn); "
                             "build the train dataset with training.grpo.rollout.rollout_rows(source)")
        envs = self.environments(len(prompts))
        episodes = []
        for prompt, question_id, env in zip(prompts, question_ids, envs):
            env.reset(question_id=question_id)
            # The messages as the model sees them: the id is the dataset's, not the conversation's.
            messages = [{k: v for k, v in m.items() if k != QUESTION_ID_KEY} for m in prompt]

            def step(action: SQLAction, env: Any = env) -> tuple[str, SQLObservation, bool]:
                text = env._act(action.action_type, action.argument)
                return text, env.observation, env.done

            episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                    observation=env.observation))
        max_turns = trainer.max_tool_calling_iterations if trainer.max_tool_calling_iterations < 10**6 else 64
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            play_batched(model, renderer, episodes, max_turn_tokens=self.max_turn_tokens,
                         max_completion_tokens=trainer.max_completion_length, max_turns=max_turns,
                         generation_config=trainer.generation_config, keep_cache=self.keep_cache,
                         decoder=self.decoder(model, trainer) if self.keep_cache else None)
        logprobs = [logp for e in episodes for logp in e.sampled_logprobs]
        # The mean surprisal of the sampled tokens: a Monte Carlo estimate of the sampling distribution's mean token
        # entropy (each token was drawn from the distribution whose log-probability it records).
        entropy = -sum(logprobs) / len(logprobs) if logprobs else None
        breakdowns = [env.breakdown for env in envs]
        # An episode cut by max_completion_length has no outcome to learn from: with TRL's mask_truncated_completions
        # it leaves the loss. TRL spots a cut row by its last token (not an end of turn), which misses an episode cut
        # because its next tool result would not fit (its last turn ended properly); its empty mask leaves it out alike.
        mask_truncated = trainer.args.mask_truncated_completions
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None,
            "env_mask": [[0] * len(e.env_mask) if mask_truncated and e.truncated else e.env_mask for e in episodes],
            "correctness": [b.correctness for b in breakdowns],
            "progress": [b.progress for b in breakdowns],
            "operational": [b.operational for b in breakdowns],
            # Tool health, logged by `reward_operational` through TRL's `log_metric` (TRL cannot see these calls).
            "tool_calls": [len(e.actions) for e in episodes],
            "tool_failures": [sum(1 for m in e.messages if m.get("role") == "tool"
                                  and str(m.get("content", "")).startswith("Error:")) for e in episodes],
            # The sampled completions' mean token entropy (estimated from the decoder's own log-probabilities),
            # logged by `reward_operational` as `health/sampled_entropy`; None when the turns were decoded by
            # `generate`.
            "sampled_entropy": [entropy] * len(episodes),
        }


def rollout_rows(source: Any, prompt: str = "full"):
    """The GRPO dataset of the batched path: `[system, user(first observation)]` prompts, one per question, the user
    turn naming its question (`QUESTION_ID_KEY`), plus the `question_id` column.

    Args:
        source: a `training.environment.source.EpisodeSource` (its questions, databases and step budget).
        prompt: the system prompt's name (`sqlenv.agent.prompts.PROMPTS`, default `"full"`; `TrainConfig.prompt`).
    """
    from datasets import Dataset

    env = source.environment()
    try:
        prompts, ids = [], []
        for q in source.questions:
            system, user = initial_messages(env.reset(question_id=q.question_id), prompt)
            prompts.append([system, {**user, QUESTION_ID_KEY: q.question_id}])
            ids.append(q.question_id)
    finally:
        env.close()
    return Dataset.from_dict({"prompt": prompts, "question_id": ids})
