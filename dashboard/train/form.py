"""The Train tab's form: the config fields it shows, the LoRA and "Advanced (JSON)" box, Start/Stop, and how their
values become the `TrainConfig` values Start sends (`start_values`); picking a model refills the form with that
model's config (`TrainForm.wire_fill`).

The form holds no run state: Start and Stop are wired by the tab (`dashboard.train.tab`), which owns the runner.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from dashboard.core.context import AppContext
from dashboard.core.datasets import dataset_choices, dataset_splits
from dashboard.core.paths import DEFAULT_CONFIG_FILE
from dashboard.core.runner import ConfigInvalid
from dashboard.train.cost_line import cost_html
from dashboard.train.gpu import has_gpu
from dashboard.train.model_picker import default_values, model_choices, model_help, picked_config
from training.config import TrainConfig

__all__ = ["FORM_FIELDS", "TrainForm", "build_form", "form_fields", "form_to_config_values", "advanced_values",
           "start_values", "warm_start_hint", "form_message"]

# (TrainConfig field, label, kind, help), in form order; consecutive "pair" rows share a line. Every other
# TrainConfig field keeps the tiny config's value.
FORM_FIELDS: list[tuple[str, str, str, str]] = [
    ("model", "Model", "model", ""),  # its help is `model_help()`: it speaks about this machine
    ("dataset", "Dataset", "dataset", "builtin, a dataset prepared under data/, or a path"),
    ("train_split", "Train split", "split", ""),
    ("eval_split", "Eval split", "split", ""),
    ("num_generations", "Generations / question", "int", "GRPO group size, ≥ 2"),
    ("step_budget", "Step budget", "int", "actions per episode"),
    ("max_steps", "GRPO steps", "int", "optimizer steps"),
    ("learning_rate", "Learning rate", "lr", "empty = auto"),
    ("eval_every", "Eval every", "int", "steps; 0 = at the end"),
    ("trace_every", "Trace every", "int", "steps; 0 = never"),
    ("sft", "SFT warm-start", "sft", "auto = on for builtin:tiny"),
]
SFT_CHOICES = ["auto", "on", "off"]


def warm_start_hint(model: str | None, section: Any) -> str:
    """The warm-start switch's help, for the model actually picked: what `auto` does for it and what the loaded
    config sets."""
    model = str(model or "builtin:tiny")
    scratch = model.startswith("builtin:")
    enabled = section.get("enabled") if isinstance(section, dict) else section
    setting = {True: "on", False: "off"}.get(enabled, "auto")
    why = "trained from scratch, it must learn tool calls first" if scratch else "pretrained"
    steps = section.get("max_steps") if isinstance(section, dict) else None
    size = f", {steps} steps" if isinstance(steps, int) and steps > 0 and setting != "off" else ""
    return f"auto = {'on' if scratch else 'off'} for {model} ({why}); this config: {setting}{size}"


def form_fields() -> list[tuple[str, str, str, str]]:
    """FORM_FIELDS that TrainConfig actually has (so the form never sends a field it does not know)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return [f for f in FORM_FIELDS if f[0] in known]


def form_to_config_values(fields, values) -> dict[str, Any]:
    """Form widget values → TrainConfig keyword values (raises ConfigInvalid naming the field)."""
    out: dict[str, Any] = {}
    for (name, label, kind, _), value in zip(fields, values):
        if kind == "int":
            if value is None or value == "":
                raise ConfigInvalid(f"{label} needs a whole number", name)
            if float(value) != int(value):
                raise ConfigInvalid(f"{label} must be a whole number (got {value})", name)
            value = int(value)
        elif kind == "lr":
            text = str(value or "").strip()
            if not text or text.lower() == "auto":
                value = None
            else:
                try:
                    value = float(text)
                except ValueError:
                    raise ConfigInvalid(f"{label} must be a number like 5e-5, or empty for auto (got {text!r})",
                                        name) from None
        elif kind == "sft":
            value = {"on": True, "off": False}.get(value)
        elif isinstance(value, str):
            value = value.strip()
        out[name] = value
    return out


