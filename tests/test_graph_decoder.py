"""The graph decoder (`training/generation/graph_decoder.py`) on the CPU, where its step runs without graphs: greedy
turns token for token those of `MultiTurnDecoder` (rows ending at different times, rows kept idle or dropped, caches
reused, grown and moved; as on a GPU with padding rows, late checks and rounded windows, and as on a CPU), whole
episodes with tool results and turn caps on the tiny model (SmolLM2's: tests/test_gguf_models.py), sampled
log-probabilities within 1e-5 of a plain forward, sampled tokens those of the Exp(1) race over a plain forward; the
step a GPU captures reads nothing back to the host, draws no random numbers and leaves no trace for inactive rows; a
failed capture falls back to eager steps and, on a GPU, leaves the generator and the stream as they were; graphs
captured after the cache grew go to a memory pool of their own (the allocator's books on a CPU); the bf16 mode
computes as the trainer's autocast; and which decoder plays a model."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

#: As the GPU plays: batches rounded up to powers of two (rows that take no part), the host reading the rows' state
#: every 4 steps only, attention windows rounded up.
GPU_LIKE = {"buckets": True, "sync_every": 4, "window_step": 16}
EOS = set(range(80, 96))  # a sixth of the vocabulary ends a turn: rows end at different steps


def _random_model(family: str, init: float = 0.3):
    """A small random model of SmolLM2's layout (Llama, 3 query heads per key/value head) or the tiny model's (Qwen3,
    q/k norms); initialised wide by default, so that its greedy tokens vary (transformers' 0.02 gives near-uniform
    next-token distributions: rows that sample end at different times, on logits of a real model's scale)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[family]
    torch.manual_seed(0)
    config = config_class(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                          initializer_range=init)
    return model_class(config).eval()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def random_model(family):
    return _random_model(family)


def _prompts(n: int, shared: int = 20) -> dict[int, list[int]]:
    import torch

    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 80, (shared,), generator=g).tolist()
    return {i: prefix + torch.randint(0, 80, (3 + 2 * i,), generator=g).tolist() for i in range(n)}


def _decoders(model, **graph_kwargs):
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    return (MultiTurnDecoder(model, 0, EOS, min_shared_prefix=8),
            GraphDecoder(model, 0, EOS, min_shared_prefix=8, **graph_kwargs))


@pytest.mark.parametrize("mode", [{}, GPU_LIKE], ids=["cpu", "gpu-like"])
def test_greedy_turns_are_those_of_the_multi_turn_decoder(random_model, mode):
    """Seven conversations over five turns: rows end at different steps, some leave (forgotten), one sits a turn out
    (kept, budget 0) and comes back, a context is trimmed; every turn's tokens, caches and counts are the same."""
    old, new = _decoders(random_model, **mode)
    sequences = _prompts(7)
    lengths = set()
    for turn in range(5):
        budgets = {k: 0 if (k, turn) == (1, 2) else 12 for k in sequences}
        want, got = old.generate(sequences, budgets), new.generate(sequences, budgets)
        assert got == want, f"turn {turn}"
        # the same tokens read (forward calls differ: a GPU-like batch checks its rows every 4 steps)
        assert (new.stats.fed, new.stats.generated) == (old.stats.fed, old.stats.generated)
        for key in sequences:
            assert new.cached_ids(key) == old.cached_ids(key)
        lengths |= {len(v) for k, v in want.items() if budgets[k]}
        sequences = {k: sequences[k] + want[k] + [1 + turn, 2, 3] for k in sequences if (k + turn) % 6}
        if turn == 3:  # a trimmed context: the start kept, the rest rewritten
            key = next(iter(sequences))
            sequences[key] = sequences[key][:30] + [4, 5, 6, 7]
    assert len(lengths) >= 3  # rows did end at different steps
    assert new.cached_ids(0) is None  # dropped at turn 0 ((0 + 0) % 6 == 0): forgotten
    if mode:
        assert new._cache.length % 16 == 0 and new._cache.rows in (8, 16)  # grown, in steps the graphs allow


