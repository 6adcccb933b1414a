"""Train tab: the config form, Start/Stop, live status, charts and the latest trace.

The page holds no training state: every poll asks the runner which run is current and reads that run's
directory, so a reload or a second browser shows the same live run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import time
from pathlib import Path
from typing import Any

import gradio as gr

from dashboard import charts
from dashboard.context import AppContext, dataset_choices, dataset_splits
from dashboard.config_costs import cost_html
from dashboard.model_picker import DEFAULT_CONFIG_FILE, default_values, model_choices, model_help, picked_config
from dashboard.gpu import has_gpu, readout_html
from dashboard.live_plot import LivePlot, live_value
from dashboard.run_data import RunSnapshot, fmt_duration, progress
from dashboard.runner import ConfigInvalid, RunnerBusy, build_config
from dashboard.transcripts import transcript_html

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
# While a page long-polls, how often it also re-checks the run's files (news normally comes from the runner).
FILE_CHECK_S = 0.5
# The least time between two updates of one page while a run trains fast (see poll).
MIN_UPDATE_S = 1.2


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
    try:
        from training.config import TrainConfig

        known = {f.name for f in dataclasses.fields(TrainConfig)}
    except Exception:
        return FORM_FIELDS
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
        gr.Markdown(f"e.g. `{ADVANCED_PLACEHOLDER}` — see `training/config.py`.", elem_classes=["sqe-muted"])
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
    base = default_values(base_file)
    try:
        from training.config import TrainConfig

        known = {f.name for f in dataclasses.fields(TrainConfig)}
        base = {k: v for k, v in base.items() if k in known}
    except Exception:
        pass
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


#: What the status bar calls each `phase` of status.json (training.phases; "saving" ends GRPO).
PHASE_LABELS = {"queued": "queued", "starting": "starting", "loading model": "loading the model",
                "zero-shot eval": "zero-shot eval", "sft": "warm start (SFT)", "base eval": "base eval",
                "grpo": "GRPO", "saving": "saving the model", "comparison": "final eval", "done": "done"}
ENDED = ("completed", "stopped", "failed", "interrupted")


def planned_phases(status: dict[str, Any] | None, current: str | None = None) -> list[tuple[str, str]]:
    """(status.json phase, label) of the phases the run plays, in order, as the run recorded its plan
    (`phases` in status.json, written by `training.phases.planned_phases` when it starts; none before, nor in runs
    older than it); the `current` phase is always among them (a run whose plan reads otherwise still shows where
    it is)."""
    from dashboard.config_costs import PHASE_ORDER

    recorded = (status or {}).get("phases")
    phases = []
    for phase in recorded if isinstance(recorded, list) else []:
        if isinstance(phase, dict) and "name" in phase and "label" in phase:
            phases.append((str(phase["name"]), str(phase["label"])))
    if current in PHASE_ORDER and current != "saving" and current not in dict(phases):
        order = PHASE_ORDER.index(current)
        at = next((i for i, (name, _) in enumerate(phases)
                   if name in PHASE_ORDER and PHASE_ORDER.index(name) > order), len(phases))
        phases.insert(at, (current, PHASE_LABELS[current]))
    return phases


def phase_slot(phase: Any) -> Any:
    """The planned phase a status.json `phase` belongs to: saving the model closes GRPO."""
    return "grpo" if phase == "saving" else phase


def ended_in(status: dict[str, Any], names: list[str]) -> str | None:
    """The phase a run that did not complete (stopped, failed, interrupted) ended in: the one its status.json still
    names, else (a stopped or failed run says "done" / "failed") the last of `names` that left a start stamp."""
    phase = phase_slot(status.get("phase"))
    if phase in names:
        return phase
    stamps = {"sft": "sft_started_at", "grpo": "grpo_started_at"}
    started = [name for name in names if name in stamps and status.get(stamps[name])]
    return started[-1] if started else (names[0] if names else None)


def phase_strip_html(phases: list[tuple[str, str]], status: dict[str, Any], state: str) -> str:
    """The run's phases in a row (`#train-phases`, each phase a `[data-phase]` span whose `data-state` is done /
    current / ended / todo): those done ticked, the one running in bold; a run that did not complete marks the
    phase it ended in ("stopped", "failed") and leaves the later ones unticked."""
    names = [name for name, _ in phases]
    current = str(status.get("phase") or "")
    if state == "completed":
        at = len(names)
    elif state in ENDED:
        at = names.index(ended_in(status, names)) if names else -1
    else:
        slot = phase_slot(current)
        at = names.index(slot) if slot in names else -1
    # A run stopped in GRPO still plays its (short) final eval.
    final_after_stop = state == "stopped" and 0 <= at < len(names) and names[at] == "grpo"
    styles = {"done": "color:#64748b", "current": "font-weight:600;color:#4338ca", "todo": "color:#94a3b8",
              "ended": "font-weight:600;color:#b45309"}
    spans = []
    for i, (name, label) in enumerate(phases):
        if i < at or (final_after_stop and name == "comparison"):
            which, text = "done", f"✓ {label}"
        elif i == at:
            which, text = ("ended", f"{label}: {state}") if state in ENDED else ("current", label)
        else:
            which, text = "todo", label
        spans.append(f'<span class="sqe-phase" data-phase="{html.escape(name)}" data-state="{which}" '
                     f'style="{styles[which]}">{html.escape(text)}</span>')
    return f'<div id="train-phases" class="sqe-phases" style="font-size:0.9em">{" › ".join(spans)}</div>' if spans else ""


def remaining_text(snap: RunSnapshot, phases: list[tuple[str, str]], now: float | None = None) -> str:
    """The status bar's remaining time: the whole run's when this config's phases were measured, else what the
    current phase has left at its own pace and how many phases come after it (their time is not known yet)."""
    from dashboard.config_costs import remaining_parts
    from dashboard.run_data import parse_time

    status, state = snap.status, snap.state
    if state in ("stopped", "failed", "interrupted"):
        return "— (ended)"
    if state == "completed":
        return "0m 00s (done)"
    phase = str(status.get("phase") or "")
    started = parse_time(status.get("phase_started_at")) or parse_time(
        status.get({"sft": "sft_started_at", "grpo": "grpo_started_at"}.get(phase, "")))
    clock = dt.datetime.fromtimestamp(now) if now is not None else dt.datetime.now()
    in_phase = (clock - started).total_seconds() if started else None
    parts = remaining_parts(status, snap.config, in_phase)
    if parts is None:  # queued or starting: the first phase has not begun
        return "estimating once the run starts…"
    names = [name for name, _ in phases]
    slot = phase_slot(phase)
    later = len(names) - names.index(slot) - 1 if slot in names else 0
    # The phases themselves are listed just above (the phase strip): count them, do not repeat them.
    more = f"then {later} more phase{'s' if later != 1 else ''}" if later else ""
    if parts["current"] is None:
        if phase in ("sft", "grpo"):
            return "estimating from this phase's first steps…"
        return f"not timed for this config (this phase{', ' + more if more else ''})"
    if parts["measured"]:
        return f"{fmt_duration(parts['current'] + parts['later'])} (this phase {fmt_duration(parts['current'])})"
    if not later:
        return fmt_duration(parts["current"])
    return f"{fmt_duration(parts['current'])} in this phase, {more} not timed for this config"


def status_html(snap: RunSnapshot | None, note: str | None, runner_error: str | None = None) -> str:
    """The status bar: the run, its phases (`phase_strip_html`), the current phase's progress and the remaining
    time (`remaining_text`). Its data-* attributes expose the run, its status and phase and the newest plotted
    step, which the browser tests and the latency benchmark read."""
    if snap is None:
        body = f'<span class="sqe-muted">{html.escape(note or "No run yet: set the config and press Start.")}</span>'
        return f'<div id="train-status" class="sqe-card sqe-status" data-run="" data-status="none" data-step="">{body}</div>'
    status = snap.status
    state = snap.state
    p = progress(status, config=snap.config)
    # The newest plotted point: the step of the phase that logged last (SFT steps, then GRPO steps).
    latest_phase = next((r.get("phase", "grpo") for r in reversed(snap.metrics) if isinstance(r, dict)), None)
    plotted = charts.last_step(snap.metrics, latest_phase) if latest_phase else None
    kind = {"running": "ok", "completed": "ok", "queued": "warn", "stopped": "warn"}.get(state, "bad")
    total = p["total"] if p["total"] is not None else "?"
    phase = str(status.get("phase") or "")
    phases = planned_phases(status, phase)
    labels = dict(phases)
    names = [name for name, _ in phases]
    # The bar and the line under it follow the phase that runs: its own steps where it has them.
    pct = 0.0
    if phase == "sft" and isinstance(status.get("phase_step"), int) and isinstance(status.get("phase_total"), int):
        pct = 100.0 * status["phase_step"] / max(1, status["phase_total"])
        doing = f'warm start (SFT) step <b>{status["phase_step"]} / {status["phase_total"]}</b>, then {total} GRPO steps'
    elif phase in ("grpo", "saving"):
        pct = 100.0 * p["step"] / p["total"] if p["total"] else 0.0
        doing = f'GRPO step <b>{p["step"]} / {total}</b>' + (" · saving the model" if phase == "saving" else "")
    elif phase in labels:
        doing = f"<b>{html.escape(labels[phase])}</b>"
    else:
        doing = f"<b>{html.escape(PHASE_LABELS.get(phase, phase or state))}</b>"
    slot = phase_slot(phase)
    if slot in names and state not in ENDED:
        doing += f" (phase {names.index(slot) + 1} of {len(names)})"
    if state == "completed":
        pct = 100.0
        doing = f'GRPO step <b>{p["step"]} / {total}</b>'
    elif state in ENDED:  # say where it ended, not what it was doing
        where = ended_in(status, names)
        doing = f'{html.escape(state)} in <b>{html.escape(labels.get(where, where or "?"))}</b>'
        if where == "grpo":
            doing += f' at GRPO step <b>{p["step"]} / {total}</b>'
    error = status.get("error") or (runner_error if state == "failed" else None)
    err = f'<div class="sqe-err-box">{html.escape(str(error))}</div>' if error else ""
    # While a run trains on a GPU: its memory and the device's utilisation, from its heartbeat (nothing on CPU).
    gpu = readout_html(status.get("gpu")) if state == "running" else ""
    config = snap.config or {}
    parts = (config.get("model") or status.get("model"), config.get("dataset") or status.get("dataset"))
    return (
        f'<div id="train-status" class="sqe-card sqe-status" data-run="{html.escape(snap.run_id)}" '
        f'data-status="{html.escape(state)}" data-step="{p["step"]}" data-phase="{html.escape(str(status.get("phase", "")))}" '
        f'data-plotted-step="{plotted if plotted is not None else ""}" '
        f'data-plotted-phase="{html.escape(str(latest_phase or ""))}">'
        f'<div><b>{html.escape(snap.run_id)}</b> <span class="sqe-badge sqe-{kind}">{html.escape(state)}</span> '
        f'<span class="sqe-muted">{html.escape(" · ".join(str(v) for v in parts if v))}</span></div>'
        f"{phase_strip_html(phases, status, state)}"
        f'<div class="sqe-progress"><div style="width:{pct:.1f}%"></div></div>'
        f'<div class="sqe-progress-text" id="train-progress-text">{doing} · elapsed {fmt_duration(p["elapsed"])}'
        f' · remaining {remaining_text(snap, phases)}</div>'
        f"{gpu}{err}</div>"
    )


def form_message(kind: str, text: str) -> str:
    cls = "sqe-ok-box" if kind == "ok" else "sqe-err-box"
    return f'<div class="{cls}" id="train-form-message" data-kind="{kind}">{text}</div>'


def build(ctx: AppContext) -> dict[str, Any]:
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

    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=330):
            gr.Markdown("### Configuration")
            by_name = {f[0]: f for f in fields}
            widgets: dict[str, Any] = {}
            layout = [("model",), ("dataset",), ("train_split", "eval_split"), ("num_generations", "step_budget"),
                      ("max_steps", "learning_rate"), ("eval_every", "trace_every"), ("sft",)]
            with gr.Group():
                for row in layout:
                    present = [n for n in row if n in by_name]
                    if not present:
                        continue
                    with gr.Row():
                        for n in present:
                            widgets[n] = widget(*by_name[n])
                    if row == ("model",):  # which config the form holds, and what it cost when measured
                        cost = gr.HTML(cost_html(ctx.default_config or DEFAULT_CONFIG_FILE), elem_id="train-cost")
            inputs = [widgets[f[0]] for f in fields]
            advanced_inputs = advanced_form(defaults)
            with gr.Row():
                start_btn = gr.Button("Start training", variant="primary", elem_id="train-start")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="train-stop")
            message = gr.HTML("", elem_id="train-message")
        with gr.Column(scale=3):
            status = gr.HTML(status_html(None, None), elem_id="train-status-box")
            with gr.Row():
                reward_plot = LivePlot(charts.reward_figure([]), elem_id="chart-reward")
                success_plot = LivePlot(charts.success_figure([]), elem_id="chart-success")
            with gr.Row():
                health_plot = LivePlot(charts.tool_health_figure([]), elem_id="chart-health")
            gr.Markdown("### Latest trace")
            trace = gr.HTML('<div class="sqe-muted">No trace yet.</div>', elem_id="train-trace")
    seen = gr.State(None)  # per session: (run id, file signature) last sent to this page
    timer = gr.Timer(ctx.poll_seconds)

    split_inputs = [c for c, f in zip(inputs, fields) if f[2] == "split"]
    dataset_input = next((c for c, f in zip(inputs, fields) if f[2] == "dataset"), None)

    nothing = (gr.skip(),) * 6  # send nothing (a poll then costs the browser no work)

    def refresh(last_seen, probe: bool = False):
        """What this page lacks, given `last_seen` (the key of what it was last sent).

        With `probe` True it only says whether the page has news (a run started or gone, a record written, the
        status changing; the status bar's clock does not count) and builds nothing: the long poll asks this
        every FILE_CHECK_S, and the refresh chained after it builds the update once."""
        runner = ctx.runner
        run_id = runner.current_run_id
        if run_id is None:
            # Nothing started in this process (the Runs tab shows older runs).
            if last_seen == "none":
                return False if probe else nothing
            return True if probe else (status_html(None, None), gr.skip(), gr.skip(), gr.skip(), gr.skip(), "none")
        snap, err = ctx.runs.try_snapshot(run_id)
        if snap is None and runner.is_running and runner.active_run_id == run_id:
            # Started a moment ago: training has not written its directory yet.
            snap = RunSnapshot(run_id, {"status": "queued", "phase": "starting"}, None, None)
        if snap is None:
            return True if probe else (status_html(None, err), gr.skip(), gr.skip(), gr.skip(), gr.skip(), None)
        # Send only what changed since this page's last poll (per file: metrics, evals, transcripts): every
        # chart sent is redrawn by the browser, on the same cores as the training.
        sig = snap.signature
        key = {"run": snap.run_id, "status": sig[0:2], "metrics": sig[2:3], "evals": sig[3:4],
               "transcripts": sig[4:5]}
        old = last_seen if isinstance(last_seen, dict) and last_seen.get("run") == snap.run_id else {}

        def changed(part: str) -> bool:
            return old.get(part) != key[part]

        same_data = not any(changed(part) for part in key)
        if probe:
            return not same_data
        bar = status_html(snap, None, runner.last_error)
        key["bar"] = bar
        if same_data and not changed("bar"):
            return nothing
        metrics_changed = changed("metrics")
        trace_value = gr.skip()
        if changed("transcripts"):
            latest = snap.latest_transcript
            trace_value = (
                transcript_html(latest["transcript"], title=f"Trace at step {latest.get('step', '?')}")
                if latest else '<div class="sqe-muted">No trace yet (one is played every trace_every steps).</div>'
            )
        return (
            bar if changed("bar") else gr.skip(),
            live_value(charts.reward_figure(snap.metrics, t0=snap.t0)) if metrics_changed else gr.skip(),
            # Greedy eval success only: the rollouts' sampled correctness is already live in the reward chart
            # (its correctness component), and leaving it out redraws this chart per eval, not per step.
            live_value(charts.success_figure(snap.evals, t0=snap.t0)) if changed("evals") else gr.skip(),
            live_value(charts.tool_health_figure(snap.metrics, t0=snap.t0)) if metrics_changed else gr.skip(),
            trace_value,
            {**key, "sent_at": time.monotonic()},
        )

    def poll(last_seen) -> None:
        """A long poll: return as soon as the run has news (the runner wakes us when training writes a
        record; the run's files are also checked every FILE_CHECK_S), else after `ctx.long_poll_seconds`
        (the status bar's clock). It has no outputs: a pending event's outputs each run a per-frame timer in
        the browser's status tracker, so the waiting event must have none. The short `refresh` chained after
        it sends the update. A page watching a run then costs the browser one update per logged step (one
        every few seconds when idle) instead of one per tick."""
        deadline = time.monotonic() + ctx.long_poll_seconds
        while True:
            count = ctx.runner.news_count
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if refresh(last_seen, probe=True):
                # Several steps a second would each redraw every chart: send at most one update per
                # MIN_UPDATE_S (news waits at most that long, keeping "logged -> plotted" under 2 s).
                sent_at = last_seen.get("sent_at", 0.0) if isinstance(last_seen, dict) else 0.0
                time.sleep(max(0.0, min(sent_at + MIN_UPDATE_S - time.monotonic(), MIN_UPDATE_S)))
                return
            ctx.runner.wait_for_news(count, min(left, FILE_CHECK_S))

    outputs = [status, reward_plot, success_plot, health_plot, trace, seen]

    names = [f[0] for f in fields]

    def marks(bad: str | None = None) -> list:
        """Outline the offending field in red (and clear the outline on the others)."""
        return [gr.update(elem_classes=["sqe-invalid"] if n == bad else []) for n in names]

    def base_config_file(model: str | None) -> Path | None:
        """The config under the form: the one picking `model` loads, else (a typed name) the app's own."""
        return picked_config(model, has_gpu(), ctx.data_root, ctx.default_config) or ctx.default_config

    def start(*args):
        *values, last_seen = args
        values, extra = values[:len(fields)], values[len(fields):]
        try:
            form = form_to_config_values(fields, values)
            base = base_config_file(form.get("model"))
            config = build_config(start_values(base, form, advanced_values(*extra), ctx.data_root))
        except ConfigInvalid as exc:
            label = dict((f[0], f[1]) for f in fields).get(exc.field or "", exc.field)
            where = f"<b>{html.escape(str(label))}</b> (<code>{html.escape(exc.field)}</code>): " if exc.field else ""
            return (form_message("error", f"Invalid config — {where}{html.escape(str(exc))}"), *refresh(None),
                    *marks(exc.field))
        except Exception as exc:  # training package missing or broken
            return (form_message("error", f"Cannot build the config: {html.escape(str(exc))}"), *refresh(None),
                    *marks())
        try:
            run_id = ctx.runner.start(config)
        except RunnerBusy as exc:
            return (form_message("error", html.escape(str(exc))), *refresh(last_seen), *marks())
        return (form_message("ok", f"Started <b>{html.escape(run_id)}</b>."), *refresh(None), *marks())

    def stop(last_seen):
        return (form_message("ok", html.escape(ctx.runner.stop())), *refresh(last_seen))

    # Owner-only (dashboard.access): the server checks the caller on every call; visitors see them greyed out.
    owner = ctx.owner
    owner.control(start_btn, stop_btn, *inputs, *advanced_inputs)
    owner.owner_event(start_btn.click, start, inputs=[*inputs, *advanced_inputs, seen],
                      outputs=[message, *outputs, *inputs], show_progress="hidden", action="start training")
    owner.owner_event(stop_btn.click, stop, inputs=[seen], outputs=[message, *outputs], show_progress="hidden",
                      action="stop training")
    # Ticks while a poll is still waiting are skipped (trigger mode "once"), so a page holds one poll at a time.
    timer.tick(poll, inputs=[seen], outputs=None, show_progress="hidden", queue=False).then(
        refresh, inputs=[seen], outputs=outputs, show_progress="hidden", queue=False)

    model_input = next((c for c, f in zip(inputs, fields) if f[2] == "model"), None)
    if model_input is not None:
        def on_model(model):
            """Fill the form with the picked model's config (a typed name with no config changes nothing else)."""
            config_file = picked_config(model, has_gpu(), ctx.data_root, ctx.default_config)
            if config_file is None:
                return [gr.skip() for _ in inputs] + [gr.skip()]
            values = default_values(config_file)
            updates = []
            for (name, _, kind, _), component in zip(fields, inputs):
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

        # `change`, not `input`: once the list has been opened and closed without a pick, Gradio (6.31) sends the next
        # pick's `input` event with the value before it (the form then refilled the old model's config); `change`
        # carries the new one. Nothing else sets this field's value, so `change` fires on the user's picks only.
        owner.owner_event(model_input.change, on_model, inputs=[model_input], outputs=[*inputs, cost],
                          show_progress="hidden", action="fill the training form")

    if dataset_input is not None and split_inputs:
        def on_dataset(name):
            found, _ = dataset_splits(name, ctx.data_root)
            return [gr.update(choices=found) for _ in split_inputs]

        owner.owner_event(dataset_input.change, on_dataset, inputs=[dataset_input], outputs=split_inputs,
                          show_progress="hidden", action="fill the training form")

    return {"load": (refresh, [seen], outputs)}
