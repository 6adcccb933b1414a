"""`SlotModel`: a Llama-family causal LM's forward over `SlotCache`, a KV cache of fixed shape with one slot per row.

`GraphDecoder` needs a decoding step whose every tensor keeps its shape and address from one token to the next, so
that the step can be captured once as a CUDA graph and replayed: transformers' forward grows its cache, builds its
mask and checks its inputs on the host at every call. This module is that step's arithmetic, written over the
model's own modules and weights (the same RMSNorm modules, activation, rotary table and linear weights, in the same
order as transformers' `LlamaModel` / `Qwen3Model`), so a row decodes as transformers would decode it:

- `SlotCache`: per layer, keys and values `[rows, kv_heads, length, head_dim]`. Row r's tokens sit at positions
  0 .. n-1 of its slot (no padding inside a slot); the last position is a scratch column where rows that take no
  part in a step (padding tokens, rows that have ended, idle rows of a fixed-size batch) write, and which no real
  token ever reads.
- `SlotModel.forward(cache, rows, ids, positions, window)`: reads `ids [n, T]`, each token written at (and
  attending up to) its position, over keys `[0, window)`; returns the logits of each row's last real token.

Precision. `compute_dtype=None` runs in the weights' dtype (fp32 weights: fp32; bf16 weights: bf16), as the model
does. `compute_dtype=torch.bfloat16` over fp32 weights reproduces what a trainer's bf16 autocast computes, without
casting every weight at every step: the linear layers run in bf16 on bf16 copies of the weights made once per play
(`refresh`), the residual stream, the norms and the rotary table stay fp32, attention runs in bf16 (its keys and
values are kept in bf16: autocast casts them there too). `lm_head_fp32` keeps the LM head in fp32, as TRL's
`cast_lm_head_to_fp32` does. So a sampler in this mode draws from the distribution the trainer scores.

Supported: the decoder layouts of Llama, Mistral (no sliding window), Qwen2 and Qwen3 (`q_norm`/`k_norm`), with a
rotary embedding that does not depend on the sequence's length, in float weights; not PEFT adapters (their layers
add the adapter's product) nor quantized weights. `SlotModel.unsupported(model)` says why a model is not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SlotCache", "SlotModel"]

#: Model families whose decoder layer is Llama's (pre-norm, rotary, GQA, gated MLP), possibly with Qwen3's q/k norms.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
#: Rotary types whose cos/sin depend on the position only (not on the sequence's length).
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


class SlotCache:
    """Keys and values of `rows` slots x `length` positions for every layer (zeros at first), the rotary table of
    every position, and the positions' index (for masks).

    Args:
        model: the `SlotModel` whose layers the cache holds.
        rows: slots.
        length: positions per slot, the scratch column (the last one) included.
    """

    def __init__(self, model: "SlotModel", rows: int, length: int):
        import torch

        if length < 2:
            raise ValueError(f"a slot cache needs at least 2 positions (got {length})")
        shape = (rows, model.kv_heads, length, model.head_dim)
        self.rows, self.length = rows, length
        self.keys = [torch.zeros(shape, dtype=model.kv_dtype, device=model.device) for _ in range(model.n_layers)]
        self.values = [torch.zeros(shape, dtype=model.kv_dtype, device=model.device) for _ in range(model.n_layers)]
        self.cos, self.sin = model.rotary_table(length)
        self.index = torch.arange(length, device=model.device)

    @property
    def scratch(self) -> int:
        """The position where tokens that must leave no trace write their keys and values."""
        return self.length - 1

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @staticmethod
    def bytes_for(model: "SlotModel", rows: int, length: int) -> int:
        """Bytes of a cache of `rows` x `length` for `model`."""
        import torch

        size = torch.tensor([], dtype=model.kv_dtype).element_size()
        return 2 * model.n_layers * rows * model.kv_heads * length * model.head_dim * size

    def copy_from(self, other: "SlotCache") -> None:
        """Take `other`'s contents (a smaller cache): its slots and positions, scratch column excluded."""
        rows, length = min(self.rows, other.rows), min(self.length, other.length) - 1
        for mine, theirs in zip((*self.keys, *self.values), (*other.keys, *other.values)):
            mine[:rows, :, :length] = theirs[:rows, :, :length]

    def move(self, sources: Any, targets: Any, upto: int) -> None:
        """Slot `targets[i]` takes what slot `sources[i]` held, positions [0, upto): any permutation (the sources
        are read before any target is written)."""
        for layer in (*self.keys, *self.values):
            layer[targets, :, :upto] = layer[sources, :, :upto]

    def share(self, source: int, targets: Any, upto: int) -> None:
        """Slots `targets` take slot `source`'s positions [0, upto) (a prefix read once for all of them)."""
        for layer in (*self.keys, *self.values):
            layer[targets, :, :upto] = layer[source: source + 1, :, :upto]


