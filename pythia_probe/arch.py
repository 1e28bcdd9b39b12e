"""GPT-NeoX (Pythia) weights under TransformerLens names: the only module that knows HF names.

API
- ``NeoXConfig.from_dict(config_json_dict)`` / ``NeoXConfig.from_hf(GPTNeoXConfig)``: refuses fields
  or values it does not understand (listing them) instead of guessing.
- ``NeoXWeights(state_dict, config)`` or ``NeoXWeights.from_module(hf_model)``:
  raw weights, no processing. ``W_E [d_vocab, d_model]`` and
  ``W_U [d_model, d_vocab]`` are views of the loaded tensors (no copy). ``layer(i)`` gives a
  :class:`LayerWeights` with ``W_Q/W_K/W_V [n_heads, d_model, d_head]``, ``b_Q/b_K/b_V
  [n_heads, d_head]``, ``W_O [n_heads, d_head, d_model]``, ``b_O``, ``ln1_w/ln1_b/ln2_w/ln2_b``,
  MLP ``W_in [d_model, d_mlp]``, ``b_in``, ``W_out [d_mlp, d_model]``, ``b_out`` (all views).
  The fused QKV is laid out per head: ``query_key_value.weight [3*d_model, d_model]`` views as
  ``[n_heads, 3, d_head, d_model]``.
- ``name_filter(*parts)``: a predicate over HF names for loading only what an analysis needs
  (parts: "embed", "unembed", "attn", "mlp", "ln", "final_ln"); ``is_legacy_buffer(name)``.
- ``iter_single_token_residuals`` / ``single_token_residuals(weights, token_ids, batch_size)``:
  each token fed alone (sequence length 1): ``{"pre", "attn", "post"}`` each
  ``[n_layers, n_tokens, d_model]`` where "attn" = pre + attention output.
- ``attention_scores(weights, layer, resid_pre)`` / ``attention_probs(...)``: ``[batch, n_heads,
  seq, seq]`` rebuilt from the split W_Q/W_K with biases and rotary (GPT-NeoX rotate-half style).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pythia_probe.errors import BadInputError, UnsupportedConfigError, WeightShapeError

Tensor = torch.Tensor
LEGACY_BUFFER_SUFFIXES = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
_SEMANTIC = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "layer_norm_eps", "rotary_pct", "rotary_emb_base", "rope_scaling",
    "rope_parameters", "rope_theta", "partial_rotary_factor", "use_parallel_residual",
    "tie_word_embeddings", "attention_bias", "model_type", "head_dim",
}
_IGNORED = {
    "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "max_position_embeddings", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "attention_dropout", "hidden_dropout", "classifier_dropout", "attention_probs_dropout_prob",
    "hidden_dropout_prob", "is_decoder", "_name_or_path", "name_or_path",
    "use_memory_efficient_attention",
    "output_attentions", "output_hidden_states", "return_dict", "use_return_dict",
}
_ACTS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass(frozen=True)
class NeoXConfig:
    """The GPT-NeoX hyperparameters the analyses need, in TransformerLens names."""

    d_vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_mlp: int
    rotary_dim: int
    rotary_base: float = 10000.0
    parallel_residual: bool = True
    tied_embeddings: bool = False
    ln_eps: float = 1e-5
    act_fn: str = "gelu"
    rotary_style: str = "neox"  # rotate-half over the first rotary_dim dims of each head

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, cfg: Mapping, where: str = "config") -> NeoXConfig:
        """From a config.json dict; raises :class:`UnsupportedConfigError` listing refusals
        (``where`` names the file in the message)."""
        if not isinstance(cfg, Mapping):
            raise UnsupportedConfigError(f"{where}: a GPT-NeoX config is a JSON object, got "
                                         f"{type(cfg).__name__}")
        unknown = sorted(k for k in cfg if k not in _SEMANTIC | _IGNORED)
        problems = [f"unknown fields: {', '.join(unknown)}"] if unknown else []
        try:
            problems += _unsupported_values(cfg)
            if problems:
                raise UnsupportedConfigError("; ".join(problems))
            return cls._build(cfg)
        except (UnsupportedConfigError, TypeError, ValueError, ZeroDivisionError) as err:
            raise UnsupportedConfigError(f"{where}: GPT-NeoX config refused: {err}") from err

    @classmethod
    def _build(cls, cfg: Mapping) -> NeoXConfig:
        theta, pct = _rope(cfg)
        d_model, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return cls(
            d_vocab=int(cfg["vocab_size"]), d_model=d_model, n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads, d_mlp=int(cfg["intermediate_size"]),
            rotary_dim=int((d_model // n_heads) * pct), rotary_base=float(theta),
            parallel_residual=bool(cfg.get("use_parallel_residual", True)),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            ln_eps=float(cfg.get("layer_norm_eps", 1e-5)), act_fn=cfg.get("hidden_act", "gelu"),
        )

    @classmethod
    def from_hf(cls, config) -> NeoXConfig:
        """From a transformers ``GPTNeoXConfig`` (its fields as saved to config.json)."""
        return cls.from_dict(json_safe(config.to_diff_dict()))


def json_safe(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_") or k == "_name_or_path"}


def _rope(cfg: Mapping) -> tuple[float, float]:
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    pct = cfg.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
    pct = rp.get("partial_rotary_factor", pct)
    return float(theta), float(pct)


def _unsupported_values(cfg: Mapping) -> list[str]:
    bad = []
    if cfg.get("model_type", "gpt_neox") != "gpt_neox":
        bad.append(f"model_type={cfg.get('model_type')!r} (want 'gpt_neox')")
    if cfg.get("rope_scaling") not in (None, {}):
        bad.append(f"rope_scaling={cfg['rope_scaling']!r} (only none supported)")
    rp = cfg.get("rope_parameters") or {}
    known = {"rope_type", "rope_theta", "partial_rotary_factor"}
    if rp.get("rope_type", "default") != "default" or set(rp) - known:
        bad.append(f"rope_parameters={rp!r} (only default rope supported)")
    if cfg.get("attention_bias", True) is not True:
        bad.append("attention_bias=False (Pythia has Q/K/V/O biases)")
    if cfg.get("hidden_act", "gelu") not in _ACTS:
        bad.append(f"hidden_act={cfg.get('hidden_act')!r} (supported: {', '.join(_ACTS)})")
    d, h = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if k not in cfg]
    if missing:
        bad.append(f"missing fields: {', '.join(missing)}")
    elif not all(isinstance(cfg[k], int) and cfg[k] > 0 for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size")):
        bad.append("vocab_size, hidden_size, num_hidden_layers, num_attention_heads and "
                   "intermediate_size must be positive integers")
    elif d % h or cfg.get("head_dim", d // h) != d // h:
        bad.append(f"head_dim must be hidden_size/num_attention_heads ({d}/{h})")
    return bad


# ---- names -------------------------------------------------------------------------------------
EMBED_IN = "gpt_neox.embed_in.weight"
EMBED_OUT = ("embed_out.weight", "lm_head.weight")
FINAL_LN = "gpt_neox.final_layer_norm."


def layer_prefix(i: int) -> str:
    return f"gpt_neox.layers.{i}."


def is_legacy_buffer(name: str) -> bool:
    """Buffers old .bin files carry that are not parameters (causal mask, masked_bias, inv_freq)."""
    return name.endswith(LEGACY_BUFFER_SUFFIXES)


_PARTS: dict[str, Callable[[str], bool]] = {
    "embed": lambda n: n == EMBED_IN,
    "unembed": lambda n: n in EMBED_OUT,
    "attn": lambda n: ".attention." in n and not is_legacy_buffer(n),
    "mlp": lambda n: ".mlp." in n,
    "ln": lambda n: "layernorm" in n,
    "final_ln": lambda n: n.startswith(FINAL_LN),
}


def name_filter(*parts: str) -> Callable[[str], bool]:
    """Predicate selecting the HF names of the given parts (all parts when none given)."""
    unknown = [p for p in parts if p not in _PARTS]
    if unknown:
        raise BadInputError(f"unknown parts {unknown}; valid: {', '.join(_PARTS)}")
    chosen = [_PARTS[p] for p in (parts or tuple(_PARTS))]
    return lambda name: not is_legacy_buffer(name) and any(f(name) for f in chosen)


def canonical_state_dict(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Add the ``gpt_neox.`` prefix when a bare GPTNeoXModel was saved; drop legacy buffers."""
    bare = EMBED_IN not in sd and "embed_in.weight" in sd
    out = {}
    for k, v in sd.items():
        if is_legacy_buffer(k):
            continue
        out[f"gpt_neox.{k}" if bare and k not in EMBED_OUT else k] = v
    return out


