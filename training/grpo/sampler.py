"""Groups that carry signal: a GRPO question sampler that favours questions whose recent groups had mixed success.

GRPO learns only from a group whose episodes differ: when all `num_generations` episodes of a question succeed, or all
fail, every advantage is 0 and the group teaches nothing. `MixedQuestionSampler` draws the questions of each
generation batch with weights that estimate how likely each question's next group is to be *mixed* (some episodes
succeed, some fail, by the verifier's success: the correctness reward, not the dense reward), and so replaces the
questions whose recent groups were all equal.

The estimate (`QuestionStats`): a question's success rate s has a Beta posterior from its own recent episodes, over a
prior centred on its groups' recent success rates: coarser keys seen far more often than one question
(`question_groups`: template × database, then template, on the built-in data; the database on Spider), each shrunk
toward the next coarser one, the coarsest toward 0.5, so an unseen question or group is presumed promising. Counts
decay by half every `half_life` generation batches, so the estimate follows the policy as it learns. A question's
weight is `explore + P(mixed)`, with `P(mixed) = 1 - E[s^G] - E[(1-s)^G]` under that posterior (closed form), G the
group size.

It plugs into TRL's `GRPOTrainer` through the `QuestionSampling` mixin:

    class MyTrainer(QuestionSampling, GRPOTrainer): ...
    trainer = MyTrainer(..., question_sampler="mixed", question_groups=question_groups(source))

The mixin
- hands TRL's dataloader a `MixedQuestionSampler` with `RepeatSampler`'s layout (each question `num_generations` times
  in a row, each chunk of questions `num_iterations × steps_per_generation` times: one chunk per generation batch);
- feeds it the outcomes of every generation batch: the success reward's values, read from the rewards TRL has just
  computed and gathered across processes (`_calculate_rewards`), so the same code serves the `environment_factory`
  and `rollout_func` paths, and every process sees the same outcomes and draws the same questions;
- logs `groups_mixed_success_frac`, the fraction of this batch's groups with mixed success, whichever sampler is on;
- saves its statistics in each checkpoint (`question_sampler.json`) and restores them on resume.

Lag: the dataloader draws ahead of training (accelerate prefetches one batch, dataloader workers more), so a chunk
is drawn before the outcomes of the chunk (or chunks) in flight are known: the outcomes of generation batch k shape
batch k + 2 at the earliest (at an epoch's start, k + 1). The questions in flight (drawn, no outcome yet) are left out of the next
draws while there are enough others, so a question is not spent twice before its first result is in.

Deterministic given the seed and the outcomes. `sqlenv` stays free of torch: this module is training-side.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from transformers import TrainerCallback

from training.config import QUESTION_SAMPLERS

__all__ = ["QUESTION_SAMPLERS", "MIXED_METRIC", "STATE_FILE", "SamplerSettings", "QuestionStats",
           "MixedQuestionSampler", "QuestionSampling", "mixed_success_fraction", "question_groups"]

#: The metric logged per GRPO step: the fraction of the generation batch's groups with mixed success.
MIXED_METRIC = "groups_mixed_success_frac"
#: The file in each checkpoint folder that holds the sampler's statistics.
STATE_FILE = "question_sampler.json"
_STATE_VERSION = 1


@dataclass(frozen=True)
class SamplerSettings:
    """How `QuestionStats` weighs the evidence.

    Args:
        half_life: generation batches after which an outcome counts half (default 8.0). The policy changes from step
            to step (a question that failed every episode 30 steps ago may be mixed today), but a group is seen only
            every few steps: in a simulation of the built-in data at 8 questions a step
            (`bench/learning/question_sampler.py`), a half-life of 4 kept less of the gain than 8 or 16.
        prior_strength: how alike the questions under one key are, in episodes (default 2.0): a question's success
            rate is taken to scatter around its group's as a Beta of this many pseudo-episodes, so a group seen often
            speaks for its unseen questions, and a question's own group of `num_generations` episodes outweighs it.
        explore: weight added to every question (default 0.05, against a mixed question's ~0.8-1.0): questions
            judged all-equal are drawn rarely, not never, so a question the policy has since moved on still gets seen.
        in_flight: most chunks remembered as drawn without outcomes (default 4): their questions are left out of the
            next draws; a chunk never scored (skipped on resume) is forgotten after this many draws.
    """

    half_life: float = 8.0
    prior_strength: float = 2.0
    explore: float = 0.05
    in_flight: int = 4

    def __post_init__(self):
        if not self.half_life > 0:
            raise ValueError(f"half_life must be positive (got {self.half_life})")
        if not self.prior_strength > 0:
            raise ValueError(f"prior_strength must be positive (got {self.prior_strength})")
        if not self.explore > 0:
            raise ValueError(f"explore must be positive (got {self.explore}): a question of weight 0 is never drawn "
                             "again")
        if self.in_flight < 0:
            raise ValueError(f"in_flight must be >= 0 (got {self.in_flight})")


def mixed_success_fraction(successes: Sequence[bool] | torch.Tensor, num_generations: int) -> float:
    """The fraction of groups with mixed success: at least one episode succeeded and at least one failed.

    Args:
        successes: one success flag per completion, groups consecutive (TRL's order: `num_generations` completions of
            one question in a row).
        num_generations: the group size.
    """
    flags = torch.as_tensor(successes, dtype=torch.bool).reshape(-1)
    if num_generations < 1 or flags.numel() % num_generations:
        raise ValueError(f"{flags.numel()} completions are not whole groups of {num_generations}")
    if flags.numel() == 0:
        return 0.0
    groups = flags.view(-1, num_generations)
    return (groups.any(dim=1) & ~groups.all(dim=1)).float().mean().item()


def question_groups(source: Any) -> dict[str, tuple[str, ...]]:
    """The coarser keys of each question, finest first, for the sampler's prior: `("<template>@<database>",
    "<template>")` when the question record names its template (the built-in data: a template is one SQL shape, the
    main cause of a question's difficulty), else `("<database>",)` (Spider and any other dataset).

    Args:
        source: a `training.environment.source.EpisodeSource`, or the path of a `questions_<split>.json` file.
            The file is read as JSON because `sqlenv.types.Question` keeps only the fields every dataset has (no
            `template`).
    """
    path = Path(getattr(source, "questions_path", source))
    records = json.loads(path.read_text(encoding="utf-8"))
    groups = {}
    for record in records:
        database = str(record.get("database_name", ""))
        template = record.get("template")
        groups[str(record["question_id"])] = (f"{template}@{database}", str(template)) if template else (database,)
    return groups


class _Level:
    """One level of keys above the questions: each question's key index (-1: none) and the keys' decayed counts."""

    def __init__(self, keys_of_questions: Sequence[str | None]):
        self.keys = sorted({k for k in keys_of_questions if k is not None})
        index = {k: i for i, k in enumerate(self.keys)}
        self.of_question = torch.tensor([index.get(k, -1) if k is not None else -1 for k in keys_of_questions],
                                        dtype=torch.long)
        self.success = torch.zeros(len(self.keys) + 1, dtype=torch.float64)  # last slot: questions without a key
        self.failure = torch.zeros(len(self.keys) + 1, dtype=torch.float64)

    def slot(self) -> torch.Tensor:
        return torch.where(self.of_question < 0, len(self.keys), self.of_question)


class QuestionStats:
    """Per-question and per-group success counts, decayed, and the sampling weight they give each dataset row.

    Args:
        question_ids: the question of each dataset row, in row order (rows may repeat a question).
        num_generations: the group size G the weights are for (P(mixed) of a group of G).
        groups: question id -> its coarser keys, finest first (`question_groups`), or one key; None, or an id
            missing: a question with no group, whose prior is flat (s around 0.5: optimistic, as unseen questions
            should be).
        settings: a `SamplerSettings` (default: its defaults).

    A question's prior is its finest group's posterior success rate, whose prior is the next coarser group's, and
    so on up to a flat one (each level widened by `SamplerSettings.prior_strength`, how alike its members are): a group
    seen often speaks for its unseen questions, a group never seen leaves them presumed promising.
    """

    def __init__(self, question_ids: Sequence[str], num_generations: int,
                 groups: Mapping[str, str | Sequence[str]] | None = None, settings: SamplerSettings | None = None):
        if num_generations < 1:
            raise ValueError(f"num_generations must be at least 1 (got {num_generations})")
        self.settings = settings or SamplerSettings()
        self.num_generations = int(num_generations)
        self.keys = list(dict.fromkeys(str(q) for q in question_ids))
        self._index = {key: i for i, key in enumerate(self.keys)}
        self.row_question = torch.tensor([self._index[str(q)] for q in question_ids], dtype=torch.long)
        chains = [_chain((groups or {}).get(k)) for k in self.keys]
        depth = max((len(c) for c in chains), default=0)
        self.levels = [_Level([c[i] if i < len(c) else None for c in chains]) for i in range(depth)]
        self.success = torch.zeros(len(self.keys), dtype=torch.float64)
        self.failure = torch.zeros(len(self.keys), dtype=torch.float64)
        self.records = 0
        self._in_flight: deque[set[int]] = deque(maxlen=self.settings.in_flight)

    # ------------------------------------------------------------------------------------------ outcomes
    def record(self, question_ids: Sequence[Any], successes: Sequence[bool]) -> None:
        """Take one generation batch's outcomes: one question id and one success flag per completion. Every count
        first decays by one batch; ids not in the dataset are ignored."""
        if len(question_ids) != len(successes):
            raise ValueError(f"{len(question_ids)} question ids for {len(successes)} outcomes")
        decay = 0.5 ** (1.0 / self.settings.half_life)
        counts = [self.success, self.failure] + [c for level in self.levels for c in (level.success, level.failure)]
        for tensor in counts:
            tensor.mul_(decay)
        slots = [level.slot() for level in self.levels]
        seen = set()
        for question_id, success in zip(question_ids, successes):
            q = self._index.get(str(question_id))
            if q is None:
                continue
            seen.add(q)
            (self.success if success else self.failure)[q] += 1.0
            for level, slot in zip(self.levels, slots):
                (level.success if success else level.failure)[slot[q]] += 1.0
        for chunk in self._in_flight:
            chunk -= seen
        self.records += 1

    # ------------------------------------------------------------------------------------------- weights
    def mixed_probability(self) -> torch.Tensor:
        """P(the next group of G is mixed) per question, under its Beta posterior (see the class docstring)."""
        kappa = self.settings.prior_strength
        # The coarsest key's rate starts flat (Beta(1, 1)); each level's posterior, widened by how unlike its members
        # may be (kappa), is the prior of the level below, and last of the question.
        mean = torch.full_like(self.success, 0.5)
        strength = torch.full_like(self.success, 2.0)
        for level in reversed(self.levels):
            slot = level.slot()
            a = strength * mean + level.success[slot]
            b = strength * (1.0 - mean) + level.failure[slot]
            spread = 1.0 / (a + b + 1.0)  # Var(rate) / (m (1 - m)) of this key's Beta posterior
            child = 1.0 / ((1.0 - spread) / (kappa + 1.0) + spread) - 1.0  # a member's, moments matched to a Beta
            has = level.of_question >= 0
            mean = torch.where(has, a / (a + b), mean)
            strength = torch.where(has, child, strength)
        a = strength * mean + self.success
        b = strength * (1.0 - mean) + self.failure
        n = self.num_generations
        # E[s^n] = B(a + n, b) / B(a, b), in log space.
        all_succeed = torch.exp(torch.lgamma(a + n) - torch.lgamma(a) + torch.lgamma(a + b) - torch.lgamma(a + b + n))
        all_fail = torch.exp(torch.lgamma(b + n) - torch.lgamma(b) + torch.lgamma(a + b) - torch.lgamma(a + b + n))
        return (1.0 - all_succeed - all_fail).clamp_min(0.0)

    def row_weights(self) -> torch.Tensor:
        """The sampling weight of each dataset row: `explore + P(mixed)` of its question."""
        return (self.settings.explore + self.mixed_probability())[self.row_question]

    def draw(self, n: int, generator: torch.Generator) -> list[int]:
        """`n` distinct dataset rows drawn by weight, leaving out questions in flight while enough others remain;
        the drawn questions are then in flight until their outcomes are recorded."""
        weights = self.row_weights()
        busy = set().union(*self._in_flight)
        if busy:
            held = torch.isin(self.row_question, torch.tensor(sorted(busy), dtype=torch.long))
            if int((~held).sum()) >= n:
                weights = weights.masked_fill(held, 0.0)
        rows = torch.multinomial(weights, n, replacement=False, generator=generator).tolist()
        self._in_flight.append({int(self.row_question[r]) for r in rows})
        return rows

    # ------------------------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The counts by question id and by group key (non-zero ones), JSON-ready."""
        def nonzero(keys, success, failure):
            return {k: [s, f] for k, s, f in zip(keys, success.tolist(), failure.tolist()) if s > 1e-12 or f > 1e-12}

        return {"version": _STATE_VERSION, "num_generations": self.num_generations, "records": self.records,
                "settings": asdict(self.settings),
                "questions": nonzero(self.keys, self.success, self.failure),
                "levels": [nonzero(level.keys, level.success, level.failure) for level in self.levels]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counts saved by `state_dict`; questions and groups this dataset lacks are ignored."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"question sampler state version {state.get('version')!r}, expected {_STATE_VERSION}")
        targets = [(self.keys, self.success, self.failure, state.get("questions", {}))]
        saved_levels = list(state.get("levels", []))
        for i, level in enumerate(self.levels):
            targets.append((level.keys, level.success, level.failure, saved_levels[i] if i < len(saved_levels) else {}))
        for keys, success, failure, saved in targets:
            success.zero_()
            failure.zero_()
            index = {k: i for i, k in enumerate(keys)}
            for key, (s, f) in saved.items():
                if key in index:
                    success[index[key]], failure[index[key]] = float(s), float(f)
        self.records = int(state.get("records", 0))
        self._in_flight.clear()


def _chain(keys: str | Sequence[str] | None) -> tuple[str, ...]:
    if keys is None:
        return ()
    return (keys,) if isinstance(keys, str) else tuple(str(k) for k in keys)


class MixedQuestionSampler(Sampler[int]):
    """TRL's `RepeatSampler` layout, with each chunk of questions drawn by `QuestionStats.draw` when it is reached.

    Args:
        stats: the `QuestionStats` of the train dataset (the trainer feeds it outcomes).
        batch_size: distinct questions per chunk: `generation_batch_size // num_generations`.
        mini_repeat_count: times each question is repeated in a row: `num_generations`.
        repeat_count: times each chunk is repeated: `num_iterations * steps_per_generation` (TRL reuses one generation
            batch for that many micro-steps; the dataloader still reads every copy).
        seed: the draw's seed (default None: torch's default generator state at construction).

    An epoch has as many chunks as `RepeatSampler`'s (`len(rows) // batch_size`), so the trainer's step arithmetic is
    the same; chunks are drawn lazily, so each sees every outcome recorded before it is reached.
    """

    def __init__(self, stats: QuestionStats, *, batch_size: int, mini_repeat_count: int, repeat_count: int = 1,
                 seed: int | None = None):
        rows = len(stats.row_question)
        if batch_size < 1 or batch_size > rows:
            raise ValueError(f"a generation batch needs {batch_size} distinct questions; the dataset has {rows} rows")
        self.stats = stats
        self.batch_size = batch_size
        self.mini_repeat_count = mini_repeat_count
        self.repeat_count = repeat_count
        self.num_chunks = rows // batch_size
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.num_chunks):
            chunk = self.stats.draw(self.batch_size, self.generator)
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return self.num_chunks * self.batch_size * self.mini_repeat_count * self.repeat_count


class _SaveQuestionStats(TrainerCallback):
    """Writes the sampler's statistics into each checkpoint folder the trainer has just saved."""

    def __init__(self, stats: QuestionStats):
        self.stats = stats

    def on_save(self, args, state, control, **kwargs):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if args.should_save and os.path.isdir(folder):
            tmp = os.path.join(folder, f".{STATE_FILE}.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.stats.state_dict(), fh)
            os.replace(tmp, os.path.join(folder, STATE_FILE))
        return control


class QuestionSampling:
    """A `GRPOTrainer` mixin: the question sampler of `question_sampler`, and the mixed-success metric (see the
    module docstring). Put it before `GRPOTrainer`: `class T(QuestionSampling, GRPOTrainer)`.

    Args:
        question_sampler: `"uniform"` (default: TRL's own shuffled `RepeatSampler`, unchanged) or `"mixed"`
            (`MixedQuestionSampler`: needs a map-style train dataset with a `question_id` column).
        question_groups: question id -> its coarser keys, finest first, for the prior (`question_groups(source)`);
            default None: per question only, over a flat prior.
        sampler_settings: a `SamplerSettings` (default: its defaults).
        *args, **kwargs: `GRPOTrainer`'s.

    Class attributes: `success_reward`, the reward function whose value > 0 means the episode succeeded (default
    `"reward_correctness"`, the verifier's verdict); `question_key`, the dataset column naming a row's question.
    """

    success_reward = "reward_correctness"
    question_key = "question_id"

    def __init__(self, *args: Any, question_sampler: str = "uniform",
                 question_groups: Mapping[str, str | Sequence[str]] | None = None,
                 sampler_settings: SamplerSettings | None = None, **kwargs: Any):
        if question_sampler not in QUESTION_SAMPLERS:
            raise ValueError(f"question_sampler must be one of {QUESTION_SAMPLERS} (got {question_sampler!r})")
        super().__init__(*args, **kwargs)
        # Without the success reward there is nothing to sample by (refused) or to count as mixed (not logged).
        self.reads_success = self.success_reward in self.reward_func_names
        if question_sampler == "mixed" and not self.reads_success:
            raise ValueError(f"QuestionSampling reads success from the reward function {self.success_reward!r}; the "
                             f"trainer's are {self.reward_func_names}")
        self.question_sampler = question_sampler
        self.question_stats: QuestionStats | None = None
        if question_sampler == "mixed":
            from datasets import Dataset

            dataset = self.train_dataset
            if not isinstance(dataset, Dataset) or self.question_key not in dataset.column_names:
                raise ValueError(f"question_sampler='mixed' needs a map-style train dataset with a "
                                 f"{self.question_key!r} column")
            self.question_stats = QuestionStats(dataset[self.question_key], self.num_generations, question_groups,
                                                sampler_settings)
            self.add_callback(_SaveQuestionStats(self.question_stats))

    # Transformers and TRL have no public hook for the train sampler: TRL itself overrides this private method.
    def _get_train_sampler(self, dataset=None):
        if self.question_stats is None:
            return super()._get_train_sampler(dataset)
        return MixedQuestionSampler(
            self.question_stats,
            batch_size=self.args.generation_batch_size // self.num_generations,
            mini_repeat_count=self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            seed=self.args.seed,
        )

    # No public hook sees a step's rewards gathered across processes (a reward function sees its own process's part and
    # has no handle on the trainer), so the outcomes are read where TRL computes them: after its reward functions ran.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if not self.reads_success:
            return rewards_per_func
        success = torch.nan_to_num(rewards_per_func[:, self.reward_func_names.index(self.success_reward)], nan=0.0) > 0
        training = self.model.training
        group = self.num_generations if training else self.num_generations_eval
        self._log_metric(MIXED_METRIC, mixed_success_fraction(success.cpu(), group))
        if training and self.question_stats is not None:
            from accelerate.utils import gather_object

            question_ids = gather_object([row.get(self.question_key) for row in inputs])
            self.question_stats.record(question_ids, success.tolist())
        return rewards_per_func

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """`Trainer.train`, restoring the sampler's statistics from the checkpoint it resumes from (when it has any)."""
        if self.question_stats is not None and resume_from_checkpoint:
            folder = resume_from_checkpoint
            if folder is True:
                from transformers.trainer_utils import get_last_checkpoint

                folder = get_last_checkpoint(self.args.output_dir)
            path = Path(folder) / STATE_FILE if folder else None
            if path is not None and path.is_file():
                self.question_stats.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
        return super().train(resume_from_checkpoint, *args, **kwargs)
