"""One resolved plan per run: where the episodes come from, where the files go, which device and precision.

A `TrainConfig` is plain data: what was asked for ("builtin", "auto", `None` = auto), checked only as values.
`RunPlan.resolve(config)` turns it into what a run uses, once, and is the one place that looks at the world: it
checks what the values alone cannot (`check_config`: the dataset and its splits on disk, TRL's own checks of
`grpo`/`sft.args`, installed trackers, a Hub model's length budget, a CUDA GPU where one is asked for), then decides
the dataset directory (`sqlenv.data.datasets.DatasetInfo`, built on first use for `builtin`), the run directory and its
sub-folders, the device, the precision (`resolve_device`, `resolve_precision`: the only place they are decided)
and the CPU threads. The plan is then
passed down by construction — to the SFT warm start, the GRPO trainer, the environments TRL builds, the evals and
the comparison — so nothing reads a class or module global and nothing resolves the dataset name again.

    plan = RunPlan.resolve(TrainConfig.from_json("configs/tiny_cpu.json"))
    source = plan.episodes("train")        # EpisodeSource: questions file, databases, step budget
    env = SQLEnvTRL(source)                # what TRL's environment_factory builds (training.environment)

`EpisodeSource` (`training.environment.source`) is the small, picklable part an environment needs: a questions file, a
database folder and a step budget (plus optional reward and sandbox settings). Its questions are parsed once and
shared by every environment built from it. The device, precision and CPU threads are `training.device`'s rules.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from training.device import cpu_has_bf16_units, resolve_cpu_threads, resolve_device, resolve_precision
from training.environment.source import EpisodeSource

__all__ = ["EpisodeSource", "RunPlan", "check_config", "cpu_has_bf16_units", "resolve_device", "resolve_precision"]

#: The splits the built-in dataset always has (checked without building it, so a check stays instant).
BUILTIN_SPLITS = ("train", "eval", "eval_unseen_db")


def is_hub_model(model: str) -> bool:
    """A Hub id (not built-in, not a local path): a real pretrained model with its size and habits."""
    import os

    from training.models.gguf import is_gguf_model

    if model.startswith("builtin:") or model.startswith((".", "/", "~")) or is_gguf_model(model):
        return False
    return not os.path.exists(os.path.expanduser(model))


def check_config(config: Any) -> None:
    """Check what a `TrainConfig`'s values alone cannot: the world they name. Raises `ConfigError` naming the field
    and what to change, as the config's own checks do; reads files and imports TRL, but writes nothing.

    Checked: a GGUF model's file is there (`smollm2-135m`: its package is installed); the dataset exists and has
    `train_split` and `eval_split`; `grpo` and `sft.args` are fields of TRL's
    `GRPOConfig` / `SFTConfig` that TRL accepts; each `report_to` tracker is installed; a Hub model's
    `max_completion_length` fits a multi-turn episode; `device="cuda"` has a GPU; QLoRA has bitsandbytes.
    """
    import importlib.util

    from training.config import TRACKERS, ConfigError
    from training.models.gguf import gguf_path, is_gguf_model

    if is_gguf_model(config.model):
        try:  # a missing package or file is named before a run starts (the message says what to install)
            gguf_path(config.model)
        except FileNotFoundError as exc:
            raise ConfigError(f"model: {exc}") from None
    _check_dataset(config)
    _check_passthrough("grpo", config.grpo)
    _check_passthrough("sft.args", config.sft.args)
    for name in config.report_to:
        modules = TRACKERS[name]
        if not any(importlib.util.find_spec(m) is not None for m in modules):
            raise ConfigError(f"report_to: {name} is not installed (pip install {modules[0]}), or leave it out")
    # The floor is for Hub models of unknown habits; a packaged model's Hub id is that model, whose recipes are measured.
    from training.models.gguf import PACKAGED_MODELS

    known = any(packaged.hub_id == config.model for packaged in PACKAGED_MODELS.values())
    if (config.max_completion_length is not None and config.max_completion_length < 512 and is_hub_model(config.model)
            and not known):
        raise ConfigError(f"max_completion_length={config.max_completion_length} is too short for {config.model}: a "
                          "whole multi-turn episode must fit in it; use at least 512 (1024 recommended)")
    if (config.resolved_lora() or {}).get("load_in_4bit") and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("lora.load_in_4bit (QLoRA) needs bitsandbytes (pip install bitsandbytes) and a CUDA GPU; or "
                          "set load_in_4bit=false")
    if config.device == "cuda" and resolve_device("auto") != "cuda":
        raise ConfigError("device='cuda' but torch sees no CUDA GPU: use device='auto' or 'cpu'")


def _check_dataset(config: Any) -> None:
    from training.config import ConfigError

    if config.dataset == "builtin":
        splits: list[str] | tuple[str, ...] = BUILTIN_SPLITS
    else:
        from sqlenv.data.datasets import resolve_dataset

        try:
            splits = list(resolve_dataset(config.dataset, data_root=config.data_dir).splits)
        except ValueError as exc:  # DatasetNotFoundError is a ValueError
            raise ConfigError(f"dataset: {exc}") from None
    for name in ("train_split", "eval_split"):
        split = getattr(config, name)
        if split not in splits:
            raise ConfigError(f"{name}={split!r} is not a split of dataset {config.dataset!r}; it has: "
                              f"{', '.join(splits)}")


def _check_passthrough(name: str, values: dict) -> None:
    """`grpo` / `sft.args`: every key a field of TRL's config, with values TRL accepts."""
    if not values:
        return
    import dataclasses
    import warnings

    from training.config import ConfigError, unknown_key_message

    try:
        from trl import GRPOConfig, SFTConfig
    except ImportError:  # TRL is not installed (the app extra alone): the run will say so
        return
    trl_config = GRPOConfig if name == "grpo" else SFTConfig
    fields = {f.name for f in dataclasses.fields(trl_config)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError("; ".join(
            unknown_key_message(k, fields, prefix=f"{name}.", what=f"{trl_config.__name__} field") for k in unknown))
    try:  # TRL's own checks of the values (the rest are checked when the trainer starts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trl_config(output_dir=".sqlenv-unused", use_cpu=True, report_to="none", **values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one run uses, resolved once from its `TrainConfig` (see the module docstring).

    Args:
        config: the resolved `TrainConfig` (`TrainConfig.resolved()`, and `compare_base` decided for the device).
        dataset: the resolved dataset directory (`sqlenv.data.datasets.DatasetInfo`).
        run_dir: the run directory (`runs/<run_id>/`).
        device: `"cpu"`, `"cuda"` or `"mps"`.
        precision: `"bf16"`, `"fp16"` or `"fp32"` (mixed precision: weights stay fp32, see `TrainConfig.precision`).
        cpu_threads: torch threads on CPU runs (`resolve_cpu_threads`; None on other devices).
        validation_ids: the validation panel, question ids of the train split held out of it (`TrainConfig.
            validation_questions`, chosen by `training.panel.choose_panel`); empty when the run has none.
    """

    config: Any
    dataset: Any
    run_dir: Path
    device: str
    precision: str
    cpu_threads: int | None
    validation_ids: tuple[str, ...] = ()

    @classmethod
    def resolve(cls, config: Any, *, run_dir: str | Path | None = None) -> "RunPlan":
        """Check `config` against the world (`check_config`) and resolve it into a plan.

        Args:
            config: the run's `TrainConfig` (resolved here if it is not yet).
            run_dir: the run directory; default `config.output_dir` (after `config.resolved()`).

        Raises:
            ConfigError: what `check_config` finds, before anything is built or written.
        """
        check_config(config)
        if config.run_id is None or config.output_dir is None or config.learning_rate is None:
            config = config.resolved()
        from sqlenv.data.datasets import resolve_dataset

        device = resolve_device(config.device)
        if config.compare_base is None:  # auto: the model before GRPO is worth playing where it is cheap
            config = dataclasses.replace(config, compare_base=config.is_builtin_model or device == "cuda")
        dataset = resolve_dataset(config.dataset, data_root=config.data_dir)
        validation_ids = ()
        if config.validation_questions != 0:
            from sqlenv.data.datasets import load_questions
            from training.panel import choose_panel

            ids = [q.question_id for q in load_questions(dataset.questions_path(config.train_split))]
            validation_ids = choose_panel(ids, config.validation_questions, config.seed)
        if config.keep_best and not validation_ids:
            from training.config import ConfigError

            raise ConfigError(f"keep_best: true needs a validation panel to pick the best weights by, and this run has "
                              f"none (validation_questions={config.validation_questions}): set validation_questions "
                              f"above 0, or keep_best to false")
        if config.validation_questions is None or config.keep_best is None:  # auto: decided by the panel's size
            config = dataclasses.replace(
                config, validation_questions=len(validation_ids),
                keep_best=bool(validation_ids) if config.keep_best is None else config.keep_best)
        return cls(
            config=config,
            dataset=dataset,
            run_dir=Path(run_dir) if run_dir is not None else Path(config.output_dir),
            device=device,
            precision=resolve_precision(config.precision, device),
            cpu_threads=resolve_cpu_threads(config) if device == "cpu" else None,
            validation_ids=validation_ids,
        )

    # --- data -------------------------------------------------------------------------------------------
    def episodes(self, split: str | None = None) -> EpisodeSource:
        """The episode source of `split` (default: the train split) with the run's step budget, on the run's
        environment server when `env_url` is set. The train split's source holds out the validation panel."""
        split = split or self.config.train_split
        held_out = self.validation_ids if split == self.config.train_split else ()
        return EpisodeSource.from_dataset(self.dataset, split, self.config.step_budget,
                                          base_url=self.config.env_url, held_out=held_out)

    def environment(self, split: str):
        """A new `SQLEnvironment` over `split` with the run's step budget (the caller closes it)."""
        from sqlenv.environment import SQLEnvironment

        return SQLEnvironment.from_dataset(self.dataset, split, step_budget=self.config.step_budget)

    # --- files ------------------------------------------------------------------------------------------
    @property
    def checkpoints_dir(self) -> Path:
        """`<run>/checkpoints/`: one folder per phase (`sft/`, `grpo/`), each holding `checkpoint-<step>/`."""
        return self.run_dir / "checkpoints"

    def phase_dir(self, phase: str) -> Path:
        """The trainer's output folder of one phase: where its checkpoints are written."""
        return self.checkpoints_dir / phase

    @property
    def warm_start_dir(self) -> Path:
        """`<run>/warm_start/`: the model as SFT left it (what GRPO starts from, its KL reference and LoRA's base)."""
        return self.run_dir / "warm_start"