# Fields the app decides itself: the advanced box cannot set them.
APP_OWNED_FIELDS = ("output_dir", "run_id", "data_dir")
ADVANCED_PLACEHOLDER = '{"grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"}, "save_steps": 5}'


def advanced_form(defaults: dict[str, Any]) -> list[Any]:
    """The form's LoRA fields and its "Advanced (JSON)" box, in a closed accordion: [use LoRA, r, alpha, JSON].

    The JSON is an object of any other TrainConfig field — `grpo` (any GRPOConfig field), `sft` (the warm start's section), `report_to`,
    `save_steps`, ... — checked by TrainConfig like the rest of the form (see `advanced_values`)."""
    lora = defaults.get("lora") or {}
    with gr.Accordion("LoRA and advanced settings", open=False, elem_id="cfg-advanced-box"):
        with gr.Row():
            use_lora = gr.Checkbox(value=bool(lora), label="Train a LoRA adapter", elem_id="cfg-lora",
                                   info="instead of every weight; final/ holds the adapter")
            rank = gr.Number(value=lora.get("r", 16), precision=0, label="LoRA r", elem_id="cfg-lora-r", min_width=90)
            alpha = gr.Number(value=lora.get("alpha", 32), label="LoRA alpha", elem_id="cfg-lora-alpha", min_width=90)
        advanced = gr.Code(value="", language="json", label="Advanced (JSON): any other TrainConfig field",
                           elem_id="cfg-advanced", lines=3, max_lines=12, interactive=True)
        gr.Markdown(f"e.g. `{ADVANCED_PLACEHOLDER}` — see `training/config/train_config.py`.", elem_classes=["sqe-muted"])
    return [use_lora, rank, alpha, advanced]


def advanced_values(use_lora: bool, rank: Any, alpha: Any, text: str | None) -> dict[str, Any]:
    """The advanced widgets' values as TrainConfig fields (raises ConfigInvalid naming the field)."""
    values: dict[str, Any] = {}
    text = (text or "").strip()
    if text:
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigInvalid(f"Advanced (JSON) is not valid JSON: {exc}", "advanced") from None
        if not isinstance(parsed, dict):
            raise ConfigInvalid("Advanced (JSON) must be an object of TrainConfig fields, e.g. "
                                f"{ADVANCED_PLACEHOLDER}", "advanced")
        owned = [k for k in parsed if k in APP_OWNED_FIELDS]
        if owned:
            raise ConfigInvalid(f"Advanced (JSON) cannot set {', '.join(owned)}: the app decides it", owned[0])
        values.update(parsed)
    if use_lora:
        if rank is None or float(rank) != int(rank) or int(rank) < 1:
            raise ConfigInvalid(f"LoRA r must be a whole number >= 1 (got {rank})", "lora")
        values["lora"] = {**(values.get("lora") or {}), "r": int(rank), "alpha": float(alpha or 2 * int(rank))}
    return values


def start_values(base_file: Path | None, form: dict[str, Any], advanced: dict[str, Any],
                 data_root: Path | None = None) -> dict[str, Any]:
    """The TrainConfig values Start sends to `build_config`.

    Args:
        base_file: the config under the form (`picked_config`; None: TrainConfig's defaults and
            configs/tiny_cpu.json): every field the form does not show keeps its value (TrainConfig fields only;
            `output_dir` and `run_id` are the app's).
        form: the form's fields (`form_to_config_values`); the warm-start radio switches the config's `sft` section
            on or off and keeps its other settings.
        advanced: the LoRA fields and the JSON box (`advanced_values`), applied last.
        data_root: the app's data folder (`--data-dir`), the one its dataset list comes from.
    """
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    base = {k: v for k, v in default_values(base_file).items() if k in known}
    base.pop("output_dir", None)
    base.pop("run_id", None)
    # Datasets are listed from the app's data folder (--data-dir): validate and train from the same one.
    base["data_dir"] = str(data_root) if data_root is not None else None
    form = dict(form)
    if "sft" in form:
        section = base.get("sft")
        form["sft"] = {**(section if isinstance(section, dict) else {}), "enabled": form["sft"]}
    base.update(form)
    base.update(advanced)
    return base


