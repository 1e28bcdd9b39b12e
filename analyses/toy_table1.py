"""Table 1 of the leading-terms paper: the minimum over training (epochs and layers) of the
Frobenius cosine between each weight and its leading term, lr 0.005; beside it the run's batch
ceiling (each first-batch leading term against the same term over the whole training set: what a
weight that has learnt the whole set scores, an upper bound on first-batch agreement, not a floor)
and the paper's number.

Default: CPU scale on the built-in corpus (|V| = 509, T = 64, 512 sequences, batch 128, 200
SGD steps at lr 0.08: lr x steps = 16, the paper's 0.005 x 3,200, so that the loss moves).
``--paper``: the paper's settings (TinyStories, |V| = 3000, T = 200, 65,536 sequences, batch
2048, 100 epochs; needs a GPU).

    python analyses/toy_table1.py             # writes results/toy/table1.{md,csv,png}
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from toy_figure4 import curves_by_epoch, plot

from pythia_probe import theory
from pythia_probe.cli import run_main
from pythia_probe.fileio import write_text
from pythia_probe.results import read_manifest, read_results
from pythia_probe.toy import paper
from pythia_probe.toy.repro import markdown, parse_flags, settings_line, write_csv
from pythia_probe.toy.train import TrainConfig, make_schedule, run

CPU = dict(dataset="builtin", stories=800, tokenizer="word:3000", seq_len=64, n_seqs=512,
           batch_size=128, epochs=50, lr=0.08, layers=3, log_every=4)
PAPER = paper.TABLE1_RUN
min_cosines = paper.min_cosines


def report(table: pd.DataFrame, cfg: TrainConfig, run_dir: str, out: Path, tag: str,
           title: str, name: str, values: dict, paper_run: dict) -> None:
    """Print the table with settings, batch ceilings and the loss; write .md, .csv and .png."""
    df = read_results(run_dir)
    d_vocab = int(read_manifest(run_dir)["config"]["d_vocab"])
    sched = make_schedule(cfg, cfg.n_seqs)
    window = theory.theorem_window(cfg.lr, cfg.seq_len, cfg.layers)
    first, last, step = paper.loss_moved(df)
    head = (f"{settings_line(cfg, run_dir)}\nTheorem 4.1 covers s <= {window:.2f} steps at this "
            f"lr, T and L; the run took {sched.total_steps} steps, lr x steps = "
            f"{cfg.lr * sched.total_steps:g} (agreement beyond the window is empirical); "
            f"training loss {first:.4f} -> {last:.4f} by step {step} (log |V| = "
            f"{math.log(d_vocab):.4f}).\nbatch_ceiling: cosine of the first-batch leading "
            "term with the whole training set's (what a weight that has learnt the whole set "
            "scores: an upper bound on first-batch agreement, not a floor); layers 1-based as in "
            "the paper.\nsettings that "
            f"differ from the paper's: {paper.settings_diff(cfg, paper_run, d_vocab)}")
    print(settings_line(cfg, run_dir))
    print("\n".join(paper.comparison_lines(df, cfg, d_vocab, values, paper_run, name)))
    write_csv(out / f"{tag}.csv", table)
    write_text(out / f"{tag}.md", f"# {title}\n\n{head}\n\n{markdown(table)}\n")
    plot(curves_by_epoch(df, sched.steps_per_epoch), out / f"{tag}.png", f"{tag}: lr {cfg.lr}")
    print(f"wrote {out / tag}.md/.csv/.png")


def main(argv: list[str] | None = None) -> int:
    (a,) = parse_flags(argv, "table1", "python analyses/toy_table1.py", __doc__)
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    table = min_cosines(read_results(a.run_dir), paper.TABLE1)
    tag = "table1" + ("_paper" if a.paper else "")
    report(table, cfg, a.run_dir, Path(a.results), tag,
           "Table 1: min-over-training cosine with the leading term", "Table 1", paper.TABLE1,
           paper.TABLE1_RUN)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/toy_table1.py"))
