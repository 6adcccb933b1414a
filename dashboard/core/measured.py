"""What a config reaches and costs, as measured, and how long a run has left: the Train tab's cost line and
remaining time.

`configs/measured.json` holds, per config file, what one run of it reached and cost on a named machine: eval
success at each stage (random policy, zero-shot, warm start, after GRPO) on how many eval questions, minutes all-in,
peak memory, disk written, seconds per phase, the steps and eval episodes it ran, the command that measured it, a
digest of the config's content, and the machine's load before and during the run (`shared`: other work shared the
cores, so the minutes are longer than a newcomer's idle machine gives; the cost line says so). The bench that
measured a config writes its entry (`record`): `python bench/learning/learning_curve.py --record` for the default run
(configs/tiny_cpu.json), `python bench/learning/real_model.py --config configs/X.json --record` for any config; both
refuse to start while other work loads the machine, unless told `--shared`. The picker shows it before Start, and says
so when the config changed since (its digest differs); a running run's remaining time is its current phase at its own
pace, then the phases still to come at the measured pace of the config measured for the same model and dataset
(scaled by steps and episodes), so the warm start and the evals are counted, not only GRPO.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["MEASURED_FILE", "STAGES", "measured", "config_digest", "record", "reached_text", "shared", "cost_html",
           "remaining_seconds", "remaining_parts", "PHASE_ORDER"]

MEASURED_FILE = Path(__file__).resolve().parent.parent / "configs" / "measured.json"

#: The phases of a run in the order they run (`training.phases`), as status.json names them.
PHASE_ORDER = ["loading model", "zero-shot eval", "sft", "base eval", "grpo", "saving", "comparison"]

#: An entry's `success` keys in the order a run reaches them, with the cost line's words. A model trained from
#: random weights plays no zero-shot eval (it is 0% by construction): its line starts at the random policy.
STAGES = [("random", "random policy"), ("zero_shot", "zero-shot"), ("warm_start", "warm start"),
          ("after_grpo", "after GRPO")]


def measured(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """config file name -> its measurement (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(Path(path or MEASURED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def config_digest(config_file: Path | str) -> str | None:
    """A short SHA-256 of a config file's JSON content (keys sorted, whitespace dropped, so re-indenting the file
    keeps it), or None when the file is missing or not JSON. A measurement stores the digest of the config it ran;
    the cost line compares it with the file as it is now."""
    try:
        content = json.loads(Path(config_file).read_text())
    except (OSError, ValueError):
        return None
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def record(config_file: Path | str, entry: dict[str, Any], digest: str | None = None, path: Path | None = None) -> Path:
    """Keep a bench's measurement of `config_file` in `configs/measured.json` under the file's name, with the
    digest of the config it ran (`config_sha256`) and today's date; other configs' entries are kept.

    Args:
        config_file: a config under `configs/` (the picker looks entries up by file name in that folder).
        entry: the figures (see the module docstring), including `command`, the command line that measured them.
        digest: `config_digest` of the file when the run started (default: as it is now; a bench passes the one it
            took before training, so an edit during the run is not credited with its figures).
        path: the table to write (default `MEASURED_FILE`; tests pass their own).
    """
    from training.run.directory import atomic_write_json

    config_file = Path(config_file)
    path = Path(path or MEASURED_FILE)
    table = measured(path)
    table[config_file.name] = {**entry, "config_sha256": digest or config_digest(config_file),
                               "date": datetime.date.today().isoformat()}
    atomic_write_json(path, table)
    return path


def _percent(value: Any) -> str:
    """73.5% on 200 questions, 43% on 100: one decimal where the share has one."""
    if not isinstance(value, (int, float)):
        return "?"
    return f"{100 * value:.1f}".rstrip("0").rstrip(".") + "%"


def reached_text(entry: dict[str, Any]) -> str:
    """What a measured run reached, stage by stage: "zero-shot 0% → warm start 43% → after GRPO 43% on 100 eval
    questions" (the random policy stands first only where no zero-shot eval was played; EX after GRPO, and the eval
    questions GRPO fixed and broke against the warm start, when measured)."""
    success = entry.get("success") if isinstance(entry.get("success"), dict) else {}
    stages = [(key, words) for key, words in STAGES if isinstance(success.get(key), (int, float))]
    if any(key == "zero_shot" for key, _ in stages):
        stages = [(key, words) for key, words in stages if key != "random"]
    if not stages:
        return ""
    text = " → ".join(f"{words} {_percent(success[key])}" for key, words in stages)
    ex = (entry.get("execution_accuracy") or {}).get("after_grpo") if isinstance(
        entry.get("execution_accuracy"), dict) else None
    if isinstance(ex, (int, float)) and stages[-1][0] == "after_grpo":
        text += f" (EX {_percent(ex)})"
    fixed, broken = entry.get("fixed"), entry.get("broken")
    if isinstance(fixed, int) and isinstance(broken, int) and stages[-1][0] == "after_grpo":
        text += f", {fixed} fixed / {broken} broken"
    n = entry.get("comparison_episodes")
    return f"<b>{html.escape(text)}</b>" + (f" on {n} eval questions" if isinstance(n, int) else "")


def shared(entry: dict[str, Any]) -> bool:
    """Whether other work shared the cores while the entry was measured: its `shared` flag (benches since `--record`
    noted the load), else for older entries a mean 1-minute load above the cores."""
    if isinstance(entry.get("shared"), bool):
        return entry["shared"]
    load, cores = entry.get("mean_load"), _cores(entry)
    return isinstance(load, (int, float)) and cores is not None and load > cores


def _cores(entry: dict[str, Any]) -> int | None:
    if isinstance(entry.get("cores"), int):
        return entry["cores"]
    found = re.match(r"(\d+)-core", str(entry.get("machine") or ""))  # older entries: "2-core CPU" only
    return int(found.group(1)) if found else None


def _where(entry: dict[str, Any]) -> str:
    """Where the minutes were taken: " on idle cores" (what a newcomer's idle machine gives), or " on a shared
    machine (load 11.5 on 2 cores, 7 CPU-minutes; less on idle cores)" (its wall minutes are longer than an idle
    machine's; its CPU time is not)."""
    if not shared(entry):
        return " on idle cores" if isinstance(entry.get("shared"), bool) else ""  # older entries did not say
    load, cores, cpu = entry.get("mean_load"), _cores(entry), entry.get("cpu_minutes")
    details = []
    if isinstance(load, (int, float)):
        details.append(f"load {load:g}" + (f" on {cores} cores" if cores is not None else ""))
    if isinstance(cpu, (int, float)):
        details.append(f"{cpu:.0f} CPU-minutes")
    said = ", ".join(details) + "; " if details else ""
    return f" on a shared machine ({said}less on idle cores)"


def cost_html(config_file: Path | str | None, table: dict[str, dict[str, Any]] | None = None,
              model: str | None = None) -> str:
    """One line for the Train form: which config the form holds, what it reached and what it cost when measured
    (`data-measured` is "current", "earlier" when the config changed since, or "none").

    Args:
        config_file: the config the form was filled from (None: the form's own values).
        table: the measurements (default: `configs/measured.json`).
        model: the model the form holds, when it is not the one measured (the Hub id of a packaged model): the line
            names the model the figures are for.
    """
    if config_file is None:
        return ('<div class="sqe-muted" id="train-config-cost" data-measured="none">No config file: the form\'s own '
                'values.</div>')
    path = Path(config_file)
    name = path.name
    entry = (measured() if table is None else table).get(name) if path.parent.resolve() == MEASURED_FILE.parent else None
    try:
        shown = str(path.resolve().relative_to(MEASURED_FILE.parent.parent))
    except ValueError:  # a config from elsewhere (`python app.py --config`): its own path
        shown = str(path)
    loaded = f"Loaded <code>{html.escape(shown)}</code>"
    if not entry:
        return f'<div class="sqe-muted" id="train-config-cost" data-measured="none">{loaded} · not measured.</div>'
    current = entry.get("config_sha256") is not None and entry.get("config_sha256") == config_digest(path)
    version = "" if current else (" on an earlier version of this config," if entry.get("config_sha256")
                                  else " on a version of this config it did not record,")
    machine = html.escape(str(entry.get("machine") or "one machine"))
    who = ""
    if model and entry.get("model") and model != entry.get("model"):
        who = f" with {html.escape(str(entry['model']))}"
    parts = []
    if isinstance(entry.get("minutes"), (int, float)):
        parts.append(f"<b>~{entry['minutes']:.0f} min</b> all-in" + html.escape(_where(entry)))
    if isinstance(entry.get("peak_memory_gb"), (int, float)):
        parts.append(f"peak memory <b>{entry['peak_memory_gb']:.1f} GiB</b>")
    if isinstance(entry.get("disk_written_gb"), (int, float)):
        parts.append(f"{entry['disk_written_gb']:.1f} GiB written")
    reached = reached_text(entry)
    figures = " · ".join(p for p in (reached, ", ".join(parts)) if p) or "no figures"
    note = entry.get("note")
    title = f' title="{html.escape(str(note))}"' if note else ""
    return (f'<div class="sqe-muted" id="train-config-cost" data-measured="{"current" if current else "earlier"}" '
            f'data-minutes="{entry.get("minutes", "")}"{title}>{loaded} · measured{version}{who} on {machine}: '
            f'{figures}</div>')


def _scale(entry: dict[str, Any], phase: str, config: dict[str, Any]) -> float | None:
    """The measured seconds of `phase`, scaled to `config`'s steps or episodes."""
    seconds = (entry.get("phase_seconds") or {}).get(phase)
    if not isinstance(seconds, (int, float)):
        return None
    sft = config.get("sft") if isinstance(config.get("sft"), dict) else {}
    ratios = {
        "sft": (sft.get("max_steps"), entry.get("sft_steps")),
        "grpo": (_grpo_episodes(config), entry.get("grpo_episodes")),
        "comparison": (config.get("comparison_episodes"), entry.get("comparison_episodes")),
        "base eval": (config.get("comparison_episodes"), entry.get("comparison_episodes")),
    }
    now, then = ratios.get(phase, (None, None))
    if isinstance(now, (int, float)) and isinstance(then, (int, float)) and now > 0 and then > 0:
        seconds *= now / then
    return float(seconds)


def _grpo_episodes(config: dict[str, Any]) -> int | None:
    try:
        return int(config["max_steps"]) * int(config["per_device_train_batch_size"]) * int(
            config.get("gradient_accumulation_steps") or 1)
    except (KeyError, TypeError, ValueError):
        return None


def _entry_for(config: dict[str, Any], table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    for entry in table.values():
        if entry.get("model") == config.get("model") and entry.get("dataset") == config.get("dataset"):
            return entry
    return None


def remaining_seconds(status: dict[str, Any], config: dict[str, Any] | None, elapsed_in_phase: float | None,
                      table: dict[str, dict[str, Any]] | None = None) -> float | None:
    """Seconds a running run has left: the current phase at its own pace (its steps so far), else as measured;
    plus every later phase as measured for the same model and dataset. None when nothing is known yet."""
    parts = remaining_parts(status, config, elapsed_in_phase, table)
    if parts is None or parts["current"] is None:
        return None
    if not parts["measured"]:
        return parts["current"]
    return parts["current"] + parts["later"]


def remaining_parts(status: dict[str, Any], config: dict[str, Any] | None, elapsed_in_phase: float | None,
                    table: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What `remaining_seconds` adds up, for a status bar that says what it knows: {"current": seconds the current
    phase has left (None until its pace or a measurement says), "later": seconds of the later phases as measured
    (0.0 without a measurement), "measured": whether a measurement of this model and dataset exists}. None for a
    phase outside `PHASE_ORDER` (queued, done)."""
    config = config or {}
    phase = status.get("phase")
    if phase not in PHASE_ORDER:
        return None
    entry = _entry_for(config, measured() if table is None else table)
    current = None
    if phase == "sft":
        done, total = status.get("phase_step"), status.get("phase_total")
    elif phase == "grpo":
        done, total = status.get("step"), status.get("total_steps")
    else:
        done = total = None
    if isinstance(done, int) and isinstance(total, int) and done > 0 and elapsed_in_phase is not None:
        current = elapsed_in_phase / done * max(total - done, 0)
    elif entry is not None:
        planned = _scale(entry, phase, config)
        if planned is not None:
            current = max(planned - (elapsed_in_phase or 0.0), 0.0)
    later = 0.0
    if entry is not None:
        rest = [_scale(entry, p, config) for p in PHASE_ORDER[PHASE_ORDER.index(phase) + 1:]]
        later = sum(s for s in rest if s is not None)
    return {"current": current, "later": later, "measured": entry is not None}
