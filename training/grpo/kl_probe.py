"""`KLProbe`: how far the policy has moved from where GRPO started, measured on a fixed batch every N logged steps.

At GRPO's start the probe samples a few train episodes from the starting policy (at the run's temperature, the
distribution GRPO samples from) and keeps their token ids and the starting policy's log-probability of every model
token. Every `every` steps (and at the last) one forward pass without gradients gives the current policy's
log-probabilities of the same tokens, and the KL from the start is estimated per model token with Schulman's k3
estimator, `r - 1 - log r` with `r = p_now / p_start`, which for tokens drawn from the starting policy is unbiased
for KL(start || now), never negative, and of low variance. It is `health/kl_start` in metrics.jsonl.

Why it matters (issue 45): from SmolLM2's warm start, a GRPO step at lr 3e-5 moved the policy 0.0105 nats/token on
unrelated episodes and redrew the warm start within ten steps; at lr 3e-6 it moved 0.000124 and refined it. The KL
from the start is the drift itself, where sampled success over 16 episodes is mostly noise.

The probe is written to `<checkpoints>/kl_probe.json` when the run saves checkpoints, so a resumed run measures from
the same start.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["KLProbe", "k3_kl"]

logger = logging.getLogger(__name__)


def k3_kl(logp_now: Any, logp_start: Any) -> Any:
    """Per-token k3 estimate of KL(start || now) for tokens sampled from the start: `r - 1 - log r`, r = p_now/p_start."""
    import torch

    log_ratio = (logp_now - logp_start).clamp(-20.0, 20.0)
    return torch.expm1(log_ratio) - log_ratio


class KLProbe:
    """Samples `episodes` episodes from the starting policy (`start`), then measures the KL from it (`kl`).

    Args:
        plan: the run's `RunPlan` (the train split's source, which holds out the validation panel; the prompt; the
            turn cap; the seed).
        tokenizer: the model's tokenizer.
        episodes: episodes in the probe (`TrainConfig.kl_probe_episodes`); 0 = no probe (`kl` returns None).
        temperature: the rollouts' sampling temperature: the probe's tokens and log-probabilities are under it.
        every: measure every N steps and at the last (`TrainConfig.kl_probe_every`; `due`).
        file: where the probe is kept for a resumed run (None: not kept).
    """

    def __init__(self, plan: Any, tokenizer: Any, episodes: int, temperature: float, every: int = 1,
                 file: str | Path | None = None):
        self.plan = plan
        self.tokenizer = tokenizer
        self.episodes = int(episodes)
        self.temperature = float(temperature)
        self.every = max(1, int(every))
        self.file = Path(file) if file is not None else None
        self.rows: list[dict[str, list]] | None = None  # {"ids", "model_positions", "logp_start"} per episode

    # ------------------------------------------------------------------------------------------------ start
    def start(self, model: Any) -> None:
        """Sample the probe from `model` as it is now (GRPO's start), or read it back (a resumed run)."""
        if self.episodes <= 0 or self.rows is not None:
            return
        if self.file is not None and self.file.is_file():
            try:
                self.rows = json.loads(self.file.read_text(encoding="utf-8"))["rows"]
                return
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("KL probe %s not read back (%s): sampling a new one", self.file, exc)
        import torch

        from training.generation.model_policy import play_model_episodes

        config = self.plan.config
        source = self.plan.episodes(config.train_split)
        envs = [source.environment() for _ in range(self.episodes)]
        try:
            # Seeds apart from GRPO's own draws (which come from its sampler): the probe is "unrelated" episodes.
            observations = [env.reset(seed=config.seed + 7919 + i) for i, env in enumerate(envs)]
            with torch.random.fork_rng(devices=[] if _device(model).type != "cuda" else None):
                torch.manual_seed(config.seed + 7919)
                played = play_model_episodes(model, self.tokenizer, envs, observations,
                                             max_turn_tokens=config.max_turn_tokens, temperature=self.temperature,
                                             enable_thinking=config.enable_thinking, prompt=config.prompt)
        finally:
            for env in envs:
                env.close()
        rows = []
        for episode in played:
            ids = list(episode.prompt_ids) + list(episode.completion_ids)
            # Position t's logits predict token t + 1: the model tokens of the completion, read from the position before.
            positions = [len(episode.prompt_ids) + i - 1 for i, m in enumerate(episode.env_mask) if m]
            if positions:
                rows.append({"ids": ids, "model_positions": positions})
        logps = self._logps(model, rows)
        for row, logp in zip(rows, logps):
            row["logp_start"] = logp.tolist()
        self.rows = rows
        if self.file is not None:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"rows": rows}), encoding="utf-8")
            os.replace(tmp, self.file)

    # ------------------------------------------------------------------------------------------------- kl
    def due(self, step: int, last_step: int) -> bool:
        """Whether step `step` of `last_step` reads the KL: every `every` steps, and the last (a run's end state)."""
        return step % self.every == 0 or step >= last_step

    def kl(self, model: Any) -> float | None:
        """Mean k3 KL(start || now) per model token of the probe (nats), or None without a probe."""
        if not self.rows:
            return None
        import torch

        total, count = 0.0, 0
        for row, logp in zip(self.rows, self._logps(model, self.rows)):
            start = torch.tensor(row["logp_start"], dtype=logp.dtype)
            total += float(k3_kl(logp, start).sum())
            count += len(row["logp_start"])
        return total / count if count else None

    def _logps(self, model: Any, rows: list[dict]) -> list[Any]:
        """Each row's model tokens' log-probabilities under `model` at the probe's temperature (one row a forward:
        a row's logits over the whole vocabulary are the memory here, ~0.1 GB for 600 tokens of SmolLM2)."""
        import torch

        device = _device(model)
        was_training = getattr(model, "training", False)
        model.eval()
        out = []
        try:
            with torch.no_grad():
                for row in rows:
                    ids = torch.tensor([row["ids"]], device=device)
                    positions = torch.tensor(row["model_positions"], device=device)
                    logits = model(input_ids=ids).logits[0].index_select(0, positions).float() / self.temperature
                    targets = ids[0].index_select(0, positions + 1)
                    logp = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
                    out.append(logp.cpu())
        finally:
            if was_training:
                model.train()
        return out


def _device(model: Any) -> Any:
    return next(model.parameters()).device