class SlotModel:
    """The forward of `model` over a `SlotCache` (see the module docstring).

    Args:
        model: a causal LM of a supported family (`unsupported(model)` is None), in eval mode.
        compute_dtype: None (default) computes in the weights' dtype; `torch.bfloat16` or `torch.float16` over fp32
            weights computes as the trainer's autocast does (bf16 linear layers and attention, fp32 residual).
        lm_head_fp32: with `compute_dtype`, keep the LM head in fp32 (TRL's `cast_lm_head_to_fp32`); default False.
    """

    def __init__(self, model: Any, *, compute_dtype: Any = None, lm_head_fp32: bool = False):
        import torch

        reason = self.unsupported(model)
        if reason:
            raise ValueError(f"SlotModel cannot run this model: {reason}")
        self.model = model
        base = model.get_decoder()
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.layers = list(base.layers)
        self.lm_head = model.get_output_embeddings()
        self.vocab = self.lm_head.weight.shape[0]  # the logits' width
        attention = self.layers[0].self_attn
        text = model.config.get_text_config()
        self.n_layers = len(self.layers)
        self.heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or self.heads
        self.groups = self.heads // self.kv_heads
        self.head_dim = attention.head_dim
        self.scaling = attention.scaling
        self.qk_norm = hasattr(attention, "q_norm")
        self.device = self.embed.weight.device
        self.weight_dtype = self.embed.weight.dtype
        self.mixed = compute_dtype is not None and compute_dtype != self.weight_dtype
        if self.mixed and (self.weight_dtype != torch.float32 or compute_dtype not in (torch.bfloat16,
                                                                                         torch.float16)):
            raise ValueError(f"compute_dtype {compute_dtype} over {self.weight_dtype} weights: only bf16/fp16 over "
                             "fp32 weights (the trainer's autocast) is supported")
        self.compute_dtype = compute_dtype if self.mixed else self.weight_dtype
        self.kv_dtype = self.compute_dtype
        self.lm_head_fp32 = bool(lm_head_fp32) and self.mixed
        self._linears = [m for layer in self.layers for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        if not self.lm_head_fp32:
            self._linears.append(self.lm_head)
        self._copies: dict[int, tuple[Any, Any]] = {}

    # ------------------------------------------------------------------------------------------ what it runs
    @staticmethod
    def unsupported(model: Any) -> str | None:
        """Why `model` cannot run here (None when it can)."""
        import torch

        config = getattr(model, "config", None)
        if config is None or not hasattr(model, "get_decoder") or not hasattr(model, "get_output_embeddings"):
            return "not a transformers causal LM"
        text = config.get_text_config()
        if getattr(text, "model_type", None) not in FAMILIES:
            return f"model type {getattr(text, 'model_type', None)!r} is not one of {', '.join(FAMILIES)}"
        if getattr(model, "peft_config", None) or any("lora_" in name for name, _ in model.named_modules()):
            return "a PEFT adapter is attached"
        layer_types = getattr(text, "layer_types", None) or ()
        if any(kind != "full_attention" for kind in layer_types) or (
                getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None)):
            return "sliding-window attention"
        if text.model_type == "mistral" and getattr(text, "sliding_window", None):
            return "sliding-window attention"
        rope = (getattr(text, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope not in STATIC_ROPE:
            return f"rotary type {rope!r} depends on the sequence length"
        try:
            base = model.get_decoder()
            layer = base.layers[0]
            parts = (base.embed_tokens, base.norm, base.rotary_emb, layer.self_attn.q_proj, layer.mlp.gate_proj,
                     layer.input_layernorm, layer.post_attention_layernorm, model.get_output_embeddings())
        except (AttributeError, IndexError, TypeError):
            return "its modules are not laid out as Llama's"
        if any(p is None for p in parts):
            return "its modules are not laid out as Llama's"
        dtypes = {p.dtype for p in model.parameters()}
        if not dtypes <= {torch.float32, torch.bfloat16, torch.float16} or len(dtypes) != 1:
            return f"weights of dtypes {sorted(map(str, dtypes))} (quantized or mixed)"
        return None

    def weights_key(self) -> tuple:
        """The addresses of the weights the forward reads: a captured graph reads these addresses, so it must be
        captured again when they change (a model moved or reloaded)."""
        return tuple(p.data_ptr() for p in self.model.parameters())

    def refresh(self) -> None:
        """With `compute_dtype`: cast the weights into their fixed-address low-precision copies (`GraphDecoder` does
        it once per play, after `forget()`: the weights change between GRPO steps, not within a play)."""
        if not self.mixed:
            return
        for module in self._linears:
            copy = self._copies.get(id(module))
            if copy is None:
                self._copies[id(module)] = (module.weight.detach().to(self.compute_dtype),
                                            None if module.bias is None else module.bias.detach().to(
                                                self.compute_dtype))
                continue
            copy[0].copy_(module.weight.detach())
            if copy[1] is not None:
                copy[1].copy_(module.bias.detach())

    def rotary_table(self, length: int):
        """cos and sin `[length, head_dim]` of positions 0 .. length-1, from the model's own rotary module (so any
        rope scaling it applies), in the dtype its forward gives them (the embeddings' dtype)."""
        import torch

        positions = torch.arange(length, device=self.device)[None]
        probe = torch.zeros(1, 1, 1, dtype=self.weight_dtype, device=self.device)
        cos, sin = self.rotary(probe, positions)
        return cos[0], sin[0]

    # ---------------------------------------------------------------------------------------------- forward
    def _linear(self, module: Any, x: Any) -> Any:
        import torch.nn.functional as F

        if self.mixed:
            weight, bias = self._copies[id(module)]
            return F.linear(x.to(weight.dtype), weight, bias)
        return F.linear(x, module.weight, module.bias)

    def _logits(self, hidden: Any) -> Any:
        import torch.nn.functional as F

        if self.lm_head_fp32:
            bias = self.lm_head.bias
            return F.linear(hidden.float(), self.lm_head.weight.float(), None if bias is None else bias.float())
        return self._linear(self.lm_head, hidden) if self.mixed else self.lm_head(hidden)

    def forward(self, cache: SlotCache, rows: slice, ids: Any, positions: Any, window: int, last: Any = None):
        """Read `ids [n, T]` into slots `rows` (n of them): token (i, t) is written at `positions[i, t]` and attends to
        its slot's keys at positions <= it within `[0, window)`. Padding tokens and rows that must leave no trace take
        `cache.scratch` as their position. Returns the logits `[n, vocab]` of each row's token `last[i]` (default: the
        last column). Nothing here reads a value back to the host, so the call can be captured in a CUDA graph."""
        import contextlib

        # On CUDA, attention by the kernels known to capture in graphs (not cuDNN's): flash where it applies, else
        # memory-efficient, else math.
        kernels = _sdpa_kernels() if ids.device.type == "cuda" else contextlib.nullcontext()
        with kernels:
            return self._forward(cache, rows, ids, positions, window, last)

    def _forward(self, cache: SlotCache, rows: slice, ids: Any, positions: Any, window: int, last: Any):
        import torch
        import torch.nn.functional as F

        n, T = ids.shape
        D, groups = self.head_dim, self.groups
        hidden = self.embed(ids)
        cos, sin = cache.cos[positions][:, None], cache.sin[positions][:, None]  # [n, 1, T, D]
        allowed = cache.index[:window].view(1, 1, 1, window) <= positions.view(n, 1, T, 1)  # [n, 1, T, window]
        if T > 1 and groups > 1:  # queries are folded as [kv head, group x T]: each group repeats the T rows' masks
            allowed = allowed[:, :, None].expand(n, 1, groups, T, window).reshape(n, 1, groups * T, window)
        # The additive mask attention makes of a boolean one, made once for every layer (the same numbers: 0 or -inf).
        mask = torch.zeros(allowed.shape, dtype=self.kv_dtype, device=ids.device).masked_fill_(~allowed, float("-inf"))
        where = positions.view(n, 1, T, 1).expand(n, self.kv_heads, T, D)
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden).to(self.compute_dtype)  # cast once for q, k, v (autocast: each)
            q = self._linear(attention.q_proj, x).view(n, T, -1, D)
            k = self._linear(attention.k_proj, x).view(n, T, -1, D)
            v = self._linear(attention.v_proj, x).view(n, T, -1, D)
            if self.qk_norm:
                q, k = attention.q_norm(q), attention.k_norm(k)
            # Rotary positions on queries and keys at once (elementwise: the same numbers as one by one).
            qk = torch.cat((q, k), dim=2).transpose(1, 2)
            qk = qk * cos + _rotate_half(qk) * sin
            q, k, v = qk[:, : self.heads], qk[:, self.heads:], v.transpose(1, 2)
            keys, values = cache.keys[i][rows], cache.values[i][rows]
            keys.scatter_(2, where, k.to(self.kv_dtype))
            values.scatter_(2, where, v.to(self.kv_dtype))
            # Grouped-query attention without repeating keys: the `groups` query heads of a key/value head are read
            # as `groups` x T queries of that head.
            folded = q.reshape(n, self.kv_heads, groups * T, D).to(self.kv_dtype)
            out = F.scaled_dot_product_attention(folded, keys[:, :, :window], values[:, :, :window],
                                                 attn_mask=mask, scale=self.scaling)
            out = out.reshape(n, self.heads, T, D).transpose(1, 2).reshape(n, T, self.heads * D)
            hidden = hidden + self._linear(attention.o_proj, out)
            x = layer.post_attention_layernorm(hidden).to(self.compute_dtype)
            mlp = layer.mlp
            hidden = hidden + self._linear(mlp.down_proj, mlp.act_fn(self._linear(mlp.gate_proj, x))
                                           * self._linear(mlp.up_proj, x))
        if last is None:
            hidden = hidden[:, -1]
        else:
            hidden = hidden[torch.arange(n, device=hidden.device), last]
        return self._logits(self.norm(hidden))


def _sdpa_kernels():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
