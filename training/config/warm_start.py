"""`WarmStart`: the SFT warm start's settings, a config's `sft` section (`{"sft": {"max_steps": 5000}}`,
`--set sft.max_steps=5000`, `--set sft=false`), with their one set of defaults.

Declared without `from __future__ import annotations`: the field types are read at run time (`field_types`).
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from training.config.errors import ConfigError, fail, unknown_key_message
from training.config.field_types import check_types, coerce_types
from training.config.passthrough import SFT_OWNED, check_owned_keys

__all__ = ["WarmStart", "DEFAULT_TEACHER_MISTAKES", "TINY_TEACHER_ERROR_RATE"]

#: The warm-start teacher's error rate for `builtin:tiny` (measured: see docs/EXPERIMENTS.md).
TINY_TEACHER_ERROR_RATE = 0.3
#: The mistakes the imperfect warm-start teacher makes by default, by `sqlenv.evaluation.policies.MISTAKES` name.
DEFAULT_TEACHER_MISTAKES = ("guess",)


@dataclass
class WarmStart:
    """The SFT warm start (`TrainConfig.sft`): imitate a teacher's episodes before GRPO, since a random-init model
    cannot discover tool calls by itself. These are the one set of defaults; `training.warm_start.SFTSettings` takes them.

    Args:
        enabled: run the warm start. `None` (default) = auto: on for `builtin:tiny`, off for pretrained models (they
            already call tools).
        epochs: passes over the teacher's episodes (default 3.0).
        max_steps: optimizer steps; overrides `epochs` when > 0 (default -1).
        learning_rate: peak learning rate (default 1e-3; the tiny model from scratch takes 3e-3, a pretrained one
            ~1e-5).
        batch_size: conversations per step (default 8).
        episodes: teacher episodes rendered. `None` (default) = one per train question, at most as many as
            `max_steps` steps take (a seeded sample: a short warm start plays no episode it never sees).
        teacher_error_rate: share of the episodes in which the teacher makes a mistake an untrained agent makes
            (answers without looking, or queries with a wrong filter or column and answers from that) instead of
            playing the oracle; 0.0 = the clean oracle. `None` (default) = auto: `TINY_TEACHER_ERROR_RATE` for
            `builtin:tiny`, 0.0 otherwise. Why: a model warm-started on a clean oracle leaves GRPO nothing to find
            (its failures are copy errors no sample fixes); one that has seen both careless and careful episodes
            samples both, and GRPO, rewarded by the verifier, learns that exploring before answering pays. The warm
            start's own success is then lower by design.
        teacher_mistakes: the mistakes the teacher makes, drawn uniformly (default `["guess"]`: answer without
            looking; `"wrong_query"` also queries with a wrong filter or column and answers from that, see
            `sqlenv.evaluation.policies.MISTAKES`). Guesses are what GRPO visibly unlearns.
        eval_every: evaluate (as `eval_every` does in GRPO) every N warm-start steps, so the success chart climbs
            from the random-init model's 0%. `None` (default) = auto: about six evals over the warm start; 0 = none.
        describe: the teacher DESCRIBEs the tables before querying (default True, the strategy the system prompt
            advises). False makes episodes shorter, which the tiny model learns faster.
        tidy_sql: the teacher writes every gold query in one spelling (keywords upper-case, single spaces, strings in
            single quotes; `sqlenv.evaluation.teacher_sql.tidy_sql`), checked to return the same rows (default
            False: the dataset's text). Spider's gold SQL spells the same query many ways (`count(*)`/`COUNT(*)`,
            `a ,  b`), and a small model learns every spelling it is shown.
        sample_values: the teacher SAMPLEs each table whose column the gold query compares with a string, before
            querying (default False): how the data spells a value (`'USA'` or `'United States'`) is in the rows.
        extra_dataset: a second prepared dataset whose train questions the teacher also plays (default None), for
            more SQL than the run's own train split: e.g. `spider_dev` (Spider's 140 train databases) beside
            `spider10`. Every question on a database of the run's own dataset is left out, so no eval question and
            no question on an eval database enters.
        extra_episodes: how many episodes of `extra_dataset` (a seeded sample; default 0).
        precision: the warm start's own precision, `"bf16"`, `"fp16"` or `"fp32"` (mixed: the weights stay fp32, the
            forward and backward passes are autocast), or `None` (default) = the run's `precision` (whose `"auto"` is
            bf16 on a GPU or CPU with bf16 units, fp32 elsewhere). SFT is all prefill-shaped matrix products, which
            bf16 runs ~1.8x faster on a CPU with AVX512-BF16 / AMX (SmolLM2-135M, 2 cores, 700-token episodes: 308
            tokens/s against 170), and several times slower on a CPU without such units (emulated): leave it `None`
            unless the warm start must differ from the run.
        args: any other `trl.SFTConfig` field, e.g. `{"lr_scheduler_type": "constant", "max_length": 1024}` (CLI:
            `--set sft.args.max_length=1024`). Default `{}`. Fields set above, precision, device, the run directory
            and checkpoints are refused, naming the field to set instead; TRL checks the rest when the run is
            planned.
    """

    enabled: bool | None = None
    epochs: float = 3.0
    max_steps: int = -1
    learning_rate: float = 1e-3
    batch_size: int = 8
    episodes: int | None = None
    teacher_error_rate: float | None = None
    teacher_mistakes: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_TEACHER_MISTAKES))
    eval_every: int | None = None
    describe: bool = True
    tidy_sql: bool = False
    sample_values: bool = False
    extra_dataset: str | None = None
    extra_episodes: int = 0
    precision: str | None = None
    args: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        coerce_types(self)
        check_types(self, prefix="sft.")
        if self.epochs <= 0 and self.max_steps <= 0:
            fail("the warm start needs sft.epochs > 0 or sft.max_steps > 0")
        if not self.learning_rate > 0:
            fail(f"sft.learning_rate must be positive (got {self.learning_rate})")
        if self.batch_size < 1:
            fail(f"sft.batch_size must be at least 1 (got {self.batch_size})")
        if self.episodes is not None and self.episodes < 1:
            fail(f"sft.episodes must be at least 1 or null (got {self.episodes})")
        if self.teacher_error_rate is not None and not 0.0 <= self.teacher_error_rate <= 1.0:
            fail(f"sft.teacher_error_rate must be between 0 and 1 or null (got {self.teacher_error_rate}); "
                 "0 is the clean oracle")
        from sqlenv.evaluation.policies import MISTAKES  # the imperfect teacher's mistakes (no ML import)

        unknown = [m for m in self.teacher_mistakes if m not in MISTAKES]
        if unknown or not self.teacher_mistakes:
            fail(f"sft.teacher_mistakes must name one or more of {list(MISTAKES)} (got {self.teacher_mistakes})")
        if self.eval_every is not None and self.eval_every < 0:
            fail(f"sft.eval_every must be >= 0 or null (got {self.eval_every}; 0 turns it off)")
        if self.extra_episodes < 0:
            fail(f"sft.extra_episodes must be >= 0 (got {self.extra_episodes})")
        if self.extra_episodes and not self.extra_dataset:
            fail("sft.extra_episodes needs sft.extra_dataset: the prepared dataset to take them from")
        if self.precision not in (None, "bf16", "fp16", "fp32"):
            fail(f"sft.precision must be bf16, fp16, fp32 or null (the run's precision), got {self.precision!r}")
        check_owned_keys("sft.args", self.args, SFT_OWNED)

    @classmethod
    def from_value(cls, value: Any) -> "WarmStart":
        """A `WarmStart` from what a config may hold: one already, an object of its fields, or true / false / null
        (the switch alone, `enabled`)."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, bool):
            return cls(enabled=value)
        if isinstance(value, dict):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = [k for k in value if k not in names]
            if unknown:
                raise ConfigError("; ".join(unknown_key_message(k, names, prefix="sft.") for k in unknown))
            return cls(**value)
        raise ConfigError(f"sft must be true, false, null or an object of warm-start settings (got {value!r})")

