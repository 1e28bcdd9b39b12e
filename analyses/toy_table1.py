"""Table 1 of the leading-terms paper: the minimum over training (epochs and layers) of the
Frobenius cosine between each weight and its leading term, lr 0.005.

Default: CPU scale on the built-in corpus (|V| = 509, T = 64, 512 sequences, batch 128, 100
SGD steps; lr 0.03, a tenth of the CPU Figure 4 lr, as the paper's 0.005 is a tenth of its
0.05). ``--paper``: the paper's settings (TinyStories,
|V| = 3000, T = 200, 65,536 sequences, batch 2048, 100 epochs; needs a GPU).

    python analyses/toy_table1.py             # writes results/toy/table1.{md,csv,png}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from toy_figure4 import curves_by_epoch, parse, plot, settings_line

from pythia_probe import theory
from pythia_probe.results import read_results
from pythia_probe.toy.train import TrainConfig, make_schedule, run

CPU = dict(dataset="builtin", stories=800, tokenizer="word:3000", seq_len=64, n_seqs=512,
           batch_size=128, epochs=25, lr=0.03, layers=3, log_every=4)
PAPER = dict(dataset="roneneldan/TinyStories", tokenizer="word:3000", seq_len=200, n_seqs=65536,
             batch_size=2048, micro_batch=512, epochs=100, lr=0.005, layers=3)
#: row label -> (metric, the paper's Table 1 value or None where the paper has none)
ROWS = {"attention (W vs Qbar)": ("cos_W_Qbar", 0.999496),
        "value (V vs Phibar^T Bbar^T)": ("cos_V_PhiBT", 0.999169),
        "output (W_O vs Bbar)": ("cos_W_O_Bbar", 0.998486),
        "positional (P vs Delta)": ("cos_P_Delta", None)}


def min_cosines(df: pd.DataFrame, rows: dict = ROWS) -> pd.DataFrame:
    """Ours (min over logged steps and layers) beside the paper's number, one row per weight."""
    out = []
    for label, (metric, paper) in rows.items():
        sel = df[df["metric"] == metric]
        worst = sel.loc[sel["value"].idxmin()]
        out.append({"weight": label, "ours_min_cosine": float(worst["value"]),
                    "at_step": int(worst["step"]),
                    "at_layer": None if pd.isna(worst["layer"]) else int(worst["layer"]) + 1,
                    "paper": paper})
    return pd.DataFrame(out).astype({"at_layer": "Int64"})


def markdown(table: pd.DataFrame) -> str:
    """A GitHub markdown table (floats to 6 decimals; missing values as "-")."""
    def fmt(v) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and pd.isna(v)):
            return "-"
        return f"{v:.6f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    return "\n".join(lines)


def report(table: pd.DataFrame, cfg: TrainConfig, run_dir: str, out: Path, tag: str,
           title: str) -> None:
    """Print the table with settings; write it as .md and .csv and the curves as .png."""
    df = read_results(run_dir)
    sched = make_schedule(cfg, cfg.n_seqs)
    window = theory.theorem_window(cfg.lr, cfg.seq_len, cfg.layers)
    head = (f"{settings_line(cfg, run_dir)}\nTheorem 4.1 covers s <= {window:.1f} steps at this "
            f"lr, T and L; the run took {sched.total_steps} steps (agreement beyond the window "
            "is empirical)")
    print(head)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.6f}"))
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"{tag}.csv", index=False)
    (out / f"{tag}.md").write_text(f"# {title}\n\n{head}\n\n"
                                   f"{markdown(table)}\n")
    plot(curves_by_epoch(df, sched.steps_per_epoch), out / f"{tag}.png", f"{tag}: lr {cfg.lr}")
    print(f"wrote {out / tag}.md/.csv/.png (layers 1-indexed as in the paper)")


def main(argv: list[str] | None = None) -> int:
    a = parse(argv, "table1")
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    table = min_cosines(read_results(a.run_dir))
    tag = "table1" + ("_paper" if a.paper else "")
    report(table, cfg, a.run_dir, Path(a.results), tag,
           "Table 1: min-over-training cosine with the leading term")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