@pytest.mark.parametrize("mode", [{}, GPU_LIKE], ids=["cpu", "gpu-like"])
def test_groups_of_rows_with_one_prompt_read_it_once_as_the_multi_turn_decoder_does(random_model, mode):
    """GRPO's rows: three questions' prompts (sharing a system prompt), three episodes each, over two turns (the
    second after each row's own tool result): the same tokens, caches and reads as `MultiTurnDecoder`, each group's
    prompt read once."""
    old, new = _decoders(random_model, **mode)
    prompts = _prompts(3)
    sequences = {(q, g): prompts[q] + list(range(30, 40 + q)) for q in range(3) for g in range(3)}
    for turn in range(2):
        got = {decoder: decoder.generate(sequences, 10) for decoder in (old, new)}
        assert got[new] == got[old], f"turn {turn}"
        assert (new.stats.fed, new.stats.generated) == (old.stats.fed, old.stats.generated)
        for key in sequences:
            assert new.cached_ids(key) == old.cached_ids(key)
        if turn == 0:
            common = 20  # _prompts' shared prefix
            read = common + sum(len(sequences[(q, 0)]) - 1 - common for q in range(3)) + len(sequences)
            assert new.stats.fed == read + new.stats.generated - len(sequences)
        sequences = {(q, g): sequences[(q, g)] + got[old][(q, g)] + [1 + g, 2, 3] for q, g in sequences}


def test_greedy_episodes_on_the_tiny_model_are_those_of_the_multi_turn_decoder(tiny, monkeypatch):
    """Whole episodes (tool calls parsed, tools run, tool results read, turns closed at their cap), played as evals
    play them, with each decoder forced."""
    from sqlenv.environment import SQLEnvironment
    from training.generation.model_policy import play_model_episodes

    model, tokenizer = tiny
    played = {}
    for kind in ("kept", "graph"):
        monkeypatch.setenv("SQLENV_DECODER", kind)
        envs = [SQLEnvironment.from_dataset("builtin", split="eval", step_budget=4) for _ in range(5)]
        try:
            observations = [env.reset(seed=i) for i, env in enumerate(envs)]
            played[kind] = play_model_episodes(model, tokenizer, envs, observations, max_turn_tokens=20)
        finally:
            for env in envs:
                env.close()
    assert [e.completion_ids for e in played["graph"]] == [e.completion_ids for e in played["kept"]]
    assert [e.messages for e in played["graph"]] == [e.messages for e in played["kept"]]
    assert all(e.turns >= 2 for e in played["graph"])


@pytest.mark.parametrize("mode", [{}, GPU_LIKE], ids=["cpu", "gpu-like"])
def test_sampled_log_probabilities_are_those_of_a_plain_forward(family, mode):
    """At a fixed seed, over two turns with rows ending at different times, each drawn token's recorded
    log-probability is log_softmax(logits / T) of a plain forward of the row's whole sequence, within 1e-5."""
    import torch

    random_model = _random_model(family, init=0.02)
    _, decoder = _decoders(random_model, **mode)
    sequences, temperature = _prompts(5), 0.7
    torch.manual_seed(3)
    ends = set()
    for turn in range(2):
        out = decoder.generate(sequences, 10, sample=True, temperature=temperature)
        ends |= {len(v) for v in out.values()}
        for key, tokens in out.items():
            sequence = sequences[key] + tokens
            with torch.no_grad():
                logps = torch.log_softmax(random_model(torch.tensor([sequence])).logits[0].float() / temperature, -1)
            want = [float(logps[len(sequences[key]) + j - 1, t]) for j, t in enumerate(tokens)]
            assert decoder.last_logprobs[key] == pytest.approx(want, abs=1e-5)
        sequences = {k: sequences[k] + out[k] + [5, 6, 7] for k in sequences}
    assert len(ends) >= 2
    draws = []
    for _ in range(2):  # a fixed seed draws the same tokens
        torch.manual_seed(5)
        draws.append(_decoders(random_model, **mode)[1].generate(_prompts(5), 10, sample=True, temperature=0.7))
    assert draws[0] == draws[1]


