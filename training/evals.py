"""The run's evals of a model on the eval split: `play_model` plays a model's episodes (the zero-shot, base and
trained models alike, batched to fit the device: `eval_batch_size`), and `record_comparison` writes the final
comparison (random policy vs the trained model, and the base and zero-shot models when played) to
`comparison.jsonl`: one `pair` line per question, then one `summary` with each player's scores and breakdown (or,
when a play raises, one `{"kind": "error", "error"}` line before the run fails with it).

The phases that play them (`training.phases`: ZeroShotEval, BaseEval, Comparison) decide when; these say how.
"""

from __future__ import annotations

import time
from typing import Any

from training.run.recorder import RunRecorder, error_message

__all__ = ["play_model", "eval_batch_size", "EVAL_CONTEXT_TOKENS", "record_comparison", "base_label"]


def play_model(model: Any, tokenizer: Any, plan: Any, name: str, n: int | None = None):
    """The comparison's episodes for `model`: `n` (default `comparison_episodes`) eval questions, the run's seed."""
    from training.generation.model_policy import evaluate_model

    config = plan.config
    return evaluate_model(model, tokenizer, dataset=plan.dataset, split=config.eval_split,
                          n_episodes=config.comparison_episodes if n is None else n, seed=config.seed,
                          step_budget=config.step_budget, name=name, max_turn_tokens=config.max_turn_tokens,
                          enable_thinking=config.enable_thinking, batch_size=eval_batch_size(config, model),
                          prompt=config.prompt, precision=plan.precision)


#: Tokens of one eval episode's KV cache that a GPU eval makes room for (a prompt and a long episode).
EVAL_CONTEXT_TOKENS = 2048


def eval_batch_size(config: Any, model: Any = None) -> int:
    """Episodes played together in an eval.

    On a CPU: 32 for the tiny model (its steps cost Python, not arithmetic, so more rows are nearly free); 16 for real
    models, which on a CPU already decode near their best rate at 16 rows (SmolLM2: 97.8 tokens/s at 16, 105.5 at 32)
    and then hold half the KV cache. On a CUDA GPU, where a small model's decoding step costs kernel launches more
    than arithmetic (`bench/gpu/gpu_check.py` measures 16, 64 and 256 rows): as many rows as keep their KV caches
    (keys and values of every layer for `EVAL_CONTEXT_TOKENS` tokens, in the model's dtype) within a quarter of the
    GPU's memory, 16 to 256 — all of spider10's 203 eval questions at once for SmolLM2-135M, ~40 for Qwen3-0.6B.
    """
    params = next(model.parameters(), None) if model is not None else None
    if params is None or params.device.type != "cuda":
        return 32 if config.is_builtin_model else 16
    import torch

    text = model.config.get_text_config()
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_row = text.num_hidden_layers * heads * head_dim * 2 * params.element_size() * EVAL_CONTEXT_TOKENS
    memory = torch.cuda.get_device_properties(params.device).total_memory
    return max(16, min(256, memory // 4 // per_row))


def record_comparison(recorder: RunRecorder, model: Any, tokenizer: Any, plan: Any, n: int,
                      base_result: Any, zero_shot: Any = None, trained_weights: dict | None = None) -> None:
    """Random policy vs the trained model (and the base, and the pretrained model's zero-shot before its warm
    start) on the same eval questions with the same seeds. `trained_weights` (status.json's `keep_best`: the GRPO
    step whose weights the model holds, and why) goes into the summary as it is."""
    from sqlenv.evaluation.evaluate import evaluate
    from sqlenv.evaluation.policies import RandomPolicy

    config = plan.config
    try:
        env = plan.environment(config.eval_split)
        try:
            random_result = evaluate(env, RandomPolicy(seed=config.seed), n_episodes=n, seed=config.seed)
        finally:
            env.close()
        trained = play_model(model, tokenizer, plan, "trained", n)
    except Exception as exc:
        # Said on Compare (and the run fails with it): a crashed comparison is not a column of failed episodes.
        recorder.append("comparison", {"kind": "error", "error": error_message(exc), "time": time.time()})
        raise
    base_episodes = base_result.episodes[:n] if base_result is not None else None
    zero_episodes = zero_shot.episodes[:n] if zero_shot is not None else None
    for i in range(n):
        pair = {"kind": "pair", "index": i, "seed": config.seed + i, "split": config.eval_split,
                "question_id": trained.episodes[i].get("question_id"),
                "random": random_result.episodes[i], "trained": trained.episodes[i]}
        if base_episodes is not None and i < len(base_episodes):
            pair["base"] = base_episodes[i]
        if zero_episodes is not None and i < len(zero_episodes):
            pair["zero_shot"] = zero_episodes[i]
        recorder.append("comparison", pair)

    def scores(result: Any) -> dict[str, Any]:
        cells = result.breakdown()
        return {"success_rate": result.success_rate, "avg_reward": result.avg_reward,
                "avg_steps": result.avg_steps, "explore_rate": result.explore_rate,
                "n_episodes": result.n_episodes, "success_ci": cells["overall"]["success_ci"],
                "execution_accuracy": cells["overall"]["execution_accuracy"],
                "execution_ci": cells["overall"]["execution_ci"], "breakdown": cells}

    summary = {"kind": "summary", "split": config.eval_split, "n_episodes": n, "seed": config.seed,
               "random": scores(random_result), "trained": scores(trained),
               "base": scores(type(trained).from_episodes(base_episodes, policy="base")) if base_episodes else None,
               "base_label": base_label(config) if base_episodes else None,
               "zero_shot": scores(type(trained).from_episodes(zero_episodes, policy="zero-shot"))
               if zero_episodes else None,
               "trained_weights": trained_weights, "time": time.time()}
    recorder.append("comparison", summary)


def base_label(config: Any) -> str:
    if config.sft.enabled:
        return "SFT warm-start (before GRPO)"
    if config.is_builtin_model:
        return "random init (before GRPO)"
    return "pretrained, zero-shot (before any training)"
