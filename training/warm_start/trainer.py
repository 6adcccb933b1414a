"""`WarmStartTrainer`: TRL's `SFTTrainer` with a cheaper loss for small models on CPU.

TRL 1.16 computes the SFT loss with a fused, chunked LM head (`trl.kernels.chunked_logprob`): it never builds the
`[tokens, vocab]` logits, which saves a lot of GPU memory on big vocabularies, and on a GPU its Triton kernels are
fast. On a CPU it falls back to plain torch ops over every position of the batch, prompt tokens included, and
recomputes the head in the backward pass: profiled on `builtin:tiny` (batch 4), that loss was about half of each
step (`bench/learning/step_profile.py`).

On CPU this trainer runs the backbone as usual and the LM head only at the positions whose next token is trained
(the assistant turns, about a third of an episode), then takes the same token-mean cross-entropy TRL takes. The
loss, its gradient and the logged `mean_token_accuracy` are those of `SFTTrainer`'s `nll` loss; anything else
(GPU, several processes, DFT loss, label smoothing, `return_outputs`) goes through `SFTTrainer` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trl import SFTTrainer

__all__ = ["WarmStartTrainer"]

IGNORE_INDEX = -100


class WarmStartTrainer(SFTTrainer):
    """`SFTTrainer` whose CPU loss runs the LM head only where the loss is taken (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._token_counts = [0, 0]  # correct, total: label tokens since the last log

    def _gathered_head(self, model: Any, return_outputs: bool) -> bool:
        args = self.args
        return (
            not return_outputs
            and self.accelerator.num_processes == 1
            and next(model.parameters()).device.type == "cpu"
            and args.loss_type == "nll"
            and self.label_smoother is None
            and self.compute_loss_func is None
            and not self.aux_loss_enabled
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "labels" not in inputs or not self._gathered_head(model, return_outputs):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        backbone_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "completion_mask")}
        backbone_inputs["use_cache"] = False
        hidden = model.get_decoder()(**backbone_inputs).last_hidden_state
        labels = inputs["labels"][:, 1:]
        trained = labels != IGNORE_INDEX
        targets = labels[trained]
        logits = model.get_output_embeddings()(hidden[:, :-1][trained]).float()
        n_tokens = num_items_in_batch if num_items_in_batch is not None else targets.numel()
        loss = F.cross_entropy(logits, targets, reduction="sum") / torch.as_tensor(n_tokens).clamp(min=1)
        if self.model.training:
            with torch.no_grad():
                self._token_counts[0] += int((logits.argmax(-1) == targets).sum())
                self._token_counts[1] += int(targets.numel())
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        correct, total = self._token_counts
        if total and "loss" in logs:
            logs["mean_token_accuracy"] = correct / total
            self._token_counts = [0, 0]
        super().log(logs, start_time)
