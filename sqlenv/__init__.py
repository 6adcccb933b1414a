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
import sys
from typing import Any, Callable

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
    "Environment": "sqlenv.protocol",
    "verify_answer": "sqlenv.scoring.verifier",
    "format_answer": "sqlenv.scoring.verifier",
    "RewardConfig": "sqlenv.rewards",
    "SandboxSettings": "sqlenv.sandbox.sandbox",
    "resolve_dataset": "sqlenv.data.datasets",
    "list_datasets": "sqlenv.data.datasets",
    "load_questions": "sqlenv.data.datasets",
    "evaluate": "sqlenv.evaluation.evaluate",
    "EvaluationResult": "sqlenv.evaluation.evaluate",
    "RandomPolicy": "sqlenv.evaluation.policies",
    "OraclePolicy": "sqlenv.evaluation.policies",
    "OpenAIPolicy": "sqlenv.evaluation.openai_policy",
    "EndpointSettings": "sqlenv.evaluation.openai_policy",
    "evaluate_concurrently": "sqlenv.evaluation.concurrent",
    "render_transcript_text": "sqlenv.transcript",
}

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's PEP 562 `__getattr__` and `__dir__` for `exports` ({public name: module defining it}): a name
    is imported on first use and then cached in the package, so later lookups skip `__getattr__`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
