"""Figure 4 of the leading-terms paper: cosine of each weight with its leading term over training
at lr 0.05 (one curve per weight type, the range over layers shaded), and the loss.

Default: CPU scale on the built-in corpus (|V| = 509, T = 64, 512 sequences, batch 128, 100
SGD steps instead of 3,200; lr 0.3, chosen so that these few steps leave the leading-term
regime as the paper's run does). ``--paper``: the paper's settings (TinyStories from the hub,
|V| = 3000, T = 200, 65,536 sequences, batch 2048, 100 epochs, lr 0.05; needs a GPU).

    python analyses/toy_figure4.py            # writes results/toy/figure4.{csv,png}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.cli import run_main
from pythia_probe.results import read_results
from pythia_probe.toy.paper import FIGURE4_RUN
from pythia_probe.toy.repro import parse_flags, save_figure, settings_line, write_csv
from pythia_probe.toy.train import TrainConfig, make_schedule, run

CPU = dict(dataset="builtin", stories=800, tokenizer="word:3000", seq_len=64, n_seqs=512,
           batch_size=128, epochs=25, lr=0.3, layers=3, log_every=4)
PAPER = FIGURE4_RUN
CURVES = {"cos_W_Qbar": "W (attention) vs Qbar", "cos_V_PhiBT": "V (value) vs PhiBT",
          "cos_W_O_Bbar": "W_O (output) vs Bbar", "cos_P_Delta": "P (positional) vs Delta"}


def curves_by_epoch(df: pd.DataFrame, steps_per_epoch: int) -> pd.DataFrame:
    """Per (metric, epoch): min, max and mean over layers."""
    sel = df[df["metric"].isin([*CURVES, "loss"])].copy()
    sel["epoch"] = sel["step"] / steps_per_epoch
    return sel.groupby(["metric", "epoch"])["value"].agg(["min", "max", "mean"]).reset_index()


def plot(curves: pd.DataFrame, path: Path, title: str) -> None:
    fig = Figure(figsize=(11, 4))
    ax, lx = fig.subplots(1, 2)
    for metric, label in CURVES.items():
        c = curves[curves["metric"] == metric]
        ax.plot(c["epoch"], c["mean"], label=label)
        ax.fill_between(c["epoch"], c["min"], c["max"], alpha=0.25)
    ax.set(xlabel="epoch", ylabel="Frobenius cosine with leading term", title=title)
    ax.legend(fontsize=8)
    loss = curves[curves["metric"] == "loss"]
    lx.plot(loss["epoch"], loss["mean"])
    lx.set(xlabel="epoch", ylabel="training loss", title="loss")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    (a,) = parse_flags(argv, "figure4", "python analyses/toy_figure4.py", __doc__)
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    df = read_results(a.run_dir)
    spe = make_schedule(cfg, cfg.n_seqs).steps_per_epoch
    curves = curves_by_epoch(df, spe)
    out = Path(a.results)
    tag = "figure4" + ("_paper" if a.paper else "")
    write_csv(out / f"{tag}.csv", curves)
    plot(curves, out / f"{tag}.png", f"lr {cfg.lr}, L={cfg.layers}, T={cfg.seq_len}")
    early = curves[(curves["epoch"] <= 0.3 * cfg.epochs) & curves["metric"].isin(CURVES)]
    last = curves[(curves["epoch"] == curves["epoch"].max()) & curves["metric"].isin(CURVES)]
    loss = curves[curves["metric"] == "loss"]["mean"]
    print(settings_line(cfg, a.run_dir))
    wv = ["cos_W_Qbar", "cos_V_PhiBT", "cos_W_O_Bbar"]
    print(f"min cosine over W, V, W_O up to 30% of training: ours "
          f"{early[early['metric'].isin(wv)]['min'].min():.4f}  (paper: >= 0.9 to epoch 30)")
    print(f"min cosine over W, V, W_O at the end:            ours "
          f"{last[last['metric'].isin(wv)]['min'].min():.4f}  (paper: > 0.7 at epoch 100)")
    print(f"loss first -> last logged epoch: ours {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}  "
          "(paper: 8.00 -> 5.35 at |V| = 3000)")
    for metric, label in CURVES.items():
        c = curves[curves["metric"] == metric]
        print(f"  {label:26s} max {c['max'].max():.4f}  final {c['mean'].iloc[-1]:.4f}")
    print(f"wrote {out / (tag + '.png')} and {out / (tag + '.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/toy_figure4.py"))
