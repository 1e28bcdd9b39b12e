"""Accuracy (true two-step decoding; all, confusing, non-confusing) and the attention pattern."""

from __future__ import annotations

import torch

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
        raise ValueError(f"relation row must have 2k+2 >= 4 entries, got {v.numel()}")
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
             batch: int = 4096) -> dict[str, float]:
    """Decode ``prompts`` in batches and return accuracy plus the relation-row pattern metrics."""
    r_parts, a_parts, pr_parts, pa_parts = [], [], [], []
    for i in range(0, len(prompts), batch):
        sub = _slice(prompts, slice(i, i + batch))
        r, a = model.decode(sub, temperature, seed + i)
        r_parts.append(r)
        a_parts.append(a)
        pr, pa = correct_probs(model, sub)
        pr_parts.append(pr)
        pa_parts.append(pa)
    out = accuracy_metrics(torch.cat(r_parts), torch.cat(a_parts), prompts)
    out.update(prob_metrics(torch.cat(pr_parts), torch.cat(pa_parts), prompts))
    out.update(pattern_metrics(model.attention_row(model.q_rel)))
    ans_row = model.attention_row(model.q_ans).detach()
    out["ans_attn_s_query"] = float(ans_row[-3])
    return out


@torch.no_grad()
def correct_probs(model, prompts: Prompts) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probability (memory logits at their inverse temperature beta) of the true relation
    at "?" and of the true answer given the true r*: the expected accuracy of sampling, which
    exposes ties that argmax breaks on vanishing differences."""
    tokens = prompts.tokens(model.kb)
    pr = torch.softmax(model.relation_logits(tokens).double(), -1)
    pa = torch.softmax(model.answer_logits(tokens).double(), -1)
    return (pr.gather(1, prompts.relation[:, None])[:, 0],
            pa.gather(1, prompts.answers[:, -1:])[:, 0])


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
