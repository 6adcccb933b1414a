"""The signs that GRPO is collapsing (unlearning what the warm start knew), read from a run's records: the one place
the rules live. The Train tab's status bar says them in words; the sweep can count them.

Pure Python (no torch): `collapse_signs(metrics, evals)` takes what `training.run.directory.RunDir.read("metrics")` and
`read("evals")` return and never raises on odd records (a missing, None or non-numeric value is skipped).

Four rules, each a `Sign` with its words:

- `validation_drop`: validation success below its start by more than its noise. The panel is played greedily at
  step 0 and every `eval_every` steps (`{"split": "validation", "question_ids": [...], "correct": [...]}`), so the
  same questions are compared: the questions lost (right at the start, wrong now) against those gained. Under "no
  change" each flipped question is as likely lost as gained, so the count lost is Binomial(flips, 1/2): the rule
  fires when more were lost than gained and the one-sided sign test's p-value is below `SIGN_TEST_P` (0.05). Eval
  lines without per-question outcomes fall back to a binomial interval: the rule fires when the start's success lies
  above the newest eval's whole 95% Wilson interval.
- `entropy_runaway`: the sampled completions' mean token entropy (`health/sampled_entropy`) rising well above where
  GRPO started, while the reward does not rise: a policy that sharpens on what it learned lowers its entropy; one
  whose update is too large for its signal flattens, and entropy rising while the reward falls is the classic sign of
  a learning rate too high. The start is GRPO's first step (its episodes are the starting policy's own samples: a
  collapse within one update already marks the second). Fires when **each** of the last `ENTROPY_WINDOW` (3) steps
  is above the start by a factor of `ENTROPY_RATIO` (1.5) and by at least `ENTROPY_MIN_RISE` (0.1 nats/token), and
  the median reward of those steps is not above the start's (when rewards are logged). A step's entropy is noisy: on
  the default run (issue 50) it wandered 0.02-0.19 while the model learned 0% -> 72%, and two high steps in three
  (0.19 and 0.18 against 0.07) made the median rule this one replaced fire at step 24 and clear a step later.
- `policy_drift`: the KL from GRPO's start (`health/kl_start`, measured on the fixed probe episodes, so one reading
  is no sampling noise) above `KL_LIMIT` (0.5 nats/token). Every healthy run recorded stayed below 0.05 (the default
  run 0.006 at step 40 and 0.036 at seed 1, SmolLM2's CPU recipe 0.004 at step 20, the sweep's lr 1e-5 try 0.043
  at step 10); the destructive run (lr 0.05) read 5.0 after its first update. docs/EXPERIMENTS.md section 18 holds
  the table.
- `grad_norm_spike`: a step's grad norm over `SPIKE_RATIO` (5) times the median of up to `SPIKE_HISTORY` (20) steps
  before it (at least `SPIKE_MIN_HISTORY`, 5): GRPO's grad norm moves by about 2x from batch to batch with the
  share of groups that carry an advantage; a jump far beyond that comes before a collapse (RAGEN's "echo trap": the
  reward std falls, the grad norm spikes).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from sqlenv.evaluation.breakdown import wilson_interval

__all__ = ["Sign", "collapse_signs", "validation_drop", "entropy_runaway", "policy_drift", "grad_norm_spike",
           "paired_flips", "sign_test_p", "VALIDATION_SPLIT", "SIGN_TEST_P", "ENTROPY_WINDOW", "ENTROPY_RATIO",
           "ENTROPY_MIN_RISE", "KL_LIMIT", "SPIKE_RATIO", "SPIKE_HISTORY", "SPIKE_MIN_HISTORY", "ENTROPY_KEY", "KL_KEY",
           "REWARD_KEY"]

#: The split name of the validation panel's eval lines (evals.jsonl).
VALIDATION_SPLIT = "validation"
#: metrics.jsonl keys of the health metrics the GRPO trainer logs, and of the step's mean reward (TRL's).
ENTROPY_KEY, KL_KEY, REWARD_KEY = "health/sampled_entropy", "health/kl_start", "reward"

#: One-sided sign test level: a drop this unlikely under "GRPO changed nothing" is beyond the panel's noise.
SIGN_TEST_P = 0.05
#: The newest steps that must all be high for the entropy rule (one or two high batches in three are noise).
ENTROPY_WINDOW = 3
#: How far each of those steps must exceed the start's entropy, as a factor and in nats/token (a sharp warm start's
#: entropy is a few hundredths of a nat, where a factor alone would fire on noise).
ENTROPY_RATIO, ENTROPY_MIN_RISE = 1.5, 0.1
#: KL from GRPO's start (nats/token) beyond which the policy is another model, not a refined one.
KL_LIMIT = 0.5
#: A grad norm this many times the running median of the steps before it is a spike.
SPIKE_RATIO = 5.0
#: The running median's window, and the fewest earlier steps it needs before it judges one.
SPIKE_HISTORY, SPIKE_MIN_HISTORY = 20, 5


@dataclass(frozen=True)
class Sign:
    """One sign of a collapse: which rule found it (`validation_drop`, `entropy_runaway`, `policy_drift`,
    `grad_norm_spike`), the GRPO step it was seen at, and what it says, in words."""

    rule: str
    step: int
    text: str


def collapse_signs(metrics: Iterable[Any], evals: Iterable[Any]) -> list[Sign]:
    """Every sign of a collapse in a run's GRPO records (`metrics.jsonl`, `evals.jsonl`), validation first (then
    entropy, drift, grad norm)."""
    metrics = list(metrics)
    found = [validation_drop(evals), entropy_runaway(metrics), policy_drift(metrics), grad_norm_spike(metrics)]
    return [sign for sign in found if sign is not None]


# ---------------------------------------------------------------------------------------------------- helpers
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _grpo(records: Iterable[Any]) -> list[dict[str, Any]]:
    """GRPO's records (lines written before runs had phases count as GRPO's), with a numeric step."""
    return [r for r in records if isinstance(r, dict) and r.get("phase", "grpo") == "grpo"
            and _number(r.get("step")) is not None]


def _by_step(records: Iterable[Any], key: str) -> list[tuple[int, float]]:
    """(step, value) of GRPO's records with a numeric `key`, one per step (the last written wins), by step."""
    points: dict[int, float] = {}
    for record in _grpo(records):
        value = _number(record.get(key))
        if value is not None:
            points[int(record["step"])] = value
    return sorted(points.items())


