"""Table 2 of the leading-terms paper (App. B): Table 1 with a BPE tokenizer (|V| = 10,000,
10 epochs, lr 0.005): the minimum over training of each weight's cosine with its leading term.

Default: CPU scale on the built-in corpus with a 1,000-id byte-level BPE (T = 64, 128 sequences,
batch 64, 10 epochs = 20 SGD steps, lr 0.03 as in the CPU Table 1). ``--paper``: the
paper's settings (TinyStories from the hub, BPE 10,000, T = 200, 65,536 sequences; GPU).

    python analyses/toy_table2.py             # writes results/toy/table2.{md,csv,png}
"""

from __future__ import annotations

from pathlib import Path

from toy_figure4 import parse
from toy_table1 import ROWS, min_cosines, report

from pythia_probe.results import read_results
from pythia_probe.toy.train import TrainConfig, run

CPU = dict(dataset="builtin", stories=400, tokenizer="bpe:1000", seq_len=64,
           n_seqs=128, batch_size=64, epochs=10, lr=0.03, layers=3, log_every=1)
PAPER = dict(dataset="roneneldan/TinyStories", tokenizer="bpe:10000", seq_len=200,
             n_seqs=65536, batch_size=2048, micro_batch=256, epochs=10, lr=0.005, layers=3)
PAPER_TABLE2 = {"cos_W_Qbar": 0.999914, "cos_V_PhiBT": 0.998800, "cos_W_O_Bbar": 0.997891}


def main(argv: list[str] | None = None) -> int:
    a = parse(argv, "table2")
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    rows = {label: (metric, PAPER_TABLE2.get(metric)) for label, (metric, _) in ROWS.items()}
    table = min_cosines(read_results(a.run_dir), rows)
    tag = "table2" + ("_paper" if a.paper else "")
    report(table, cfg, a.run_dir, Path(a.results), tag,
           "Table 2 (BPE tokenizer): min-over-training cosine with the leading term")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