def form_message(kind: str, text: str) -> str:
    cls = "sqe-ok-box" if kind == "ok" else "sqe-err-box"
    return f'<div class="{cls}" id="train-form-message" data-kind="{kind}">{text}</div>'


#: The form's rows, top to bottom; the fields of one row share a line.
LAYOUT = [("model",), ("dataset",), ("train_split", "eval_split"), ("num_generations", "step_budget"),
          ("max_steps", "learning_rate"), ("eval_every", "trace_every"), ("sft",)]


@dataclass
class TrainForm:
    """The form's components (`build_form`).

    Args:
        fields: the `FORM_FIELDS` shown (`form_fields`), in order.
        inputs: one component per field, in `fields` order.
        advanced: the LoRA fields and the JSON box (`advanced_form`): [use LoRA, r, alpha, JSON].
        cost: what the form's config cost when measured (`#train-cost`, under the model), or None without a model
            field.
        start_btn, stop_btn: Start training (`#train-start`) and Stop (`#train-stop`).
        message: the form's answer to Start and Stop (`#train-message`, holding `form_message`).
    """

    fields: list[tuple[str, str, str, str]]
    inputs: list[Any]
    advanced: list[Any]
    cost: Any
    start_btn: Any
    stop_btn: Any
    message: Any

    def input(self, kind: str) -> Any:
        """The component of the first field of `kind` ("model", "dataset"), or None when the form has none."""
        return next((c for c, f in zip(self.inputs, self.fields) if f[2] == kind), None)

    def label(self, name: str | None) -> str | None:
        """The label the form shows for field `name` (the name itself for a field it does not show)."""
        return {f[0]: f[1] for f in self.fields}.get(name or "", name)

    def marks(self, bad: str | None = None) -> list:
        """Outline the offending field in red (and clear the outline on the others): one update per input."""
        return [gr.update(elem_classes=["sqe-invalid"] if f[0] == bad else []) for f in self.fields]

    def config_values(self, ctx: AppContext, values: list[Any]) -> dict[str, Any]:
        """The TrainConfig values Start sends, from `values` (the components' values: `inputs`, then `advanced`)
        over the config picking the form's model loads (else the app's own). Raises ConfigInvalid naming the field."""
        values, extra = values[:len(self.fields)], values[len(self.fields):]
        form = form_to_config_values(self.fields, values)
        model = form.get("model")
        base = picked_config(model, has_gpu(), ctx.data_root, ctx.default_config) or ctx.default_config
        return start_values(base, form, advanced_values(*extra), ctx.data_root)

    def wire_fill(self, ctx: AppContext) -> None:
        """Picking a model fills the form with that model's config (and its cost line); picking a dataset lists its
        splits. Owner-only, like the rest of the form."""
        model_input = self.input("model")
        if model_input is not None:
            def on_model(model):
                """Fill the form with the picked model's config (a typed name with no config changes nothing else)."""
                config_file = picked_config(model, has_gpu(), ctx.data_root, ctx.default_config)
                if config_file is None:
                    return [gr.skip() for _ in self.inputs] + [gr.skip()]
                values = default_values(config_file)
                updates = []
                for (name, _, kind, _), component in zip(self.fields, self.inputs):
                    if component is model_input or name not in values:
                        updates.append(gr.skip())
                    elif kind == "lr":
                        updates.append(gr.update(value="" if values[name] is None else str(values[name])))
                    elif kind == "sft":  # the section's switch, and its help for this model
                        value = values[name].get("enabled") if isinstance(values[name], dict) else values[name]
                        updates.append(gr.update(value={True: "on", False: "off"}.get(value, "auto"),
                                                 info=warm_start_hint(model, values[name])))
                    else:
                        updates.append(gr.update(value=values[name]))
                return [*updates, cost_html(config_file, model=model)]

            # `change`, not `input`: once the list has been opened and closed without a pick, Gradio (6.31) sends the
            # next pick's `input` event with the value before it (the form then refilled the old model's config);
            # `change` carries the new one. Nothing else sets this field's value, so `change` fires on the user's
            # picks only.
            ctx.owner.owner_event(model_input.change, on_model, inputs=[model_input], outputs=[*self.inputs, self.cost],
                                  show_progress="hidden", action="fill the training form")

        dataset_input = self.input("dataset")
        split_inputs = [c for c, f in zip(self.inputs, self.fields) if f[2] == "split"]
        if dataset_input is not None and split_inputs:
            def on_dataset(name):
                found, _ = dataset_splits(name, ctx.data_root)
                return [gr.update(choices=found) for _ in split_inputs]

            ctx.owner.owner_event(dataset_input.change, on_dataset, inputs=[dataset_input], outputs=split_inputs,
                                  show_progress="hidden", action="fill the training form")


