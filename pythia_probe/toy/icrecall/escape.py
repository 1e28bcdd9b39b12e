"""Time to escape the confused state, per run: how long plain GD and PGD (and each of PGD's two
ingredients alone) take until the relation step tells the true relation from the confusing one.

A run has escaped at step t when P(correct relation | confusing prompt), measured on fixed fresh
confusing prompts every ``check_every`` steps, is >= ``level`` at t and at every check of the
next ``confirm`` steps (so a run that touches the level and falls back has not escaped). A run
that has not escaped by ``max_steps`` is censored there: its time to escape is only known to be
larger. Paired seeds share their training prompts (and perturbation draws where two arms both
perturb), so arms are compared seed by seed.

Arms (the 2x2 ablation of Algorithm 1): ``gd`` (small steps from 0), ``large_only`` (the large
first step eta0, no perturbation), ``perturb_only`` (the perturbation, first step eta), ``pgd``
(both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from pythia_probe.errors import BadInputError
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.task import KnowledgeBase, Prompts, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig, train

ARMS = {  # name -> (large step, perturbation)
    "gd": (False, False), "large_only": (True, False), "perturb_only": (False, True),
    "pgd": (True, True)}


@dataclass(frozen=True)
class EscapeConfig:
    """level: P(correct | confusing) counted as escaped; confirm: steps it must hold; max_steps:
    the censoring step; check_every: steps between checks; n_monitor: fresh confusing prompts
    of the check."""

    level: float = 0.95
    confirm: int = 1000
    max_steps: int = 50000
    check_every: int = 10
    n_monitor: int = 200

    def __post_init__(self) -> None:
        if not 0 < self.level < 1 or self.confirm < 0 or self.check_every < 1:
            raise BadInputError(f"need 0 < level < 1, confirm >= 0, check_every >= 1: {self}")
        if self.max_steps < 2 or self.n_monitor < 1:
            raise BadInputError(f"need max_steps >= 2 and n_monitor >= 1: {self}")


def arm_config(arm: str, seed: int, n_train: int, steps: int, log_every: int,
               base: TrainConfig | None = None) -> TrainConfig:
    """The TrainConfig of one ablation arm (``base``: eta, eta0, rho_p and the rest)."""
    if arm not in ARMS:
        raise BadInputError(f"unknown arm {arm!r}; valid: {', '.join(ARMS)}")
    large, pert = ARMS[arm]
    b = base or TrainConfig()
    return TrainConfig(method="pgd" if large or pert else "gd", n_train=n_train, steps=steps,
                       seed=seed, log_every=log_every, eta=b.eta, eta0=b.eta0 if large else b.eta,
                       rho_p=b.rho_p if pert else 0.0, perturb=b.perturb,
                       answer_weight=b.answer_weight)


def confusing_prompts(kb: KnowledgeBase, n: int, seed: int) -> Prompts:
    """``n`` fresh confusing prompts (drawn from the prompt stream of ``seed``)."""
    parts, have, draw = [], 0, 0
    while have < n:
        p = sample_prompts(kb, max(4 * n, 64), seed=seed + 7919 * draw)
        idx = p.confusing.nonzero().flatten()[: n - have]
        parts.append(Prompts(p.subjects[idx], p.answers[idx], p.relation[idx], p.ambiguous[idx]))
        have, draw = have + len(idx), draw + 1
    return Prompts(*(torch.cat([getattr(q, f) for q in parts]) for f in
                     ("subjects", "answers", "relation", "ambiguous")))


def confusing_monitor(kb: KnowledgeBase, n: int, seed: int):
    """monitor(model) -> {"relation_prob_confusing": mean P(true relation) on n fresh confusing
    prompts at the memory's temperature} (the relation step only: cheap enough for every
    check)."""
    p = confusing_prompts(kb, n, seed)
    tokens = p.tokens(kb)

    @torch.no_grad()
    def monitor(model: ICRecallModel) -> dict[str, float]:
        probs = torch.softmax(model.relation_logits(tokens).double(), -1)
        return {"relation_prob_confusing": float(probs.gather(1, p.relation[:, None]).mean())}

    return monitor


def streak_start(history: list[dict], level: float,
                 metric: str = "relation_prob_confusing") -> float:
    """First step of the final run of records with ``metric`` >= level (nan if the last record
    is below it)."""
    start = float("nan")
    for h in reversed(history):
        if h[metric] < level:
            break
        start = h["step"]
    return start


def escape_stop(level: float, confirm: int):
    """stop(history) for :func:`~pythia_probe.toy.icrecall.train.train`: True once the metric
    has held >= level for ``confirm`` steps."""
    def stop(history: list[dict]) -> bool:
        start = streak_start(history, level)
        return start == start and history[-1]["step"] - start >= confirm
    return stop


@dataclass(frozen=True)
class Escape:
    """step: time to escape (nan when censored); censored: not escaped by the last step run;
    steps_run: steps trained; final: the last checked P(correct | confusing)."""

    step: float
    censored: bool
    steps_run: int
    final: float


def escape_of(history: list[dict], cfg: EscapeConfig) -> Escape:
    """The :class:`Escape` of a history trained with :func:`escape_stop`."""
    start = streak_start(history, cfg.level)
    last = history[-1]["step"]
    held = start == start and last - start >= cfg.confirm
    return Escape(start if held else math.nan, not held, int(last) + 1,
                  float(history[-1]["relation_prob_confusing"]))


def run_escape(model: ICRecallModel, train_prompts: Prompts, tr: TrainConfig, cfg: EscapeConfig,
               monitor) -> Escape:
    """Train ``model`` from W_PP = 0 with ``tr`` (its steps and log_every replaced by
    cfg.max_steps and cfg.check_every) until it escapes or reaches max_steps."""
    tr = replace(tr, steps=cfg.max_steps, log_every=cfg.check_every)
    res = train(model, train_prompts, tr, monitor=monitor,
                stop=escape_stop(cfg.level, cfg.confirm))
    return escape_of(res.history, cfg)
