"""Beyond the paper: the model's attention on real text against the Eq. 13 prediction.

Eq. 13's attention pattern is S(Mask(X Qbar X^T + DM(Delta))): query position t attends to key
j <= t with logit Qbar[x_t, x_j] + Delta[t - j]. Its scale (the coefficient of Theorem 4.1) is
not defined for a trained model, so the score is scale-free: for each query row, the Pearson
correlation over the causal keys j <= t between the model's log attention probabilities and the
predicted logits (both centred over the row; a log-softmax row differs from the scores only by a
constant, so this is the correlation of the model's attention scores with the prediction).
Reported per layer for the head-mean of log probabilities and per head, for the full
prediction and for its token (Qbar) and positional (Delta) terms separately (see
:func:`eq13_rows`), averaged over every query row with at least two keys.
Probabilities are clamped at 1e-30 before the log. Needs full-vocabulary statistics.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from pythia_probe.analysis.base import Analysis, Cost, Needs, Options, StepTensors
from pythia_probe.analysis.factored import FactoredTarget
from pythia_probe.errors import BadInputError

TINY = 1e-30


def predicted_logits(tokens: Tensor, Qbar: Tensor, Delta: Tensor) -> Tensor:
    """[B, T, T]: Qbar[x_t, x_j] + Delta[t - j] for j <= t (0 above the diagonal)."""
    B, T = tokens.shape
    if T > Delta.shape[0]:
        raise BadInputError(f"text of {T} positions is longer than the statistics' T="
                            f"{Delta.shape[0]}; cut the text to at most T tokens")
    x = tokens.long()
    offset = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0)
    logits = Qbar[x[:, :, None], x[:, None, :]] + Delta[offset]
    return logits * torch.ones(T, T, dtype=torch.bool).tril()


def row_correlation(a: Tensor, p: Tensor) -> Tensor:
    """Mean over query rows t >= 1 of corr(a[t, :t+1], p[t, :t+1]); a, p [..., T, T]."""
    T = a.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    n = torch.arange(1, T + 1, dtype=a.dtype)[:, None]
    ac = torch.where(mask, a - (a * mask).sum(-1, keepdim=True) / n, 0)
    pc = torch.where(mask, p - (p * mask).sum(-1, keepdim=True) / n, 0)
    den = ac.norm(dim=-1) * pc.norm(dim=-1)
    r = (ac * pc).sum(-1) / den
    ok = (den > 0)[..., 1:]
    return r[..., 1:][ok].mean()


_MODELS: dict[str, object] = {}


def _skeleton(config: Mapping, device: str):
    """One float32 GPTNeoXForCausalLM per config, built once and refilled every step."""

    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    key = json.dumps(dict(config), sort_keys=True, default=str) + device
    if key not in _MODELS:
        _MODELS.clear()
        cfg = GPTNeoXConfig.from_dict(dict(config), attn_implementation="eager")
        _MODELS[key] = GPTNeoXForCausalLM(cfg).float().eval().to(device)
    return _MODELS[key]


def model_attention(config: Mapping, tensors: Mapping[str, Tensor], tokens: Tensor,
                    device: str = "cpu") -> list[Tensor]:
    """Per-layer attention probabilities [B, n_heads, T, T] from transformers' GPT-NeoX (eager).

    Every parameter of the transformer body must be in ``tensors``; the unembedding is unused.
    The model runs in float32 on ``device``.
    """
    model = _skeleton(config, device)
    sd = {k: v for k, v in tensors.items() if k.startswith("gpt_neox.")}
    missing, _ = model.gpt_neox.load_state_dict(
        {k[len("gpt_neox."):]: v for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing:
        raise KeyError(f"weights missing for the text forward pass: {missing[:5]}")
    with torch.no_grad():
        out = model.gpt_neox(input_ids=tokens.long().to(device), output_attentions=True)
    return [a.double().cpu() for a in out.attentions]


def eq13_rows(attentions: Sequence[Tensor], tokens: Tensor, Qbar: Tensor, Delta: Tensor,
              per_head: bool = True) -> list[dict]:
    """Rows per layer (head null) and per head of the Eq. 13 correlations on ``tokens``;
    layers numbered from 1 (``attentions[0]`` is layer 1).

    Metrics: ``corr_eq13`` (Qbar + Delta, the full prediction), ``corr_qbar`` (the token term
    alone) and ``corr_delta`` (the positional term alone) for the head-mean; ``corr_eq13_head``
    and ``corr_qbar_head`` per head. At corpus scale Delta is typically orders of magnitude
    larger than Qbar, so the full prediction is mostly positional.
    """
    Qbar, Delta = Qbar.double().cpu(), Delta.double().cpu()
    preds = {"eq13": predicted_logits(tokens, Qbar, Delta),
             "qbar": predicted_logits(tokens, Qbar, torch.zeros_like(Delta)),
             "delta": predicted_logits(torch.zeros_like(tokens), torch.zeros_like(Qbar), Delta)}
    n, rows = tokens.numel(), []
    for layer, A in enumerate(attentions):
        logA = A.cpu().clamp_min(TINY).log()
        for name, pred in preds.items():
            rows.append({"analysis": "attention_text", "layer": layer + 1, "head": None,
                         "metric": f"corr_{name}", "n": n,
                         "value": float(row_correlation(logA.mean(1), pred))})
        for h in range(logA.shape[1] if per_head else 0):
            rows += [{"analysis": "attention_text", "layer": layer + 1, "head": h,
                      "metric": f"corr_{name}_head", "n": n,
                      "value": float(row_correlation(logA[:, h], preds[name]))}
                     for name in ("eq13", "qbar")]
    return rows


def _run(x: StepTensors, th: Mapping[str, FactoredTarget], opts: Options) -> list[dict]:
    if x.text_attn is None or x.text_tokens is None:
        raise BadInputError("attention_text needs real text: give the sweep --text TOKENS_FILE")
    return eq13_rows(x.text_attn, x.text_tokens, opts.raw["Qbar"], opts.raw["Delta"],
                     per_head=opts.per_head is not False)


ATTENTION_TEXT = Analysis(
    "attention_text", Needs(weights=("embed", "attn", "mlp", "ln", "final_ln"), text=True,
                            raw=("Qbar", "Delta")), _run, lambda s: Cost())