def _pct(rate: float) -> str:
    return f"{rate:.0%}"


# ------------------------------------------------------------------------------------------------ validation
def sign_test_p(lost: int, gained: int) -> float:
    """The one-sided sign test: the chance of `lost` or more losses among `lost + gained` flips when each flip is
    as likely a loss as a gain (1.0 when nothing flipped)."""
    n = lost + gained
    if n <= 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(lost, n + 1)) / 2 ** n


def paired_flips(start: dict[str, Any], later: dict[str, Any]) -> tuple[int, int, int] | None:
    """(lost, gained, questions paired) between two validation lines' per-question outcomes, or None when they hold
    none to pair. Same question list: paired by position; otherwise by question id (ids in both, first occurrence)."""

    def outcomes(record: dict[str, Any]) -> tuple[list[Any], list[bool]] | None:
        ids, correct = record.get("question_ids"), record.get("correct")
        if not isinstance(ids, list) or not isinstance(correct, list) or len(ids) != len(correct) or not ids:
            return None
        if not all(isinstance(c, bool) for c in correct):
            return None
        return ids, correct

    a, b = outcomes(start), outcomes(later)
    if a is None or b is None:
        return None
    if a[0] == b[0]:
        pairs = list(zip(a[1], b[1]))
    else:
        first = {}
        for qid, ok in zip(*b):
            first.setdefault(str(qid), ok)
        seen: set[str] = set()
        pairs = []
        for qid, ok in zip(*a):
            if str(qid) in first and str(qid) not in seen:
                seen.add(str(qid))
                pairs.append((ok, first[str(qid)]))
    if not pairs:
        return None
    lost = sum(1 for before, after in pairs if before and not after)
    gained = sum(1 for before, after in pairs if after and not before)
    return lost, gained, len(pairs)


def _validation_lines(evals: Iterable[Any]) -> list[dict[str, Any]]:
    """GRPO's validation evals that measured something (a failed eval, with `error`, did not), by step."""
    lines = {}
    for record in _grpo(evals):
        if record.get("split") == VALIDATION_SPLIT and not record.get("error") \
                and _number(record.get("success_rate")) is not None:
            lines[int(record["step"])] = record
    return [lines[step] for step in sorted(lines)]