def expected_shapes(c: NeoXConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every GPT-NeoX parameter that ``c`` implies, by HF name."""
    d, v, m = c.d_model, c.d_vocab, c.d_mlp
    out = {EMBED_IN: (v, d), **{n: (v, d) for n in EMBED_OUT},
           FINAL_LN + "weight": (d,), FINAL_LN + "bias": (d,)}
    per_layer = {"attention.query_key_value.weight": (3 * d, d),
                 "attention.query_key_value.bias": (3 * d,),
                 "attention.dense.weight": (d, d), "attention.dense.bias": (d,),
                 "input_layernorm.weight": (d,), "input_layernorm.bias": (d,),
                 "post_attention_layernorm.weight": (d,), "post_attention_layernorm.bias": (d,),
                 "mlp.dense_h_to_4h.weight": (m, d), "mlp.dense_h_to_4h.bias": (m,),
                 "mlp.dense_4h_to_h.weight": (d, m), "mlp.dense_4h_to_h.bias": (d,)}
    for i in range(c.n_layers):
        out.update({layer_prefix(i) + k: s for k, s in per_layer.items()})
    return out


def check_shapes(sd: Mapping[str, Tensor], c: NeoXConfig) -> None:
    """Refuse tensors whose shapes differ from what the config implies, naming them."""
    want = expected_shapes(c)
    bad = [f"{k} is {list(v.shape)}, expected {list(want[k])}" for k, v in sd.items()
           if k in want and tuple(v.shape) != want[k]]
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise WeightShapeError(
            f"weights do not match the config (d_vocab {c.d_vocab}, d_model {c.d_model}, "
            f"n_heads {c.n_heads}, d_mlp {c.d_mlp}): {'; '.join(bad[:3])}{more}")


@dataclass(frozen=True)
class LayerWeights:
    """One layer's raw weights (views), TransformerLens shapes."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    b_Q: Tensor
    b_K: Tensor
    b_V: Tensor
    W_O: Tensor
    b_O: Tensor
    ln1_w: Tensor
    ln1_b: Tensor
    ln2_w: Tensor
    ln2_b: Tensor
    W_in: Tensor
    b_in: Tensor
    W_out: Tensor
    b_out: Tensor


class NeoXWeights:
    """Raw GPT-NeoX weights from a state dict under TransformerLens names (views, no copies)."""

    def __init__(self, state_dict: Mapping[str, Tensor], config: NeoXConfig):
        self.sd = canonical_state_dict(state_dict)
        self.cfg = config
        check_shapes(self.sd, config)

    @classmethod
    def from_module(cls, model) -> NeoXWeights:
        """From a transformers GPTNeoXForCausalLM / GPTNeoXModel (its parameters, not copies)."""
        return cls(model.state_dict(), NeoXConfig.from_hf(model.config))

    def _get(self, name: str) -> Tensor:
        if name not in self.sd:
            raise KeyError(f"tensor {name!r} not loaded (have {len(self.sd)} tensors)")
        return self.sd[name]

    @property
    def W_E(self) -> Tensor:
        """[d_vocab, d_model], the embed_in weight itself."""
        return self._get(EMBED_IN)

    @property
    def W_U(self) -> Tensor:
        """[d_model, d_vocab], a transposed view of embed_out (or of W_E when tied)."""
        if self.cfg.tied_embeddings:
            return self.W_E.T
        name = next((n for n in EMBED_OUT if n in self.sd), EMBED_OUT[0])
        return self._get(name).T

    @property
    def ln_final(self) -> tuple[Tensor, Tensor]:
        return self._get(FINAL_LN + "weight"), self._get(FINAL_LN + "bias")

    def qkv(self, i: int) -> tuple[Tensor, Tensor]:
        """Fused QKV: weight ``[n_heads, 3, d_head, d_model]``, bias ``[n_heads, 3, d_head]``."""
        c, p = self.cfg, layer_prefix(i) + "attention.query_key_value."
        w = self._get(p + "weight").view(c.n_heads, 3, c.d_head, c.d_model)
        return w, self._get(p + "bias").view(c.n_heads, 3, c.d_head)

    def layer(self, i: int) -> LayerWeights:
        if not 0 <= i < self.cfg.n_layers:
            raise IndexError(f"layer {i} out of range [0, {self.cfg.n_layers})")
        c, p = self.cfg, layer_prefix(i)
        w, b = self.qkv(i)
        g = self._get
        return LayerWeights(
            W_Q=w[:, 0].transpose(1, 2), W_K=w[:, 1].transpose(1, 2), W_V=w[:, 2].transpose(1, 2),
            b_Q=b[:, 0], b_K=b[:, 1], b_V=b[:, 2],
            W_O=g(p + "attention.dense.weight").T.unflatten(0, (c.n_heads, c.d_head)),
            b_O=g(p + "attention.dense.bias"),
            ln1_w=g(p + "input_layernorm.weight"), ln1_b=g(p + "input_layernorm.bias"),
            ln2_w=g(p + "post_attention_layernorm.weight"),
            ln2_b=g(p + "post_attention_layernorm.bias"),
            W_in=g(p + "mlp.dense_h_to_4h.weight").T, b_in=g(p + "mlp.dense_h_to_4h.bias"),
            W_out=g(p + "mlp.dense_4h_to_h.weight").T, b_out=g(p + "mlp.dense_4h_to_h.bias"),
        )


# ---- computations ------------------------------------------------------------------------------
def _ln(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), w.to(x.dtype), b.to(x.dtype), eps)


