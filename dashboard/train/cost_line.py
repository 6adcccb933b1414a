"""The Train form's cost line: which config the form holds, what it reached and what it cost when measured
(`dashboard.core.measured`: configs/measured.json), on which machine and under what load.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from dashboard.core.formatting import share
from dashboard.core.measured import config_digest, measured
from dashboard.core.paths import CONFIGS_DIR, REPO_ROOT

__all__ = ["STAGES", "reached_text", "shared", "cost_html"]

#: An entry's `success` keys in the order a run reaches them, with the cost line's words. A model trained from
#: random weights plays no zero-shot eval (it is 0% by construction): its line starts at the random policy.
STAGES = [("random", "random policy"), ("zero_shot", "zero-shot"), ("warm_start", "warm start"),
          ("after_grpo", "after GRPO")]


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
    text = " → ".join(f"{words} {share(success[key])}" for key, words in stages)
    ex = (entry.get("execution_accuracy") or {}).get("after_grpo") if isinstance(
        entry.get("execution_accuracy"), dict) else None
    if isinstance(ex, (int, float)) and stages[-1][0] == "after_grpo":
        text += f" (EX {share(ex)})"
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
    entry = (measured() if table is None else table).get(name) if path.parent.resolve() == CONFIGS_DIR else None
    try:
        shown = str(path.resolve().relative_to(REPO_ROOT))
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
