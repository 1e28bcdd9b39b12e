"""Fine-tuning W_PP: perturbed gradient descent (Algorithm 1) and plain gradient descent.

PGD: from W_PP = 0, one large full-batch step (eta0), then a random perturbation (uniform in a ball
or Gaussian, radius rho_p, on the causal entries), then small steps (eta). GD: small steps from 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from pythia_probe.toy.icrecall.config import (  # noqa: F401 - the trainer's names
    METHODS,
    PERTURBATIONS,
    TrainConfig,
)
from pythia_probe.toy.icrecall.evaluate import pattern_metrics
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.task import Prompts


@dataclass
class TrainResult:
    """history: dicts (step, loss, loss_relation, loss_answer, [monitor metrics], attn_*);
    snapshots: name -> relation-step attention row (init, after_large_step, after_perturbation,
    end)."""

    history: list[dict[str, float]] = field(default_factory=list)
    snapshots: dict[str, torch.Tensor] = field(default_factory=dict)


def causal_mask(L: int) -> torch.Tensor:
    """(L, L) bool: entry [j, q] is used by the attention rows (key j <= query q)."""
    return torch.ones(L, L, dtype=torch.bool).triu()


def perturbation(L: int, rho: float, kind: str, g: torch.Generator,
                 dtype=torch.float32) -> torch.Tensor:
    """Random (L, L) matrix on the causal entries: uniform in the rho-ball or N(0, rho^2/m)."""
    mask = causal_mask(L)
    m = int(mask.sum())
    z = torch.randn(m, generator=g, dtype=torch.float64)
    if kind == "ball":
        z = z / z.norm() * rho * float(torch.rand(1, generator=g, dtype=torch.float64)) ** (1 / m)
    else:
        z = z * rho / m**0.5
    out = torch.zeros(L, L, dtype=torch.float64)
    out[mask] = z
    return out.to(dtype)


def gd_step(model: ICRecallModel, train: Prompts, lr: float, aw: float) -> dict[str, float]:
    """One full-batch gradient step on W_PP; returns the losses before it."""
    model.zero_grad()
    losses = model.loss(train, aw)
    losses["loss"].backward()
    with torch.no_grad():
        model.W_PP -= lr * model.W_PP.grad
    return {k: float(v.detach()) for k, v in losses.items()}


def train(model: ICRecallModel, train_prompts: Prompts, cfg: TrainConfig,
          monitor=None, progress: bool = False, stop=None) -> TrainResult:
    """Fine-tune ``model.W_PP`` in place from zero. ``monitor(model) -> dict`` is called every
    log_every steps (e.g. accuracy on fresh prompts) and merged into the history;
    ``stop(history) -> bool``, called after each record, ends training early when True
    (cfg.steps is then the most steps run)."""
    res = TrainResult()
    g = torch.Generator().manual_seed(cfg.seed + 104729)
    with torch.no_grad():
        model.W_PP.zero_()
    res.snapshots["init"] = model.attention_row(model.q_rel).detach().clone()
    for t in tqdm(range(cfg.steps), disable=not progress, desc=f"icrecall {cfg.method}"):
        large = cfg.method == "pgd" and t == 0
        losses = gd_step(model, train_prompts, cfg.eta0 if large else cfg.eta, cfg.answer_weight)
        if large:
            res.snapshots["after_large_step"] = model.attention_row(model.q_rel).detach().clone()
            with torch.no_grad():
                model.W_PP += perturbation(model.L, cfg.rho_p, cfg.perturb, g, model.W_PP.dtype)
            res.snapshots["after_perturbation"] = model.attention_row(model.q_rel).detach().clone()
        if t % cfg.log_every == 0 or t == cfg.steps - 1:
            res.history.append(_record(model, t, losses, monitor))
            if stop is not None and stop(res.history):
                break
    res.snapshots["end"] = model.attention_row(model.q_rel).detach().clone()
    return res


def _record(model: ICRecallModel, t: int, losses: dict[str, float], monitor) -> dict[str, float]:
    """Losses are those at the start of step t (before its update); patterns after it."""
    rec = {"step": float(t), **losses}
    rec.update(pattern_metrics(model.attention_row(model.q_rel)))
    if monitor is not None:
        rec.update(monitor(model))
    return rec
