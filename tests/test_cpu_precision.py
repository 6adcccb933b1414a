"""bf16 where the CPU has matrix units for it: the probe (`training.device.cpu_has_bf16_units`), what `precision: auto`
resolves to on each answer, a bf16 run on a CPU accepted, and a bf16 run's decoders sampling the distribution its
trainer's autocast scores (on the real tiny model; bf16 is exact to run on any CPU, only slow without the units)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

AMX_CPU = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ZEN4_CPU = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
AVX2_CPU = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"


def test_the_probe_reads_the_bf16_matrix_units_from_the_cpu_flags(monkeypatch):
    from training.device import CPU_BF16_ENV, cpu_has_bf16_units

    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_has_bf16_units(AMX_CPU) and cpu_has_bf16_units(ZEN4_CPU)
    assert not cpu_has_bf16_units(AVX2_CPU)
    assert not cpu_has_bf16_units("")  # no flags line (not x86 Linux): fp32
    assert not cpu_has_bf16_units("flags\t: avx512bf16x\n")  # whole flags only
    assert isinstance(cpu_has_bf16_units(), bool)  # this machine's own /proc/cpuinfo


@pytest.mark.parametrize("forced, expected", [("1", "bf16"), ("0", "fp32")])
def test_auto_precision_on_a_cpu_follows_the_probe(monkeypatch, forced, expected):
    from training.device import CPU_BF16_ENV, cpu_has_bf16_units, resolve_precision

    monkeypatch.setenv(CPU_BF16_ENV, forced)
    assert cpu_has_bf16_units(AVX2_CPU if forced == "1" else AMX_CPU) is (forced == "1")  # the setting wins
    assert resolve_precision("auto", "cpu") == expected
    assert resolve_precision("fp32", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("auto", "mps") == "fp32"


def test_a_bad_probe_setting_is_an_error_that_names_it(monkeypatch):
    from training.device import CPU_BF16_ENV, cpu_has_bf16_units

    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match=CPU_BF16_ENV):
        cpu_has_bf16_units(AMX_CPU)


def test_a_bf16_run_on_a_cpu_is_accepted_and_fp16_is_refused():
    from training.config import ConfigError, TrainConfig

    assert TrainConfig(model="builtin:tiny", device="cpu", precision="bf16").precision == "bf16"
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        TrainConfig(model="builtin:tiny", device="cpu", precision="fp16")


def test_a_bf16_run_decodes_through_bf16_weight_copies_on_a_cpu(tiny):
    import torch

    from training.generation.decoders import decode_dtype, kept_cache_decoder
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    model, tokenizer = tiny
    assert decode_dtype("bf16", model) is torch.bfloat16 and decode_dtype("fp32", model) is None
    assert decode_dtype(None, model) is None
    bf16 = kept_cache_decoder(model, 0, {tokenizer.eos_token_id}, compute_dtype=torch.bfloat16)
    assert isinstance(bf16, GraphDecoder) and bf16.slots.compute_dtype is torch.bfloat16
    fp32 = kept_cache_decoder(model, 0, {tokenizer.eos_token_id})
    assert isinstance(fp32, MultiTurnDecoder)  # on a CPU in fp32: transformers' forward, as before
    forced = kept_cache_decoder(model, 0, {tokenizer.eos_token_id}, kind="kept", compute_dtype=torch.bfloat16)
    assert isinstance(forced, MultiTurnDecoder) and forced.autocast_dtype is torch.bfloat16


def _prompts(tokenizer, n: int) -> list[list[int]]:
    from sqlenv.agent.prompts import initial_messages
    from sqlenv.environment import SQLEnvironment
    from training.generation.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    env = SQLEnvironment.from_dataset("builtin", split="train", step_budget=3)
    try:
        return [renderer.prompt_ids(initial_messages(env.reset(seed=i))) for i in range(n)]
    finally:
        env.close()


def _autocast_logprobs(model, ids: list[int], start: int, temperature: float) -> list[float]:
    """log softmax(logits / T) of ids[start:] under the trainer's bf16 autocast (TRL's selective log-softmax)."""
    import torch

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=torch.tensor([ids])).logits[0, start - 1: -1]
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(1, torch.tensor(ids[start:])[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("kind", ["graph", "kept"])
def test_the_bf16_decoders_sample_what_the_trainer_s_autocast_scores(tiny, kind):
    """The log-probability each sampled token was drawn with, against the one the loss computes for it under bf16
    autocast: mean gap <= 1e-2 (the fp32 decoder's gap is reported beside it: it is what a bf16 trainer fed fp32
    samples saw)."""
    import torch

    from training.generation.decoders import kept_cache_decoder

    model, tokenizer = tiny
    model.eval()
    prompts = _prompts(tokenizer, 4)
    gaps: dict[str, list[float]] = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", None)):
        decoder = kept_cache_decoder(model, 0, {tokenizer.eos_token_id}, kind=kind, compute_dtype=dtype)
        torch.manual_seed(0)
        out = decoder.generate({i: p for i, p in enumerate(prompts)}, 24, sample=True, temperature=0.8)
        gaps[name] = []
        for i, prompt in enumerate(prompts):
            sampled = decoder.last_logprobs[i]
            assert len(sampled) == len(out[i]) > 0
            scored = _autocast_logprobs(model, prompt + out[i], len(prompt), 0.8)
            gaps[name] += [abs(a - b) for a, b in zip(sampled, scored)]
    mean = {name: sum(g) / len(g) for name, g in gaps.items()}
    print("mean log-prob gap against the bf16 loss:", mean)
    assert mean["bf16"] <= 1e-2, mean
    assert mean["bf16"] < mean["fp32"], mean  # the fp32 decoder samples another distribution than the loss scores


def test_the_bf16_weight_copies_are_cast_once_per_play_and_again_after_the_weights_change(tiny):
    """GRPO's rollout keeps one decoder across steps: each play (`play_batched` forgets every row first) decodes with
    the weights of its step, cast once, not at every turn."""
    import copy

    import torch

    from training.generation.graph_decoder import GraphDecoder

    model, tokenizer = tiny
    model = copy.deepcopy(model).eval()
    prompts = {i: p for i, p in enumerate(_prompts(tokenizer, 3))}
    decoder = GraphDecoder(model, 0, {tokenizer.eos_token_id}, compute_dtype=torch.bfloat16)
    casts = []
    refresh = decoder.slots.refresh
    decoder.slots.refresh = lambda: (casts.append(1), refresh())[1]
    first = decoder.generate(prompts, 12)
    decoder.generate({k: v + first[k] + [5, 6] for k, v in prompts.items()}, 12)  # a second turn: no cast
    assert len(casts) == 1
    with torch.no_grad():  # an optimizer step
        for parameter in model.parameters():
            parameter.mul_(1.5)
    decoder.forget()  # the next play
    again = decoder.generate(prompts, 12)
    assert len(casts) == 2
    fresh = GraphDecoder(model, 0, {tokenizer.eos_token_id}, compute_dtype=torch.bfloat16).generate(prompts, 12)
    assert again == fresh and again != first
