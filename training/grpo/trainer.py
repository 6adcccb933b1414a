"""`SQLEnvGRPOTrainer`: TRL's `GRPOTrainer` whose loss phase spends its time on rows that teach.

TRL 1.16 buffers a generation batch (`per_device_train_batch_size x steps_per_generation` rows), cuts it into
micro-batches and runs the policy forward and backward on every row of each, every row padded to the generation
batch's longest prompt (left) and longest completion (right). Two kinds of work in that are provably wasted:

- **Rows that teach nothing.** A row whose advantage is exactly 0 (its group's rewards were all equal, or its reward
  equals its group's mean) multiplies every term of its policy loss by 0, and a row whose loss mask is empty (a
  truncated completion under `mask_truncated_completions`) multiplies every term by its mask: their gradient is
  exactly 0. Such rows leave the micro-batch before the forward; the loss of the rows kept is rescaled so that each
  `loss_type` keeps TRL's own normaliser: a mean over the micro-batch's rows (`grpo`, `sapo`, `luspo`) or rows x
  `max_completion_length` (`dr_grpo`) still divides by every row, a token mean over the micro-batch (`bnpo`) still
  counts the dropped rows' tokens, and the generation-batch token count of `dapo`, `cispo` and `vespo`
  (`num_items_in_batch`) is untouched. A micro-batch with no row left runs no forward at all.
- **Padding.** Each micro-batch is trimmed to its own longest completion and its own longest prompt. Padding is
  masked out of attention and of the loss, and the models here use rotary positions (relative), so the log-probs of
  the real tokens are the same up to float rounding.

Exactness decides what is dropped. A zero-advantage row is dropped only when nothing else in the loss reads it: no
KL term (`beta == 0`), no entropy bonus (`entropy_coef == 0`, not adaptive), no high-entropy token mask
(`top_entropy_quantile == 1`, whose quantile spans the micro-batch), no MoE router loss. An empty-mask row is dropped
also under a KL term or the entropy mask (both are masked per token). Importance sampling, off-policy masks, clipping
and sequence-level ratios are per row, so they allow both. Anything this trainer does not know how to slice
(multimodal inputs, an unknown `loss_type`, `return_outputs`) goes through TRL's loss unchanged.

Logged metrics: TRL's `entropy` and `clip_ratio/*` are computed inside its loss, so here they are over the rows the
loss kept (the rows that moved the policy); a micro-batch with no row left logs none, and TRL's mean over the logging
window averages the micro-batches that ran. `loss_phase/rows_dropped_frac` and `loss_phase/tokens_fed_frac` (tokens
fed to the model / tokens TRL would feed) say what was saved. `lean_loss=False` is TRL's loss as it is.

TRL's public extension point used: `compute_loss` (it calls `GRPOTrainer.compute_loss` on the kept rows). The
sampler and the dataloader are not touched, so a subclass can override them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from accelerate.utils import DistributedType
from trl import GRPOTrainer
from training.grpo.sampler import QuestionSampling

__all__ = ["SQLEnvGRPOTrainer", "LossPhaseStats", "ROW_MEAN_LOSSES", "TOKEN_MEAN_LOSSES", "GLOBAL_TOKEN_LOSSES"]

#: Loss types whose normaliser counts the micro-batch's rows (a mean over rows; `dr_grpo`: rows x max length).
ROW_MEAN_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
#: Loss types normalised by the micro-batch's loss-mask token count.
TOKEN_MEAN_LOSSES = ("bnpo",)
#: Loss types normalised by the generation batch's token count (`num_items_in_batch`), which dropping leaves as is.
GLOBAL_TOKEN_LOSSES = ("dapo", "cispo", "vespo")

# Keys of TRL's micro-batch, by how they are sliced: per row, and per completion column / per prompt column.
_COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                    "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio", "advantages")
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")
_WHOLE_BATCH_KEYS = ("num_items_in_batch",)


@dataclasses.dataclass
class LossPhaseStats:
    """What the loss phase fed the model, counted since the trainer was built (or the last `reset`).

    `tokens_padded` is rows x (prompt + completion) columns as TRL feeds them; `tokens_fed` what this trainer fed;
    `prompt_tokens` the real (unpadded) prompt tokens of every row seen.
    """

    micro_batches: int = 0
    micro_batches_skipped: int = 0
    rows: int = 0
    rows_dropped: int = 0
    tokens_padded: int = 0
    tokens_fed: int = 0
    prompt_tokens: int = 0

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)

    def add(self, other: "LossPhaseStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def rows_dropped_frac(self) -> float:
        return self.rows_dropped / self.rows if self.rows else 0.0

    @property
    def tokens_fed_frac(self) -> float:
        return self.tokens_fed / self.tokens_padded if self.tokens_padded else 1.0


class SQLEnvGRPOTrainer(QuestionSampling, GRPOTrainer):
    """`GRPOTrainer` whose loss skips rows that teach nothing and trims padding, with TRL's gradient (see the module
    docstring), and whose questions come from `question_sampler` (`training.grpo.sampler.QuestionSampling`: TRL's
    uniform pass, or questions whose groups are likely to have mixed success; the mixed-success share is logged).

    Args:
        lean_loss: drop the rows whose gradient is exactly 0 and trim each micro-batch to its own longest row
            (default True). False computes TRL's loss unchanged (the same gradient, more time).
        negative_advantage_weight: multiply every negative advantage by this before the loss (default 1.0: TRL's
            GRPO). Below 1 a worse-than-average episode pushes its tokens down less than a better one pushes its
            tokens up; 0 trains on the better-than-average episodes alone (RAFT-like: their rows with a negative
            advantage then have none, and the lean loss leaves them out).
        kl_probe: a `training.grpo.kl_probe.KLProbe`, sampled when training starts and measured at the training
            logs it is due at (`health/kl_start`); None = none.
        question_sampler, question_groups, sampler_settings: as `QuestionSampling`.
        args, kwargs: as `trl.GRPOTrainer`.

    The batched rollout logs the sampled completions' mean token entropy (`health/sampled_entropy`); on TRL's tool
    loop the run's metrics take TRL's `entropy` (the completions in the loss) for it (`training.callbacks`).
    """

    def __init__(self, *args: Any, lean_loss: bool = True, negative_advantage_weight: float = 1.0,
                 kl_probe: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lean_loss = lean_loss
        self.negative_advantage_weight = float(negative_advantage_weight)
        self.kl_probe = kl_probe
        self.loss_phase = LossPhaseStats()  # cumulative; read by benches
        self._window = LossPhaseStats()  # since the last log line

    # ------------------------------------------------------------------ which rows may leave the loss
    def _extra_loss_terms(self) -> bool:
        """Terms of TRL's loss that are not the masked per-token loss: they read every row."""
        return self.aux_loss_enabled or self.args.entropy_coef != 0.0 or self.args.use_adaptive_entropy

    def droppable_rows(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """A bool per row of a micro-batch: True where the row's contribution to the loss and its gradient is
        exactly 0 under this trainer's settings. None when the micro-batch must go through TRL's loss unchanged."""
        known = set(_COMPLETION_KEYS) | set(_PROMPT_KEYS) | set(_WHOLE_BATCH_KEYS)
        if any(key not in known for key in inputs) or self.loss_type not in (
                ROW_MEAN_LOSSES + TOKEN_MEAN_LOSSES + GLOBAL_TOKEN_LOSSES):
            return None  # multimodal fields, a subclass's own keys, a loss type added after TRL 1.16
        mask = _loss_mask(inputs)
        rows = mask.size(0)
        if self._extra_loss_terms():
            return torch.zeros(rows, dtype=torch.bool, device=mask.device)
        drop = mask.sum(-1) == 0  # an empty row: every term of its loss, the KL term too, is multiplied by 0
        if self.beta == 0.0 and self.top_entropy_quantile >= 1.0:
            drop |= (inputs["advantages"].reshape(rows, -1) == 0).all(-1)
        return drop

    # ------------------------------------------------------------------ the loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.negative_advantage_weight != 1.0 and "advantages" in inputs:
            advantages = inputs["advantages"]
            inputs = {**inputs, "advantages": torch.where(advantages < 0, advantages * self.negative_advantage_weight,
                                                          advantages)}
        drop = None if (return_outputs or not self.lean_loss) else self.droppable_rows(inputs)
        if drop is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        rows = drop.numel()
        keep, scale = ~drop, 1.0
        dropped = int(drop.sum())
        if dropped == rows:
            if self.accelerator.distributed_type == DistributedType.NO:
                self._count(inputs, dropped, None)
                # Nothing to compute; the Trainer still calls backward on what we return, and this leaf reaches no
                # parameter, so the accumulated gradients stay exactly as they are.
                return torch.zeros((), device=self.accelerator.device, requires_grad=True)
            # Several processes (or DeepSpeed): every rank must run the same forward, backward and metric
            # collectives, so this rank runs its shortest row and multiplies its loss by 0.
            keep = torch.zeros_like(keep)
            keep[_loss_mask(inputs).sum(-1).argmin()] = True
            scale = 0.0
        lean = _slice_rows(inputs, keep, self.pad_to_multiple_of)
        self._count(inputs, dropped, lean)
        loss = super().compute_loss(model, lean, num_items_in_batch=num_items_in_batch)
        if self.loss_type in ROW_MEAN_LOSSES:
            scale *= int(keep.sum()) / rows  # TRL divided by the kept rows; its normaliser is every row
        elif self.loss_type in TOKEN_MEAN_LOSSES:
            # TRL divided by the kept rows' loss tokens (at least 1); its normaliser counts every row's, the dropped
            # ones' included (a zero-advantage row has loss tokens).
            scale = scale * _loss_mask(lean).sum().clamp(min=1.0) / _loss_mask(inputs).sum().clamp(min=1.0)
        return loss if isinstance(scale, float) and scale == 1.0 else loss * scale

    def _count(self, inputs: dict[str, Any], dropped: int, lean: dict[str, Any] | None) -> None:
        if not self.model.training:
            return
        prompt_mask, rows = inputs["prompt_mask"], inputs["prompt_mask"].size(0)
        step = LossPhaseStats(
            micro_batches=1, micro_batches_skipped=int(lean is None), rows=rows, rows_dropped=dropped,
            tokens_padded=rows * (prompt_mask.size(1) + inputs["completion_ids"].size(1)),
            tokens_fed=0 if lean is None else lean["prompt_ids"].numel() + lean["completion_ids"].numel(),
            prompt_tokens=int(prompt_mask.sum()),
        )
        self.loss_phase.add(step)
        self._window.add(step)

    def train(self, *args: Any, **kwargs: Any):
        if self.kl_probe is not None:
            self.kl_probe.start(self.accelerator.unwrap_model(self.model))
        return super().train(*args, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and "loss" in logs:
            if self._window.rows:
                logs["loss_phase/rows_dropped_frac"] = self._window.rows_dropped_frac
                logs["loss_phase/tokens_fed_frac"] = self._window.tokens_fed_frac
                self._window.reset()
            if self.kl_probe is not None and self.kl_probe.due(self.state.global_step, self.state.max_steps):
                kl = self.kl_probe.kl(self.accelerator.unwrap_model(self.model))
                if kl is not None:
                    logs["health/kl_start"] = kl
        super().log(logs, start_time)


def _loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The per-token loss mask TRL's loss uses: completion tokens, less tool results."""
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]


def _round_up(length: int, multiple: int | None, limit: int) -> int:
    if multiple:
        length = math.ceil(length / multiple) * multiple
    return min(max(length, 1), limit)


def _slice_rows(inputs: dict[str, Any], keep: torch.Tensor, pad_to_multiple_of: int | None) -> dict[str, Any]:
    """The micro-batch's kept rows, trimmed to their longest prompt (left padding) and longest completion (right
    padding), rounded up to `pad_to_multiple_of` as TRL pads."""
    index = keep.nonzero().squeeze(-1)
    prompt_mask = inputs["prompt_mask"].index_select(0, index)
    completion_mask = inputs["completion_mask"].index_select(0, index)
    prompt_len, completion_len = prompt_mask.size(1), completion_mask.size(1)
    real = prompt_mask.any(0).nonzero()
    keep_prompt = _round_up(prompt_len - int(real[0]) if len(real) else 1, pad_to_multiple_of, prompt_len)
    real = completion_mask.any(0).nonzero()
    keep_completion = _round_up(int(real[-1]) + 1 if len(real) else 1, pad_to_multiple_of, completion_len)
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if key in _WHOLE_BATCH_KEYS or value is None:
            out[key] = value
            continue
        value = value.index_select(0, index)
        if key in _PROMPT_KEYS:
            value = value[:, prompt_len - keep_prompt:]
        elif value.dim() >= 2 and value.size(1) == completion_len:
            value = value[:, :keep_completion]
        out[key] = value
    return out