def _mlp(x: Tensor, L: LayerWeights, act: str) -> Tensor:
    h = _ACTS[act](x @ L.W_in.to(x.dtype) + L.b_in.to(x.dtype))
    return h @ L.W_out.to(x.dtype) + L.b_out.to(x.dtype)


def single_token_attn_out(x: Tensor, L: LayerWeights, eps: float) -> Tensor:
    """Attention output for sequences of length 1: each head attends to its only token."""
    z = torch.einsum("bd,hde->bhe", _ln(x, L.ln1_w, L.ln1_b, eps), L.W_V.to(x.dtype))
    z = z + L.b_V.to(x.dtype)
    return torch.einsum("bhe,hed->bd", z, L.W_O.to(x.dtype)) + L.b_O.to(x.dtype)


def iter_single_token_residuals(
    weights: NeoXWeights, token_ids: Tensor, batch_size: int = 1024, dtype=torch.float32
) -> Iterator[tuple[slice, dict[str, Tensor]]]:
    """Yield ``(slice into token_ids, {"pre","attn","post": [n_layers, b, d_model]})`` per batch."""
    c, token_ids = weights.cfg, torch.as_tensor(token_ids, dtype=torch.long)
    layers = [weights.layer(i) for i in range(c.n_layers)]
    for start in range(0, len(token_ids), batch_size):
        sl = slice(start, min(start + batch_size, len(token_ids)))
        x = weights.W_E[token_ids[sl]].to(dtype)
        out = {k: [] for k in ("pre", "attn", "post")}
        for L in layers:
            a = single_token_attn_out(x, L, c.ln_eps)
            mlp_in = x if c.parallel_residual else x + a
            post = x + a + _mlp(_ln(mlp_in, L.ln2_w, L.ln2_b, c.ln_eps), L, c.act_fn)
            for k, v in (("pre", x), ("attn", x + a), ("post", post)):
                out[k].append(v)
            x = post
        yield sl, {k: torch.stack(v) for k, v in out.items()}