def test_the_step_a_gpu_captures_reads_nothing_back_and_idle_rows_leave_no_trace(random_model):
    """A CUDA graph replays device work only: the decoding step must never read a value back to the host (that
    would fail the capture or freeze a value into the graph). And the capture's warm-up runs the step with every row
    inactive, which must change no row's cache, position, tokens or count."""
    import torch
    from torch.overrides import TorchFunctionMode

    host_reads = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
                  torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy,
                  torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
                  torch.unique, torch.tensor, torch.as_tensor}

    class NoHostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in host_reads:
                raise AssertionError(f"the step reads back to the host: {func}")
            if func is torch.Tensor.__getitem__ and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                                       for a in (args[1] if isinstance(args[1], tuple) else
                                                                 (args[1],))):
                raise AssertionError("the step indexes with a boolean mask (a host read)")
            return func(*args, **kwargs)

    _, decoder = _decoders(random_model, **GPU_LIKE)
    decoder.generate(_prompts(5), 6, sample=True)  # slots, state (its noise too), cache in place, rows kept
    state, cache = decoder._state, decoder._cache
    state.active[:4] = torch.tensor([True, False, True, True])
    state.count[:4], state.budget[:4] = 0, state.columns
    for sample in (False, True):
        with NoHostReads():
            decoder._decode_step(4, 32, sample)
            state.choose(torch.randn(4, 96), slice(0, 4), sample)

    state.active.zero_()
    before = [t.clone() for t in state.per_slot()[:5]] + [t[:, :, :-1].clone() for t in cache.keys + cache.values]
    before_out = state.out[:, :-1].clone()
    decoder._decode_step(8, 32, True)
    after = list(state.per_slot()[:5]) + [t[:, :, :-1] for t in cache.keys + cache.values]
    assert all(torch.equal(a, b) for a, b in zip(after, before)) and torch.equal(state.out[:, :-1], before_out)


def test_a_capture_that_fails_leaves_the_decoder_decoding_eagerly(random_model, caplog):
    """Capturing a graph can fail (here: no CUDA device); the decoder then says why (`graphs.error`, and a warning a
    run's log shows) and decodes every step eagerly, the rows' state as the failed capture found it: greedy, the
    multi-turn decoder's tokens; sampled at a seed, the tokens of a decoder that never tried to capture."""
    import logging

    import torch

    old, new = _decoders(random_model, **GPU_LIKE)
    new.graphs.enabled = True  # as on a GPU: the first decoding step tries to capture
    sequences = _prompts(5)
    with caplog.at_level(logging.WARNING, logger="training.generation.step_graphs"):
        assert new.generate(sequences, 12) == old.generate(sequences, 12)
    assert new.graphs.error and not new.graphs.enabled and new.graphs.captured == 0
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and new.graphs.error in caplog.records[0].message
    draws = []
    for graphs in (True, False):
        decoder = _decoders(random_model, **GPU_LIKE)[1]
        decoder.graphs.enabled = graphs
        torch.manual_seed(4)
        draws.append(decoder.generate(sequences, 12, sample=True, temperature=0.8))
    assert draws[0] == draws[1]


@pytest.mark.parametrize("mode", [{}, GPU_LIKE], ids=["cpu", "gpu-like"])
def test_sampling_draws_its_noise_outside_the_step_as_multinomial_draws(family, mode):
    """A captured step must draw no random numbers: a graph that draws them ties its capture to PyTorch's default
    generator, and a capture that failed left that generator marked as capturing, so every later draw failed ("Offset
    increment outside graph capture encountered unexpectedly", on a lent H200). The decoding step draws none: the
    decoder draws each step's Exp(1) noise before it, eagerly. At a fixed seed a row samples what that race
    (`torch.multinomial`'s for one sample) draws over a plain forward's probabilities, token for token."""
    import torch

    model = _random_model(family, init=0.02)
    _, decoder = _decoders(model, **mode)
    decoder.generate(_prompts(3), 4, sample=True)  # slots, state and noise in place
    state = decoder._state
    state.active[:2] = True
    state.count[:2], state.budget[:2] = 0, state.columns
    before = torch.get_rng_state()
    decoder._decode_step(2, decoder._cache.length, True)
    assert torch.equal(torch.get_rng_state(), before)

    prompt, temperature = _prompts(1)[0], 0.7
    torch.manual_seed(11)
    got = _decoders(model, **mode)[1].generate({0: prompt}, 12, sample=True, temperature=temperature)[0]
    torch.manual_seed(11)
    want, sequence = [], list(prompt)
    while len(want) < 12 and not (want and want[-1] in EOS):
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([sequence])).logits[0, -1].float() / temperature, dim=-1)
        token = int((probs / torch.empty_like(probs).exponential_(1)).argmax())
        want.append(token)
        sequence.append(token)
    assert got == want and len(want) > 1