def build_form(ctx: AppContext) -> TrainForm:
    """The form's column content, filled with the app's config (`ctx.default_config`, else configs/tiny_cpu.json)."""
    defaults = default_values(ctx.default_config)
    fields = form_fields()
    datasets = dataset_choices(ctx.data_root)
    default_dataset = str(defaults.get("dataset", "builtin"))
    splits, _ = dataset_splits(default_dataset, ctx.data_root)

    def widget(name, label, kind, info):
        value = defaults.get(name)
        common = {"label": label, "info": info or None, "elem_id": f"cfg-{name}", "min_width": 120}
        if kind == "model":
            common["info"] = model_help(data_root=ctx.data_root)
            return gr.Dropdown(model_choices(data_root=ctx.data_root), value=value or "builtin:tiny",
                               allow_custom_value=True, **common)
        if kind == "dataset":
            return gr.Dropdown(datasets, value=default_dataset, allow_custom_value=True, **common)
        if kind == "split":
            choices = splits or ([value] if value else [])
            return gr.Dropdown(choices, value=value, allow_custom_value=True, **common)
        if kind == "int":
            return gr.Number(value=value, precision=0, **common)
        if kind == "lr":
            return gr.Textbox(value="" if value is None else str(value), placeholder="auto", **common)
        if kind == "sft":  # the warm start's switch (`sft.enabled`); the rest of its section comes from the config
            common["info"] = warm_start_hint(defaults.get("model"), value)
            if isinstance(value, dict):
                value = value.get("enabled")
            return gr.Radio(SFT_CHOICES, value={True: "on", False: "off"}.get(value, "auto"), **common)
        return gr.Textbox(value=value, **common)

    gr.Markdown("### Configuration")
    by_name = {f[0]: f for f in fields}
    widgets: dict[str, Any] = {}
    cost = None
    with gr.Group():
        for row in LAYOUT:
            present = [n for n in row if n in by_name]
            if not present:
                continue
            with gr.Row():
                for n in present:
                    widgets[n] = widget(*by_name[n])
            if row == ("model",):  # which config the form holds, and what it cost when measured
                cost = gr.HTML(cost_html(ctx.default_config or DEFAULT_CONFIG_FILE), elem_id="train-cost")
    inputs = [widgets[f[0]] for f in fields]
    advanced = advanced_form(defaults)
    with gr.Row():
        start_btn = gr.Button("Start training", variant="primary", elem_id="train-start")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="train-stop")
    message = gr.HTML("", elem_id="train-message")
    return TrainForm(fields, inputs, advanced, cost, start_btn, stop_btn, message)