def iter_single_token_layers(
    weights: NeoXWeights, token_ids: Tensor, batch_size: int = 1024, dtype=torch.float32
) -> Iterator[dict[str, Tensor]]:
    """Each token fed alone, layer by layer: ``{"pre","attn","post": [n_tokens, d_model]}`` per
    layer, so only one layer's streams are held (the same batches and operations as
    :func:`iter_single_token_residuals`, so the same numbers)."""
    c, token_ids = weights.cfg, torch.as_tensor(token_ids, dtype=torch.long)
    x = weights.W_E[token_ids].to(dtype)
    for i in range(c.n_layers):
        L = weights.layer(i)
        attn, post = torch.empty_like(x), torch.empty_like(x)
        for start in range(0, len(token_ids), batch_size):
            sl = slice(start, min(start + batch_size, len(token_ids)))
            a = single_token_attn_out(x[sl], L, c.ln_eps)
            mlp_in = x[sl] if c.parallel_residual else x[sl] + a
            attn[sl] = x[sl] + a
            post[sl] = x[sl] + a + _mlp(_ln(mlp_in, L.ln2_w, L.ln2_b, c.ln_eps), L, c.act_fn)
        yield {"pre": x, "attn": attn, "post": post}
        x = post


def single_token_residuals(
    weights: NeoXWeights, token_ids: Tensor, batch_size: int = 1024, dtype=torch.float32
) -> dict[str, Tensor]:
    """Each token fed alone: "pre", "attn", "post" each ``[n_layers, n_tokens, d_model]``."""
    parts = [r for _, r in iter_single_token_residuals(weights, token_ids, batch_size, dtype)]
    return {k: torch.cat([p[k] for p in parts], dim=1) for k in ("pre", "attn", "post")}


