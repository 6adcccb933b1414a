"""SQLEnv: a sandboxed SQL-exploration environment for training small language models to answer questions.

    from sqlenv import SQLEnvironment, SQLAction
    env = SQLEnvironment.from_dataset("builtin", split="train")
    obs = env.reset(seed=42)
    obs = env.step(SQLAction("DESCRIBE", "singer"))

Names are exported lazily (PEP 562 module `__getattr__`): `import sqlenv` stays cheap, and a module that is
missing or broken only fails the name that needs it, not the whole package.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "SQLAction": "sqlenv.types",
    "SQLObservation": "sqlenv.types",
    "RewardLayers": "sqlenv.types",
    "RewardBreakdown": "sqlenv.types",
    "EpisodeState": "sqlenv.types",
    "Question": "sqlenv.types",
    "SQLEnvironment": "sqlenv.environment",
    "verify_answer": "sqlenv.verifier",
    "format_answer": "sqlenv.verifier",
    "RewardConfig": "sqlenv.rewards",
    "SandboxSettings": "sqlenv.sandbox",
    "resolve_dataset": "sqlenv.datasets",
    "list_datasets": "sqlenv.datasets",
    "load_questions": "sqlenv.datasets",
    "evaluate": "sqlenv.evaluation",
    "EvaluationResult": "sqlenv.evaluation",
    "RandomPolicy": "sqlenv.policies",
    "OraclePolicy": "sqlenv.policies",
    "render_transcript_text": "sqlenv.transcript",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sqlenv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
