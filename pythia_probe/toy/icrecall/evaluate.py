"""Accuracy (true two-step decoding, argmax and sampled at the memory's temperature; all,
confusing, non-confusing), probability of the truth, and the attention pattern."""

from __future__ import annotations

import torch

from pythia_probe.errors import BadInputError
from pythia_probe.toy.icrecall.intervals import bootstrap
from pythia_probe.toy.icrecall.model import _pick
from pythia_probe.toy.icrecall.task import Prompts


def accuracy_metrics(r_hat: torch.Tensor, a_hat: torch.Tensor,
                     prompts: Prompts) -> dict[str, float]:
    """relation_acc, answer_acc, both split by confusing / nonconfusing; counts as n_*."""
    r_ok = (r_hat == prompts.relation).double()
    a_ok = (a_hat == prompts.answers[:, -1]).double()
    out: dict[str, float] = {"n_prompts": float(len(prompts))}
    masks = {"": torch.ones_like(r_ok, dtype=torch.bool), "_confusing": prompts.confusing,
             "_nonconfusing": ~prompts.confusing}
    for suffix, m in masks.items():
        n = int(m.sum())
        out[f"n{suffix or '_all'}"] = float(n)
        nan = float("nan")
        out[f"relation_acc{suffix}"] = float(r_ok[m].mean()) if n else nan
        out[f"answer_acc{suffix}"] = float(a_ok[m].mean()) if n else nan
    return out


def pattern_metrics(row: torch.Tensor) -> dict[str, float]:
    """Named weights of the relation-step row over (s1, a1, .., sk, ak, s_{k+1}, ?) and summaries:
    pair_gap_max = max_i |v_si - v_ai|; offpair_mass = v_{s_{k+1}} + v_?; pair_mass_min/max;
    pattern_dist = L2 distance to the subspace of pairwise patterns (c1, c1, .., ck, ck, 0, 0)
    = sqrt(sum_i (v_si - v_ai)^2 / 2 + v_{s_{k+1}}^2 + v_?^2)."""
    v = row.detach().double().flatten()
    if v.numel() < 4 or v.numel() % 2:
        raise BadInputError(f"relation row must have 2k+2 >= 4 entries, got {v.numel()}")
    k = (v.numel() - 2) // 2
    s, a = v[0:2 * k:2], v[1:2 * k:2]
    out = {f"attn_s{i + 1}": float(s[i]) for i in range(k)}
    out.update({f"attn_a{i + 1}": float(a[i]) for i in range(k)})
    out["attn_s_query"], out["attn_last"] = float(v[2 * k]), float(v[2 * k + 1])
    pair = s + a
    out["pair_gap_max"] = float((s - a).abs().max())
    out["offpair_mass"] = float(v[2 * k:].sum())
    out["pair_mass_min"], out["pair_mass_max"] = float(pair.min()), float(pair.max())
    out["pattern_dist"] = float((((s - a) ** 2).sum() / 2 + (v[2 * k:] ** 2).sum()).sqrt())
    return out


@torch.no_grad()
def evaluate(model, prompts: Prompts, temperature: float = 0.0, seed: int = 0,
             batch: int = 4096, answers: bool = True, n_boot: int = 1000) -> dict[str, float]:
    """Decode ``prompts`` in batches; return accuracy, probability and pattern metrics.

    relation_acc / answer_acc: two-step decoding at ``temperature`` (0 = argmax, the paper's
    low-temperature decoding; reported, but argmax breaks ties on vanishing vote differences);
    relation_sampled / answer_sampled: two-step decoding by sampling at the memory's own
    temperature (softmax of its logits, inverse temperature beta included); relation_prob /
    answer_prob: mean probability of the true relation at "?" and of the true answer given the
    true r* (the expected sampled accuracy); each overall and on _confusing / _nonconfusing
    prompts, with relation_prob_confusing_lo / _hi a percentile bootstrap 95% interval over the
    confusing prompts. answers=False skips the answer step (its metrics are NaN)."""
    g = torch.Generator().manual_seed(seed)
    parts = [_decode_batch(model, _slice(prompts, slice(i, i + batch)), temperature, g, answers)
             for i in range(0, len(prompts), batch)]
    cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out = accuracy_metrics(cat["r_dec"], cat["a_dec"], prompts)
    sampled = accuracy_metrics(cat["r_smp"], cat["a_smp"], prompts)
    out.update({k.replace("_acc", "_sampled"): v for k, v in sampled.items() if "_acc" in k})
    out.update(prob_metrics(cat["pr"], cat["pa"], prompts))
    conf = cat["pr"][prompts.confusing].numpy()
    out["relation_prob_confusing_lo"], out["relation_prob_confusing_hi"] = bootstrap(
        conf, n_boot=n_boot, seed=seed)
    out.update(pattern_metrics(model.attention_row(model.q_rel)))
    out["ans_attn_s_query"] = float(model.attention_row(model.q_ans).detach()[-3])
    if not answers:
        out = {k: (float("nan") if k.startswith("answer_") else v) for k, v in out.items()}
    return out


def _decode_batch(model, p: Prompts, temperature: float, g: torch.Generator,
                  answers: bool) -> dict[str, torch.Tensor]:
    """Decoded (r_dec, a_dec at ``temperature``; r_smp, a_smp sampled at the memory's
    temperature) and the true-token probabilities pr, pa for one batch."""
    tokens = p.tokens(model.kb)
    rl = model.relation_logits(tokens).double()
    probs = torch.softmax(rl, -1)
    out = {"r_dec": _pick(rl, temperature, g),
           "r_smp": torch.multinomial(probs, 1, generator=g)[:, 0],
           "pr": probs.gather(1, p.relation[:, None])[:, 0]}
    if not answers:
        nan = torch.full_like(out["pr"], float("nan"))
        return {**out, "a_dec": torch.full_like(out["r_dec"], -1),
                "a_smp": torch.full_like(out["r_dec"], -1), "pa": nan}
    pa = torch.softmax(model.answer_logits(tokens).double(), -1)
    out["pa"] = pa.gather(1, p.answers[:, -1:])[:, 0]
    for r_key, a_key, temp in (("r_dec", "a_dec", temperature), ("r_smp", "a_smp", 1.0)):
        tokens[:, -1] = model.kb.relation_token(out[r_key])
        out[a_key] = _pick(model.answer_logits(tokens).double(), temp, g)
    return out


def prob_metrics(pr: torch.Tensor, pa: torch.Tensor, prompts: Prompts) -> dict[str, float]:
    """relation_prob / answer_prob, overall and on confusing / non-confusing prompts."""
    out = {}
    masks = {"": torch.ones_like(pr, dtype=torch.bool), "_confusing": prompts.confusing,
             "_nonconfusing": ~prompts.confusing}
    for suffix, m in masks.items():
        ok = bool(m.any())
        out[f"relation_prob{suffix}"] = float(pr[m].mean()) if ok else float("nan")
        out[f"answer_prob{suffix}"] = float(pa[m].mean()) if ok else float("nan")
    return out


def _slice(p: Prompts, sl: slice) -> Prompts:
    return Prompts(p.subjects[sl], p.answers[sl], p.relation[sl], p.ambiguous[sl])
