"""`DecodeState`: the per-slot tensors `GraphDecoder`'s decoding step reads and writes, and how a step chooses each
row's next token from its logits (`choose`).

Every tensor keeps its address from the state's making to its end, so a step captured as a CUDA graph reads and
writes them at every replay. A slot's row is active while it decodes this turn; a row that is not (it has ended, or
it pads a fixed-size batch) writes its token to the scratch column and keeps its state.

Sampling is the draw `argmax(p / q)` with p = softmax(logits / T) and q ~ Exp(1): the algorithm `torch.multinomial`
uses for one sample (its `.item()` check left out). The noise q is drawn by `draw`, eagerly on the default
generator, before the step that reads it: a graph replays no random numbers (`step_graphs`), and a seed draws the
same numbers as `torch.empty_like(p).exponential_(1)` in the step would.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DecodeState"]


class DecodeState:
    """The per-slot tensors of `slots` slots (device tensors of fixed address):

    `pos`: tokens held in the slot (where the next one goes); `token`: the next token to feed; `active`: still
    decoding this turn; `count`: tokens generated this turn; `budget`: most tokens this turn; `out` / `logp`: the
    tokens generated and their log-probabilities, `columns` + 1 columns each (the last one is scratch); `temperature`:
    the turn's; `eos`: the tokens that end a turn; `noise`: the Exp(1) noise of each slot's next draw
    (`[slots, vocab]`, made by `make_noise` on the first sampled turn)."""

    def __init__(self, slots: int, columns: int, device: Any, eos: list[int]):
        import torch

        self.slots, self.columns = slots, columns
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self.token = torch.zeros(slots, dtype=torch.long, device=device)
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)
        self.count = torch.zeros(slots, dtype=torch.long, device=device)
        self.budget = torch.zeros(slots, dtype=torch.long, device=device)
        self.out = torch.zeros(slots, columns + 1, dtype=torch.long, device=device)
        self.logp = torch.zeros(slots, columns + 1, dtype=torch.float32, device=device)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.eos = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=device)
        self.noise: Any = None

    def per_slot(self) -> tuple:
        """The tensors that follow a row when it moves to another slot."""
        return self.pos, self.token, self.active, self.count, self.budget, self.out, self.logp

    def make_noise(self, vocab: int) -> None:
        """The noise buffer, made once (greedy decoding needs none: 50 MB at 256 slots of SmolLM2's vocabulary)."""
        import torch

        if self.noise is None:
            self.noise = torch.ones(self.slots, vocab, dtype=torch.float32, device=self.pos.device)

    def draw(self, rows: slice) -> None:
        """The Exp(1) noise of the next draw of `rows`, eagerly on the default generator: call it before each sampled
        `choose`, outside any graph."""
        self.noise[rows].exponential_(1)

    def choose(self, logits: Any, rows: slice, sample: bool) -> None:
        """The next token of each active row of `rows` (greedy, or drawn from softmax(logits / T) with the noise
        `draw` drew), written to its output column with its log-probability; rows that draw an end-of-turn token or
        reach their budget end. Reads nothing back to the host (a graph can capture it)."""
        import torch

        scores = logits.float()
        if sample:
            scores = scores / self.temperature
            probs = torch.softmax(scores, dim=-1)
            token = (probs / self.noise[rows]).argmax(dim=-1)
        else:
            token = scores.argmax(dim=-1)
        active = self.active[rows]
        count = self.count[rows]
        column = torch.where(active, count, self.columns)[:, None]
        self.out[rows].scatter_(1, column, token[:, None])
        if sample:
            drawn = torch.log_softmax(scores, dim=-1).gather(1, token[:, None])
            self.logp[rows].scatter_(1, column, drawn)
        count += active.long()
        ended = (token[:, None] == self.eos[None, :]).any(dim=-1) | (count >= self.budget[rows])
        self.token[rows] = torch.where(active, token, self.token[rows])
        active &= ~ended