def test_a_capture_that_fails_on_a_gpu_leaves_the_generator_and_the_stream_as_they_were():
    """On a CUDA device (skipped elsewhere): a step that reads a value back to the host fails its capture. PyTorch's
    default generator still draws, the seed's numbers (the failed capture used to leave it marked as capturing: every
    later draw failed), the default stream is current again, the garbage collector runs, and a step that captures
    replays."""
    import contextlib
    import gc

    import torch

    from training.generation.step_graphs import StepGraphs

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.zeros(4, device="cuda")

    def reads_back() -> None:
        x.add_(1)
        float(x.sum())  # a host read: not allowed in a capture

    torch.manual_seed(0)
    want = torch.rand(3, device="cuda")
    torch.manual_seed(0)
    graphs = StepGraphs(True)
    assert graphs.runner("bad", reads_back, contextlib.nullcontext) is reads_back
    assert "not permitted" in graphs.error and not graphs.enabled
    assert torch.equal(torch.rand(3, device="cuda"), want)
    assert torch.cuda.current_stream() == torch.cuda.default_stream() and gc.isenabled()
    good = StepGraphs(True)
    replay = good.runner("good", lambda: x.mul_(2), contextlib.nullcontext)  # its warm-up doubles x once
    before = x.clone()
    replay()
    assert good.captured == 1 and good.error is None and torch.equal(x, before * 2)
    assert torch.rand(3, device="cuda").shape == (3,)  # the generator draws after a capture that worked, too


class AllocatorPools:
    """`StepGraphs`' torch.cuda calls (`step_graphs.CudaCapture`) on a CPU, keeping the books PyTorch's caching
    allocator keeps on graph pools (c10/cuda/CUDACachingAllocator.cpp) and cuBLAS's workspaces
    (aten/src/ATen/cuda/CublasHandlePool.cpp):

    - a capture into pool P (`create_or_incref_pool`): a new P with `use_count` 1, or an existing P's count + 1;
      an existing P at count 0 is refused ("it->second->use_count > 0 INTERNAL ASSERT FAILED");
    - a graph's destruction (`CUDAGraph::reset` -> `releasePool`): its pool's count - 1;
    - `torch.cuda.graph` empties the cache before each capture: a pool at count 0 none of whose blocks is live is
      erased (`release_cached_blocks`);
    - a stream's first matrix product makes its cuBLAS workspace, kept for the process: in the pool of the capture
      under way on that stream, if one is (a live block of that pool for good); `outliving`: every capture leaves one
      more block of its pool alive (any other allocation that outlives its graphs).

    A capture records `step` without running it; the graph's replay runs it, as a CUDA graph's does."""

    def __init__(self, outliving: bool = False):
        self.outliving = outliving
        self.pools: dict = {}  # pool -> {"use_count", "live"}
        self.workspaces: dict = {}  # stream -> the pool its workspace is a block of (None: no pool)
        self.opened: list = []
        self.erased: list = []
        self._handles = 0

    def pool(self):
        self._handles += 1
        return (0, self._handles)

    def stream(self):
        return "the capture stream"

    def warm_up(self, step, stream):
        self.workspaces.setdefault(stream, None)
        step()

    def capture(self, step, pool, stream):
        import weakref

        for key in [k for k, p in self.pools.items() if p["use_count"] == 0 and p["live"] == 0]:
            del self.pools[key]
            self.erased.append(key)
        if pool in self.pools:
            if self.pools[pool]["use_count"] == 0:
                raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED at "
                                   "\"c10/cuda/CUDACachingAllocator.cpp\", please report a bug to PyTorch.")
            self.pools[pool]["use_count"] += 1
        else:
            self.pools[pool] = {"use_count": 1, "live": 0}
            self.opened.append(pool)
        if stream not in self.workspaces:
            self.workspaces[stream] = pool
            self.pools[pool]["live"] += 1
        self.pools[pool]["live"] += self.outliving

        class Graph:
            replay = staticmethod(step)

        graph = Graph()
        weakref.finalize(graph, self._release, pool)
        return graph

    def _release(self, pool):
        self.pools[pool]["use_count"] -= 1


@pytest.mark.parametrize("outliving", [False, True], ids=["workspaces", "a-block-outlives-its-graphs"])
def test_graphs_captured_after_the_cache_grew_open_a_pool_of_their_own(outliving):
    """On a lent H200 the first capture after a decoder's cache grew failed ("use_count > 0 INTERNAL ASSERT FAILED",
    CUDACachingAllocator.cpp) and the decoder ran eagerly from then on: the new graphs were captured into the pool of
    the graphs the growth had dropped, which the allocator refuses while a block of it lives on. Replayed here by the
    allocator's books on a CPU, over turns whose cache grows: every capture succeeds, each generation of graphs in a
    pool of its own, the tokens those of the multi-turn decoder; cuBLAS's workspace is made by the warm-up, in no pool,
    so every pool whose graphs are gone is erased (with a block that outlives its graphs, pools stay, and captures
    still succeed)."""
    from training.generation.step_graphs import StepGraphs

    old, new = _decoders(_random_model("llama"), **GPU_LIKE)
    pools = AllocatorPools(outliving)
    new.graphs = StepGraphs(True, cuda=pools)
    sequences = _prompts(5)
    lengths = []
    for turn in range(5):
        want = old.generate(sequences, 12)
        assert new.generate(sequences, 12) == want, f"turn {turn}"
        lengths.append(new._cache.length)
        sequences = {k: sequences[k] + want[k] + [1 + turn, 2, 3] for k in sequences}
    assert new.graphs.error is None and new.graphs.captured > len(pools.opened) >= 3
    assert len(set(lengths)) >= 3  # the cache grew twice: the graphs were dropped and captured again
    assert pools.workspaces == {"the capture stream": None}
    if outliving:
        assert pools.erased == [] and all(p["live"] for p in pools.pools.values())
    else:
        assert pools.erased == pools.opened[:-1] and list(pools.pools) == pools.opened[-1:]


