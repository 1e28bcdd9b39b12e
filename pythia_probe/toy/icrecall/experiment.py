"""One fine-tuning experiment end to end, and its tidy result rows."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from pythia_probe.errors import BadInputError
from pythia_probe.results import make_rows
from pythia_probe.toy.icrecall.config import EvalConfig
from pythia_probe.toy.icrecall.evaluate import evaluate, pattern_metrics
from pythia_probe.toy.icrecall.memory import ConstructedMemory, MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.pretrained import PretrainedMemory, pretrain
from pythia_probe.toy.icrecall.task import KnowledgeBase, TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig, TrainResult, train

MODEL = "icrecall"


@dataclass
class Outcome:
    metrics: dict[str, float]
    result: TrainResult
    model: ICRecallModel
    kb: KnowledgeBase
    info: dict = field(default_factory=dict)


def memory_for_k(cfg: MemoryConfig, k: int, k_ref: int = 2) -> MemoryConfig:
    """Rescale the andprod memory built for k_ref pairs to prompts with k pairs.

    A pair's product read-out is 1/(2k+2)^2 under uniform attention and 1/(4k^2) under the pairwise
    pattern; the threshold keeps its relative place between the two, beta keeps beta * margin and
    smooth keeps smooth / margin (margin = pattern product - threshold)."""
    if cfg.vote != "andprod" or k == k_ref:
        return cfg

    def ends(kk: int) -> tuple[float, float]:
        return 1 / (2 * kk + 2) ** 2, 1 / (4 * kk**2)

    (u0, p0), (u1, p1) = ends(k_ref), ends(k)
    lam = (cfg.threshold - u0) / (p0 - u0)
    t1 = u1 + lam * (p1 - u1)
    ratio = (p1 - t1) / (p0 - cfg.threshold)
    return replace(cfg, threshold=t1, beta=cfg.inverse_temperature / ratio,
                   smooth=cfg.smooth * ratio)


def build_memory(kb: KnowledgeBase, cfg: MemoryConfig, progress: bool = False):
    """The frozen memory of ``cfg.kind`` (pre-training it first when kind == 'pretrained')."""
    if cfg.kind == "constructed":
        return ConstructedMemory(kb, cfg), {}
    mem = PretrainedMemory(kb, cfg)
    losses = pretrain(mem, progress=progress)
    return mem, {"pretrain_final_loss": losses[-1]}


def run_experiment(task: TaskConfig, mem_cfg: MemoryConfig, tr: TrainConfig, ev: EvalConfig,
                   memory=None, progress: bool = False, scale_for_k: bool = False) -> Outcome:
    """Build (or reuse) the memory, fine-tune W_PP on n_train prompts, evaluate on fresh ones.
    scale_for_k: rescale an andprod memory to task.k_pairs with :func:`memory_for_k`. With
    tr.answer_weight == 0 only the relation column is trained and the answer step is not
    evaluated (its metrics are dropped)."""
    torch.manual_seed(tr.seed)
    kb = make_kb(task)
    mem_cfg = memory_for_k(mem_cfg, task.k_pairs) if scale_for_k else mem_cfg
    info: dict = {}
    if memory is None:
        memory, info = build_memory(kb, mem_cfg, progress)
    model = ICRecallModel(kb, memory)
    train_prompts = sample_prompts(kb, tr.n_train, seed=tr.seed)
    monitor, answers = None, tr.answer_weight > 0
    if ev.n_monitor:
        mon_prompts = sample_prompts(kb, ev.n_monitor, seed=ev.test_seed + 1)
        keep = ("relation_acc", "relation_acc_confusing", "relation_prob",
                "relation_prob_confusing", "answer_acc")

        def monitor(m):
            return {k: v for k, v in evaluate(m, mon_prompts, ev.temperature, answers=answers,
                                              n_boot=1).items() if k in keep}
    res = train(model, train_prompts, tr, monitor=monitor, progress=progress)
    test = sample_prompts(kb, ev.n_test, seed=ev.test_seed)
    metrics = evaluate(model, test, ev.temperature, seed=ev.test_seed, answers=answers)
    metrics["final_train_loss"] = res.history[-1]["loss"]
    metrics.update(info)
    return Outcome(metrics, res, model, kb, info)


def metric_rows(metrics: dict[str, float], analysis: str, step: int, n: int | None = None,
                **common) -> pd.DataFrame:
    """Tidy rows (model='icrecall') for a dict of metrics; NaN metrics are dropped."""
    rows = [{"metric": k, "value": float(v), "step": step, "n": n}
            for k, v in metrics.items() if v == v]
    return make_rows(rows, model=MODEL, analysis=analysis, dtype="float32", **common)


def history_rows(res: TrainResult, analysis: str, **common) -> pd.DataFrame:
    """One row per (logged step, metric) of a training history, plus the snapshot rows."""
    rows = [{"metric": k, "value": v, "step": int(h["step"])}
            for h in res.history for k, v in h.items() if k != "step" and v == v]
    for name, row in res.snapshots.items():
        rows += [{"metric": f"snapshot_{name}_{k}", "value": v, "step": None}
                 for k, v in pattern_metrics(row).items()]
    return make_rows(rows, model=MODEL, analysis=analysis, dtype="float32", **common)


# Reference attention rows at '?' over (s1, a1, s2, a2, s3, ?): what a verdict measure must fail
# (uniform; the one-pair GD state the first review found stuck; all mass on one pair) or pass
# (the ideal pairwise pattern). The stuck row is the state quoted in issue #12.
CONTROL_ROWS = {
    "uniform": (1 / 6,) * 6,
    "stuck": (0.273, 0.273, 0.134, 0.134, 0.093, 0.093),
    "one_pair": (0.5, 0.5, 0.0, 0.0, 0.0, 0.0),
    "ideal": (0.25, 0.25, 0.25, 0.25, 0.0, 0.0),
}


@torch.no_grad()
def set_rows(model: ICRecallModel, relation_row, answer_row=None, floor: float = 1e-9) -> None:
    """Set W_PP so the attention row at '?' is ``relation_row`` and the row at r* is
    ``answer_row`` (default: all mass on the query subject); zeros become ``floor``."""
    model.W_PP.zero_()
    L = model.L
    if answer_row is None:
        answer_row = [0.0] * (L - 3) + [1.0, 0.0, 0.0]
    for q, row in ((model.q_rel, relation_row), (model.q_ans, answer_row)):
        v = torch.tensor(row, dtype=torch.float64).clamp_min(floor)
        if v.numel() != q + 1:
            raise BadInputError(f"row at position {q} needs {q + 1} entries, got {v.numel()}")
        model.W_PP[: q + 1, q] = torch.log(v / v.sum()).to(model.W_PP.dtype)


def evaluate_controls(model: ICRecallModel, prompts, seed: int = 0,
                      rows: dict | None = None) -> dict[str, dict[str, float]]:
    """Metrics of :func:`evaluate` for each reference row (W_PP restored afterwards). The uniform
    control is W_PP = 0 (both rows uniform); the others use the ideal answer row."""
    W0 = model.W_PP.detach().clone()
    out = {}
    for name, row in (CONTROL_ROWS if rows is None else rows).items():
        if name == "uniform":
            with torch.no_grad():
                model.W_PP.zero_()
        else:
            set_rows(model, row)
        out[name] = evaluate(model, prompts, seed=seed)
    with torch.no_grad():
        model.W_PP.copy_(W0)
    return out
