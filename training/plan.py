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
    env = SQLEnvTRL(source)                # what TRL's environment_factory builds (see training.grpo)

`EpisodeSource` is the small, picklable part an environment needs: a questions file, a database folder and a step
budget (plus optional reward and sandbox settings). Its questions are parsed once and shared by every environment
built from it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

__all__ = ["EpisodeSource", "RunPlan", "check_config", "cpu_has_bf16_units", "resolve_device", "resolve_precision"]

#: The splits the built-in dataset always has (checked without building it, so a check stays instant).
BUILTIN_SPLITS = ("train", "eval", "eval_unseen_db")


def resolve_device(device: str = "auto") -> str:
    """`"auto"` → `"cuda"` when a CUDA GPU is visible, else `"cpu"`; any other value as it is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def busy_cores_now(window_s: float = 1.0) -> float | None:
    """The cores the machine keeps busy now: its CPU time that was not idle over the next `window_s` seconds
    (Linux's /proc/stat), in cores. None where /proc/stat cannot be read."""
    import os
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return sum(ticks), ticks[3] + ticks[4]

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def idle_cores() -> int:
    """The cores this process may use that no other job holds now: the cores of its CPU set less the cores the
    machine keeps busy over the next second (`busy_cores_now`, rounded; the call waits that second; the 1-minute load
    average where /proc/stat cannot be read), at least 1. The load average is not the first choice: it decays over
    minutes, so a run started just after another job ended read that job's load and took one core of two for its
    whole length.

    Why it matters (`python bench/learning/cpu_threads.py`, SmolLM2-135M's forward and backward over 700 tokens, 2
    cores): idle, 2 torch threads take 4.5-4.8 s a step and 1 thread 8.1 s; beside one other CPU job, 2 threads take
    9.5-16 s (their OpenMP threads wait for a core the other job holds, spinning) and 1 thread 7.9-8.1 s; at load 6 the
    default 2 threads took 57.6 s. So a run takes the cores that are free when it starts."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    busy = busy_cores_now()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (OSError, AttributeError):
            busy = 0.0
    return max(1, min(cores, (os.cpu_count() or cores) - round(busy)))


def resolve_cpu_threads(config: Any) -> int:
    """Torch threads of a CPU run: `cpu_threads`, else 1 for `builtin:tiny` (its matrices are too small to split),
    else `idle_cores()` when the run starts."""
    if config.cpu_threads is not None:
        return config.cpu_threads
    return 1 if config.is_builtin_model else idle_cores()


#: Forces the answer of `cpu_has_bf16_units`: "1" (bf16 units present) or "0" (none), for a CPU the probe misreads.
CPU_BF16_ENV = "SQLENV_CPU_BF16"
#: The /proc/cpuinfo flags of the matrix units oneDNN runs bf16 matmuls on (Intel AMX, AVX512-BF16; AMD Zen 4+ lists
#: avx512_bf16). Without them torch converts bf16 to fp32 around every product: 4.6-7.6x SLOWER than fp32 on an AVX2
#: EPYC (a 576 -> 1536 linear at 16-512 rows, 1 thread), where a CPU listing amx_bf16 runs it 2.8-7.1x faster.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_has_bf16_units(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 matrix units (`BF16_CPU_FLAGS` among its flags). `cpuinfo`: the text of
    /proc/cpuinfo (default: read it; a machine without one, not Linux, answers False). `$SQLENV_CPU_BF16` set to
    "1" or "0" answers instead of the flags."""
    import os

    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{CPU_BF16_ENV}={forced!r}: expected 1 (the CPU has bf16 units) or 0 (it has none)")
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def resolve_precision(precision: str, device: str) -> str:
    """`"auto"` → bf16 on a CUDA GPU that supports it or a CPU with bf16 matrix units (`cpu_has_bf16_units`), fp32
    otherwise (fp16 only when asked: GRPO's ratios are fragile in fp16); any other value as it is. `device` is a
    resolved device. bf16 is mixed precision: the weights and optimizer state stay fp32, the products run in bf16
    (the trainers' autocast, and decoders that compute as it does)."""
    if precision != "auto":
        return precision
    if device == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device == "cpu":
        return "bf16" if cpu_has_bf16_units() else "fp32"
    return "fp32"


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

    if config.is_gguf_model:
        from training.models.gguf import gguf_path

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


class EpisodeSource:
    """The questions an environment plays: one split's questions file, its databases and the step budget.

    Args:
        questions_path: a `questions_<split>.json` file.
        db_dir: the folder of `<db_id>/<db_id>.sqlite` files.
        step_budget: actions per episode (default 10).
        reward_config: a `sqlenv.RewardConfig` (default: the environment's defaults).
        sandbox: a `sqlenv.SandboxSettings` (default: the environment's defaults).
        base_url: play on a SQLEnv server at this URL (`python -m sqlenv serve`) instead of in-process (default
            None; needs the `server` extra). Each environment then holds one server session; the server owns the
            databases, rewards and sandbox, so `reward_config` and `sandbox` stay unset and `db_dir` may be None;
            the questions file still names the questions (and fills the gold fields of transcripts).
        held_out: question ids this source never plays (default none): a run's validation panel, held out of the
            train split so that GRPO and the warm start never see it (`training.validation`).

    Raises:
        ValueError / FileNotFoundError: a budget below 1, a missing questions file or database folder, rewards or
            a sandbox set for a server.
    """

    def __init__(self, questions_path: str | Path, db_dir: str | Path | None, step_budget: int = 10, *,
                 reward_config: Any = None, sandbox: Any = None, base_url: str | None = None,
                 held_out: Collection[str] = ()):
        if int(step_budget) < 1:
            raise ValueError(f"step_budget must be at least 1, got {step_budget}")
        if base_url is not None and (reward_config is not None or sandbox is not None):
            raise ValueError("with base_url the server sets the rewards and the sandbox: leave reward_config and "
                             "sandbox unset")
        self.questions_path = Path(questions_path)
        self.db_dir = None if db_dir is None else Path(db_dir)
        if not self.questions_path.is_file():
            raise FileNotFoundError(f"questions file not found: {self.questions_path}")
        if base_url is None and (self.db_dir is None or not self.db_dir.is_dir()):
            raise FileNotFoundError(f"database folder not found: {self.db_dir}")
        self.step_budget = int(step_budget)
        self.reward_config = reward_config
        self.sandbox = sandbox
        self.base_url = base_url
        self.held_out = frozenset(held_out)
        self._questions: list | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_dataset(cls, dataset: Any = "builtin", split: str = "train", step_budget: int = 10, *,
                     data_dir: str | Path | None = None, **kwargs: Any) -> "EpisodeSource":
        """The source of one split of a dataset (a name, a directory or a `DatasetInfo`; `data_dir`: where named
        datasets live, default `$SQLENV_DATA_DIR` or `data/`)."""
        from sqlenv.data.datasets import resolve_dataset

        info = resolve_dataset(dataset, data_root=data_dir)
        return cls(info.questions_path(split), info.db_dir, step_budget, **kwargs)

    @property
    def questions(self) -> list:
        """The split's questions less `held_out`, parsed on first use and shared by every environment of this
        source."""
        with self._lock:
            if self._questions is None:
                from sqlenv.data.datasets import load_questions

                questions = load_questions(self.questions_path)
                self._questions = [q for q in questions if q.question_id not in self.held_out] if self.held_out \
                    else questions
            return self._questions

    def environment(self):
        """A new `sqlenv.protocol.Environment` over these questions (the caller closes it): a `SQLEnvironment`, or
        a `RemoteSQLEnvironment` when the source plays on a server."""
        if self.base_url is not None:
            from sqlenv.server.remote import RemoteSQLEnvironment  # needs the sqlenv[server] extra

            return RemoteSQLEnvironment(self.base_url, questions=self.questions, step_budget=self.step_budget)
        from sqlenv.environment import SQLEnvironment

        return SQLEnvironment(self.questions, self.db_dir, step_budget=self.step_budget,
                              reward_config=self.reward_config, sandbox=self.sandbox)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        if self.held_out:
            where += f", held_out=<{len(self.held_out)} questions>"
        return (f"EpisodeSource({str(self.questions_path)!r}, {str(self.db_dir)!r}, "
                f"step_budget={self.step_budget}{where})")


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
