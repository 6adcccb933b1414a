"""The built-in tiny model and its tokenizer; Hub-path loading from a local directory; the missing-model error."""

from __future__ import annotations

import json

import pytest
import torch

from training.models import (
    BUILTIN_TINY,
    ModelLoadError,
    TinyModelSpec,
    build_tiny_model,
    load_model_and_tokenizer,
    resolve_device_dtype,
)
from training.models.tokenizer import find_phrases, qwen3_chat_template, render_conversations


@pytest.fixture(scope="session")
def conversations():
    """A small slice of real oracle episodes of the built-in dataset (a session-wide cache: tests stay fast)."""
    from training.warm_start import teacher_conversations

    return teacher_conversations("builtin", "train", episodes=60)


@pytest.fixture(scope="session")
def corpus(conversations):
    return render_conversations(conversations)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, corpus):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", corpus, seed=0)


def test_tiny_model_builds_with_qwen3_format(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template as trl_qwen3

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert isinstance(model, Qwen3ForCausalLM)
    n_params = sum(p.numel() for p in model.parameters())
    assert 400_000 <= n_params <= 5_000_000, n_params
    assert tokenizer.chat_template == trl_qwen3 == qwen3_chat_template()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.vocab_size == len(tokenizer)
    for token in ("<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
                  "</think>"):
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    info = json.loads((tiny_dir / "sqlenv_model.json").read_text())
    assert info["name"] == BUILTIN_TINY and info["n_parameters"] == n_params


def test_tokenizer_round_trips_and_copies_values_consistently(corpus, tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    for text in corpus[:10]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    # A literal value is the same token ids in the question, in SQL and in the answer.
    for value_text, contexts in {
        "Portugal": ("country Portugal?", "country = 'Portugal'", '{"value": "Portugal"}'),
        "Gil Novak": ("the member Gil Novak?", "by Gil Novak whose", "name = 'Gil Novak'", "name\nGil Novak\n",
                      '{"value": "Gil Novak, Ana Silva"}'),
        "1099": ("budget over 1099?", "budget > 1099 AND", "budget\n1099.5\n", '{"value": "1099"}'),
    }.items():
        value = tokenizer(value_text, add_special_tokens=False)["input_ids"]
        for context in contexts:
            ids = tokenizer(context, add_special_tokens=False)["input_ids"]
            assert any(ids[i:i + len(value)] == value for i in range(len(ids))), (value_text, context)
    # A multi-word value's words are adjacent pieces (no separate space token to look past when copying).
    pieces = [p for p, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("member Gil Novak whose")]
    assert pieces == ["memberĠ", "GilĠ", "Novak", "Ġ", "whose"], pieces  # byte-level: Ġ is the space
    # Boilerplate costs a handful of tokens: every tool schema line is one token.
    assert any(p.startswith('{"type": "function"') for p in find_phrases(corpus))
    assert len(tokenizer(corpus[0])["input_ids"]) < len(corpus[0]) / 4


def test_tiny_model_is_deterministic(tmp_path, corpus, tiny_dir):
    from transformers import AutoModelForCausalLM

    again = build_tiny_model(tmp_path / "again", corpus, seed=0)
    assert (again / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()
    a = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "seed1", corpus, seed=1)).state_dict()
    assert not all(torch.equal(a[k], other[k]) for k in a)


def test_trl_recognises_template_and_parses_tool_call(tiny_dir, conversations):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        parse_response,
        supports_tool_calling,
    )
    from trl.chat_template_utils import qwen3_training_chat_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert supports_tool_calling(tokenizer)
    add_response_schema(tokenizer)  # raises for a template TRL does not know
    assert get_training_chat_template(tokenizer) == qwen3_training_chat_template
    conv = conversations[0]
    tools = json.loads(conv["tools"])
    assert [t["function"]["name"] for t in tools] == ["answer", "describe", "query", "sample"]
    # Render the first assistant turn exactly as SFT trains it, then parse the generated part as GRPO does.
    messages = conv["messages"]
    prompt = tokenizer.apply_chat_template(messages[:2], tools=tools, chat_template=qwen3_training_chat_template,
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(messages[:3], tools=tools, chat_template=qwen3_training_chat_template,
                                         tokenize=True, return_dict=False)
    assert full[: len(prompt)] == prompt
    completion = full[len(prompt):]
    completion = completion[: completion.index(tokenizer.eos_token_id) + 1]
    parsed = parse_response(tokenizer, completion, prefix=prompt, tools=tools)
    expected = messages[2]["tool_calls"][0]["function"]
    assert parsed["tool_calls"][0]["function"]["name"] == expected["name"]
    assert parsed["tool_calls"][0]["function"]["arguments"] == json.loads(expected["arguments"])


def test_load_builtin_uses_cache(tmp_path):
    model, tokenizer = load_model_and_tokenizer(BUILTIN_TINY, cache_dir=tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert entry.name.startswith("tiny-v") and "seed0" in entry.name
    stamp = (entry / "model.safetensors").stat().st_mtime_ns
    model2, _ = load_model_and_tokenizer(BUILTIN_TINY, cache_dir=tmp_path)
    assert (entry / "model.safetensors").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert model.dtype == torch.float32 and model.device.type == "cpu"


def test_local_directory_loads_through_from_pretrained(tmp_path, tiny_dir):
    model, tokenizer = load_model_and_tokenizer(str(tiny_dir))
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    again, tok2 = load_model_and_tokenizer(str(saved), dtype="float32", device="cpu")
    assert tok2.chat_template == tokenizer.chat_template
    ids = torch.tensor([tokenizer("Question: How many artists are there?")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, again(ids).logits)


def test_missing_model_gives_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads HF_HUB_OFFLINE when it is imported: make the running process offline too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError) as err:
        load_model_and_tokenizer("sqlenv-test/no-such-model-xyz")
    message = str(err.value)
    assert "sqlenv-test/no-such-model-xyz" in message and "HF_HUB_OFFLINE=0" in message
    assert isinstance(err.value, ValueError)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model_and_tokenizer(str(tmp_path / "nowhere" / "model"))
    with pytest.raises(ModelLoadError, match="builtin:tiny"):
        load_model_and_tokenizer("builtin:huge")


def test_device_and_dtype_auto():
    device, dtype = resolve_device_dtype()
    if torch.cuda.is_available():
        assert device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
    else:
        assert device.type == "cpu" and dtype == torch.float32
    assert resolve_device_dtype("bf16", "cpu") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ModelLoadError):
        resolve_device_dtype("float7")


def test_spec_is_small_and_documented():
    spec = TinyModelSpec()
    assert spec.hidden_size % spec.num_attention_heads == 0
    assert spec.num_attention_heads % spec.num_key_value_heads == 0
