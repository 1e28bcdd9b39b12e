"""Section C item 5: the same fine-tuning with a memory pre-trained by gradient descent.

An MLP memory (pretrained.py: fresh examples every epoch) is trained by Adam on the triples, on
two-pair prompts and on whole prompts read through random attention rows (s3 and '?' included:
the inputs it meets in fine-tuning), every relation example labelled by the AND rule (a pair
counts only when the product of its two weights exceeds ``threshold``; none counted: blank), so
that attention spread over the whole prompt cannot do the task; frozen, and W_PP is fine-tuned on
top of it (PGD and plain GD) with the CLI's defaults. Also: the memory's own recall of the
triples with ideal inputs, the reference rows (uniform, stuck, one pair, ideal) on this memory,
and one PGD run (seed 0) trained ``long_steps`` steps with its pattern every 1,000 steps and the
training loss of the ideal row on its prompts beside it (does the pattern come with more
steps?). Writes
results/icrecall/pretrained.parquet and pretrained.png.

    python analyses/icrecall_pretrained.py          # ~50 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone

import torch
from icrecall_main import _print, controls

from pythia_probe.cli import parse_config, run_main
from pythia_probe.results import write_manifest
from pythia_probe.toy.icrecall.experiment import (
    CONTROL_ROWS,
    EvalConfig,
    history_rows,
    metric_rows,
    run_experiment,
    set_rows,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.pretrained import PretrainedMemory, pretrain
from pythia_probe.toy.icrecall.report import (
    OUT,
    config_dict,
    outcome_rows,
    plot_rows,
    save,
    savefig,
    subplots,
)
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig

_MEM = MemoryConfig(kind="pretrained")


@dataclass(frozen=True)
class Config:
    """Memory: d_model, d_hidden, epochs, lr, mix, rows, threshold, row_law, row_sigma, beta
    (defaults: MemoryConfig's for kind='pretrained', i.e. what the CLI uses); fine-tuning:
    seeds, n_train, methods (TrainConfig defaults otherwise, as in the CLI); n_test fresh
    prompts."""

    d_model: int = _MEM.d_model
    d_hidden: int = _MEM.d_hidden
    epochs: int = _MEM.pretrain_epochs
    lr: float = _MEM.pretrain_lr
    mix: float = _MEM.pretrain_mix
    rows: float = _MEM.pretrain_rows
    threshold: float = _MEM.pretrain_threshold
    row_law: str = _MEM.pretrain_row_law
    row_sigma: float = _MEM.pretrain_row_sigma
    beta: float = _MEM.inverse_temperature
    seeds: int = 5
    n_train: int = 32
    methods: str = "pgd,gd"
    n_test: int = 20000
    long_steps: int = 20000

    def memory(self) -> MemoryConfig:
        return MemoryConfig(kind="pretrained", d_model=self.d_model, d_hidden=self.d_hidden,
                            pretrain_epochs=self.epochs, pretrain_lr=self.lr,
                            pretrain_mix=self.mix, pretrain_rows=self.rows,
                            pretrain_threshold=self.threshold, pretrain_row_law=self.row_law,
                            pretrain_row_sigma=self.row_sigma, beta=self.beta)


@torch.no_grad()
def memory_recall(mem: PretrainedMemory) -> dict[str, float]:
    """Recall of every stored triple with ideal inputs: answer from e_s + e_r; relation from
    e_s + e_a counted correct when r is among the relations consistent with (s, a)."""
    kb = mem.kb
    S, R = kb.cfg.n_subjects, kb.cfg.n_relations
    s, r = (t.flatten() for t in torch.meshgrid(torch.arange(S), torch.arange(R), indexing="ij"))
    a = kb.f[s, r]
    ans = mem.answer_logits(torch.stack([s, kb.relation_token(r)], 1), torch.ones(2)).argmax(-1)
    rel = mem.relation_logits(torch.stack([s, kb.answer_token(a)], 1), torch.ones(2)).argmax(-1)
    return {"memory_answer_recall": float((ans == a).double().mean()),
            "memory_relation_consistent": float((kb.f[s, rel] == a).double().mean())}


def long_run(cfg: Config, task: TaskConfig, mcfg: MemoryConfig, mem: PretrainedMemory) -> list:
    """PGD seed 0 for cfg.long_steps steps: its history (every 1,000 steps), final metrics and
    the training loss the ideal row would have on the same prompts."""
    tr = TrainConfig(n_train=cfg.n_train, seed=0, steps=cfg.long_steps, log_every=1000)
    out = run_experiment(task, mcfg, tr, EvalConfig(n_test=cfg.n_test, n_monitor=0), memory=mem)
    p = sample_prompts(out.kb, cfg.n_train, seed=0)
    W = out.model.W_PP.detach().clone()
    set_rows(out.model, CONTROL_ROWS["ideal"])
    with torch.no_grad():
        ideal_loss = float(out.model.loss(p)["loss"])
        out.model.W_PP.copy_(W)
    m = {**out.metrics, "ideal_row_train_loss": ideal_loss}
    _print(f"pgd seed 0, {cfg.long_steps} steps", m)
    print(f"  training loss {m['final_train_loss']:.2e} (the ideal row's on the same prompts "
          f"{ideal_loss:.2e})", flush=True)
    return [outcome_rows(out, "icrecall_pretrained_long", tr.steps, method="pgd", seed=0,
                         n_train=cfg.n_train),
            metric_rows({"ideal_row_train_loss": ideal_loss}, "icrecall_pretrained_long_ideal",
                        tr.steps),
            history_rows(out.result, "icrecall_pretrained_long_history", settings="seed=0")]


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    cfg = parse_config(Config, argv, "python analyses/icrecall_pretrained.py")
    torch.set_num_threads(1)
    task, mcfg = TaskConfig(), cfg.memory()
    mem = PretrainedMemory(make_kb(task), mcfg)
    losses = pretrain(mem, progress=True)
    recall = {**memory_recall(mem), "pretrain_final_loss": losses[-1]}
    print({k: round(v, 4) for k, v in recall.items()})
    frames = [metric_rows(recall, "icrecall_pretrained_memory", cfg.epochs)]
    rows = {}
    for method in cfg.methods.split(","):
        for seed in range(cfg.seeds):
            tr = TrainConfig(method=method, n_train=cfg.n_train, seed=seed)
            out = run_experiment(task, mcfg, tr, EvalConfig(n_test=cfg.n_test, n_monitor=0),
                                 memory=mem)
            frames.append(outcome_rows(out, "icrecall_pretrained", tr.steps, method=method,
                                       seed=seed, n_train=cfg.n_train))
            rows[f"{method.upper()} seed {seed}"] = out.model.attention_row(
                out.model.q_rel).detach()
            _print(f"{method} seed {seed}", out.metrics)
    frames += controls(out.model, cfg.n_test, memory="pretrained")
    if cfg.long_steps:
        frames += long_run(cfg, task, mcfg, mem)
    save(frames, "pretrained")
    fig, ax = subplots(figsize=(9, 4))
    plot_rows(ax, rows, "pre-trained MLP memory: relation-step rows")
    savefig(fig, "pretrained")
    write_manifest(OUT / "manifest_pretrained", {**dataclasses.asdict(cfg),
                                                 **config_dict(task, mcfg)},
                   argv=argv, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_pretrained.py"))