def validation_drop(evals: Iterable[Any]) -> Sign | None:
    """The newest validation success below the start's by more than the panel's noise (module docstring), or None."""
    lines = _validation_lines(evals)
    if len(lines) < 2:
        return None
    start, latest = lines[0], lines[-1]
    s0, s1 = float(start["success_rate"]), float(latest["success_rate"])
    step0, step1 = int(start["step"]), int(latest["step"])
    fell = f"Validation success fell from {_pct(s0)} at step {step0} to {_pct(s1)} at step {step1}"
    flips = paired_flips(start, latest)
    if flips is not None:
        lost, gained, n = flips
        p = sign_test_p(lost, gained)
        if lost <= gained or p >= SIGN_TEST_P:
            return None
        return Sign("validation_drop", step1, f"{fell}: {lost} of {n} questions lost, {gained} gained (sign test "
                                              f"p = {p:.2g}), more than the panel's noise.")
    n1 = _number(latest.get("n_episodes"))
    if n1 is None or n1 < 1:
        return None
    n1 = int(n1)
    low, high = wilson_interval(min(n1, max(0, round(s1 * n1))), n1)
    if s0 <= high:
        return None
    return Sign("validation_drop", step1, f"{fell}: its 95% interval on {n1} questions ({_pct(low)}–{_pct(high)}) "
                                          "lies below the start, more than the panel's noise.")


# ----------------------------------------------------------------------------------------------- the policy
def entropy_runaway(metrics: Iterable[Any]) -> Sign | None:
    """Each of the last `ENTROPY_WINDOW` steps' sampled entropy well above GRPO's first step's, the reward not above
    the start's (module docstring), or None."""
    metrics = list(metrics)
    points = _by_step(metrics, ENTROPY_KEY)
    if len(points) < 1 + ENTROPY_WINDOW:
        return None
    start_step, start = points[0]
    recent = points[-ENTROPY_WINDOW:]
    bar = max(start * ENTROPY_RATIO, start + ENTROPY_MIN_RISE)
    if any(value < bar for _, value in recent):
        return None
    rewards = dict(_by_step(metrics, REWARD_KEY))
    fell = ""
    if start_step in rewards:
        late = [rewards[step] for step, _ in recent if step in rewards]
        if late:
            reward = statistics.median(late)
            if reward > rewards[start_step]:
                return None  # flatter but better: exploring, not coming apart
            fell = f", while the reward went {rewards[start_step]:.2f} -> {reward:.2f}"
    step = points[-1][0]
    low = min(value for _, value in recent)
    return Sign("entropy_runaway", step, f"The sampled entropy is running away: at least {low:.2f} nats/token in each "
                                         f"of the last {ENTROPY_WINDOW} steps (to step {step}), against {start:.2f} "
                                         f"at GRPO's step {start_step}{fell}: the policy is flattening.")


def policy_drift(metrics: Iterable[Any]) -> Sign | None:
    """The newest KL from GRPO's start above `KL_LIMIT` (module docstring), or None."""
    points = _by_step(metrics, KL_KEY)
    if not points or points[-1][1] <= KL_LIMIT:
        return None
    step, kl = points[-1]
    return Sign("policy_drift", step, f"The policy has moved far from where GRPO started: KL {kl:.2g} nats/token at "
                                      f"step {step}, over {KL_LIMIT:g} (healthy runs recorded stayed below 0.05): an "
                                      "update too large for its signal.")


def grad_norm_spike(metrics: Iterable[Any]) -> Sign | None:
    """The newest GRPO step whose grad norm is over `SPIKE_RATIO` times the running median (module docstring), or
    None."""
    points = _by_step(metrics, "grad_norm")
    spikes = []
    for i in range(SPIKE_MIN_HISTORY, len(points)):
        median = statistics.median(v for _, v in points[max(0, i - SPIKE_HISTORY):i])
        if median > 0 and points[i][1] > SPIKE_RATIO * median:
            spikes.append((points[i][0], points[i][1], median))
    if not spikes:
        return None
    step, value, median = spikes[-1]
    more = f" ({len(spikes)} spikes in all)" if len(spikes) > 1 else ""
    return Sign("grad_norm_spike", step, f"The grad norm spiked to {value:.3g} at step {step}, "
                                         f"{value / median:.1f}x the median {median:.3g} of the steps before{more}.")