def test_graphs_are_captured_again_after_a_clear_on_a_gpu():
    """On a CUDA device (skipped elsewhere): a step with a matrix product captured, its graphs dropped, captured again
    (the pool of the first is never opened again), replayed: the product's numbers."""
    import contextlib

    import torch

    from training.generation.step_graphs import StepGraphs

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    a = torch.randn(64, 64, device="cuda")
    out = torch.empty_like(a)
    graphs = StepGraphs(True)
    for key in ("first", "second"):
        graphs.runner(key, lambda: torch.mm(a, a, out=out), contextlib.nullcontext)
        graphs.clear()
    replay = graphs.runner("third", lambda: torch.mm(a, a, out=out), contextlib.nullcontext)
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert graphs.error is None and graphs.captured == 3 and torch.allclose(out, a @ a)


def test_bf16_mode_computes_as_the_trainers_autocast(random_model):
    """`compute_dtype=bf16` over fp32 weights gives the logits of the model's own forward under bf16 autocast (a
    bf16 rounding apart at most), and with `lm_head_fp32` those of TRL's fp32 LM head."""
    import torch
    import torch.nn.functional as F

    from training.generation.slot_model import SlotCache, SlotModel

    ids = torch.tensor([_prompts(2)[0][:20], _prompts(2)[1][:20]])
    positions = torch.arange(20)[None].repeat(2, 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = random_model.model(input_ids=ids).last_hidden_state[:, -1]
        autocast_logits = random_model.lm_head(hidden).float()
    fp32_head = F.linear(hidden.float(), random_model.lm_head.weight.float())
    for lm_head_fp32, want in ((False, autocast_logits), (True, fp32_head)):
        slots = SlotModel(random_model, compute_dtype=torch.bfloat16, lm_head_fp32=lm_head_fp32)
        slots.refresh()
        cache = SlotCache(slots, 2, 32)
        assert cache.keys[0].dtype == torch.bfloat16
        with torch.no_grad():
            got = slots.forward(cache, slice(0, 2), ids, positions, 20).float()
        scale = want.abs().max()
        assert (got - want).abs().max() <= 2 ** -7 * scale
    plain = SlotModel(random_model)
    assert plain.kv_dtype == torch.float32 and not plain.mixed


def test_the_decoder_choice(tiny, monkeypatch):
    """On a CPU `auto` keeps `MultiTurnDecoder`; `SQLENV_DECODER` forces either; a model the graph decoder cannot
    run (a sliding window) gets `MultiTurnDecoder` even when the graph decoder is forced; a bad value is refused."""
    from training.generation.decoders import kept_cache_decoder
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    model = tiny[0]
    monkeypatch.delenv("SQLENV_DECODER", raising=False)
    assert type(kept_cache_decoder(model, 0, {2})) is MultiTurnDecoder
    assert type(kept_cache_decoder(model, 0, {2}, kind="graph")) is GraphDecoder
    monkeypatch.setenv("SQLENV_DECODER", "graph")
    assert type(kept_cache_decoder(model, 0, {2})) is GraphDecoder
    assert kept_cache_decoder(model, 0, set()) is None
    windowed = copy.deepcopy(model)
    windowed.config.use_sliding_window, windowed.config.sliding_window = True, 8
    windowed.config.layer_types = ["sliding_attention"] * windowed.config.num_hidden_layers
    assert not GraphDecoder.supports(windowed)
    monkeypatch.setenv("SQLENV_DECODER", "fast")
    with pytest.raises(ValueError, match="SQLENV_DECODER"):
        kept_cache_decoder(model, 0, {2})
