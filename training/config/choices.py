"""The values a config's fields accept where they are a fixed set, and the defaults of its `lora` section.

Plain constants: the dataclasses check against them (`training.config.validation`), the run plan and the dashboard
read them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUILTIN_MODEL", "ROLLOUT_MODES", "QUESTION_SAMPLERS", "PRECISIONS", "DEVICES", "LORA_DEFAULTS",
           "TRACKERS"]

BUILTIN_MODEL = "builtin:tiny"
ROLLOUT_MODES = ("environment", "rollout_func")
#: How GRPO picks each step's questions (`training.grpo.sampler`).
QUESTION_SAMPLERS = ("uniform", "mixed")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda", "mps")
#: LoRA settings (`TrainConfig.lora`) and their defaults.
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear",
                                 "merge": False, "load_in_4bit": False}
#: Trackers `report_to` accepts, with the modules any of which makes them available (checked by the run plan).
TRACKERS = {"tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",), "wandb": ("wandb",),
            "mlflow": ("mlflow",)}
