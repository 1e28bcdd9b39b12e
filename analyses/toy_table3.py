"""Table 3 of the leading-terms paper (causal ablation): from the lr 0.05 model of Figure 4,
subtract from one weight its Frobenius projection onto its leading term and re-evaluate the
training loss. The paper's order: removing W_O's term hurts most, then V's, then W's.

Default: the CPU-scale Figure 4 run (trained here if missing). ``--paper``: the paper's run.

    python analyses/toy_table3.py             # writes results/toy/table3.{md,csv}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from toy_figure4 import CPU, PAPER

from pythia_probe import theory
from pythia_probe.cli import run_main
from pythia_probe.fileio import write_text
from pythia_probe.toy.model import AttnOnlyTransformer
from pythia_probe.toy.repro import markdown, parse_flags, settings_line, write_csv
from pythia_probe.toy.train import TrainConfig, load_run, run

#: the paper's Table 3 losses (train loss after ablation, lr 0.05, 100 epochs)
PAPER_LOSS = {"original": 5.349, "attention layer 1": 5.350, "attention layer 2": 5.352,
              "attention layer 3": 5.361, "value layer 1": 6.192, "value layer 2": 6.526,
              "value layer 3": 6.520, "output": 8.287}


@torch.no_grad()
def train_loss(model: AttnOnlyTransformer, seqs: torch.Tensor, chunk: int = 64) -> float:
    """Eq. 3 over all training sequences (chunked; every chunk weighted by its size)."""
    total = sum(float(model.loss(c)) * len(c) for c in seqs.split(chunk))
    return total / len(seqs)


@torch.no_grad()
def ablation_losses(model: AttnOnlyTransformer, seqs: torch.Tensor,
                    stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """Loss with each weight's leading-term component removed, one weight at a time."""
    out = {"original": train_loss(model, seqs)}
    targets = [(f"attention layer {i + 1}", "W", i) for i in range(model.cfg.n_layers)]
    targets += [(f"value layer {i + 1}", "V", i) for i in range(model.cfg.n_layers)]
    targets += [(f"positional layer {i + 1}", "P", i) for i in range(model.cfg.n_layers)]
    targets += [("output", "W_O", None)]
    for label, name, layer in targets:
        param = getattr(model, name)
        saved = param.detach().clone()
        term = stats[theory.LEADING_TERM[name]]
        w = param if layer is None else param[layer]
        w.copy_(theory.remove_leading_term(w, term))
        out[label] = train_loss(model, seqs)
        param.copy_(saved)
    return out


def main(argv: list[str] | None = None) -> int:
    (a,) = parse_flags(argv, "figure4", "python analyses/toy_table3.py", __doc__)
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    cfg, model, stats, data = load_run(a.run_dir)
    losses = ablation_losses(model, data.tokens, stats)
    table = pd.DataFrame([{"ablated": k, "ours_loss": v,
                           "ours_increase": v - losses["original"], "paper_loss": PAPER_LOSS.get(k)}
                          for k, v in losses.items()])
    head = settings_line(cfg, a.run_dir)
    print(head)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    inc = {k: v - losses["original"] for k, v in losses.items()}
    worst = {kind: max(v for k, v in inc.items() if k.startswith(kind))
             for kind in ("output", "value", "attention")}
    print("order (largest loss increase per weight type): "
          + " > ".join(f"{k} {v:+.4f}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1]))
          + "   (paper: output > value > attention)")
    out, tag = Path(a.results), "table3" + ("_paper" if a.paper else "")
    write_csv(out / f"{tag}.csv", table)
    write_text(out / f"{tag}.md", f"# Table 3: causal ablation of the leading terms\n\n{head}\n\n"
               f"{markdown(table)}\n")
    print(f"wrote {out / tag}.md/.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/toy_table3.py"))