def final_ln(weights: NeoXWeights, x: Tensor) -> Tensor:
    w, b = weights.ln_final
    return _ln(x, w, b, weights.cfg.ln_eps)


def rotary_cos_sin(cfg: NeoXConfig, seq_len: int, dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """GPT-NeoX rotary tables ``[seq, rotary_dim]`` (frequencies repeated for rotate-half)."""
    rd = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    freqs = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first ``rotary_dim`` dims of ``x [..., seq, d_head]`` (rotate-half style)."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
    return torch.cat((xr * cos + torch.cat((-x2, x1), dim=-1) * sin, xp), dim=-1)


def attention_scores(weights: NeoXWeights, layer: int, resid_pre: Tensor) -> Tensor:
    """Scaled pre-softmax scores ``[batch, n_heads, seq_q, seq_k]`` (W_Q/W_K, biases, rotary)."""
    c, L = weights.cfg, weights.layer(layer)
    x = _ln(resid_pre, L.ln1_w, L.ln1_b, c.ln_eps)
    q = torch.einsum("bsd,hde->bhse", x, L.W_Q.to(x.dtype)) + L.b_Q.to(x.dtype)[:, None]
    k = torch.einsum("bsd,hde->bhse", x, L.W_K.to(x.dtype)) + L.b_K.to(x.dtype)[:, None]
    cos, sin = rotary_cos_sin(c, resid_pre.shape[1], x.dtype)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    return q @ k.transpose(-1, -2) / math.sqrt(c.d_head)


def attention_probs(weights: NeoXWeights, layer: int, resid_pre: Tensor) -> Tensor:
    """Causal softmax of :func:`attention_scores`."""
    s = attention_scores(weights, layer, resid_pre)
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return s.masked_fill(mask, float("-inf")).softmax(-1)
