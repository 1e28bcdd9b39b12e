"""Table 2 of the leading-terms paper (App. B): Table 1 with a BPE tokenizer (|V| = 10,000,
10 epochs, lr 0.005): the minimum over training of each weight's cosine with its leading term,
beside the run's batch ceiling and the paper's number.

Default: CPU scale on the built-in corpus with a 1,000-id byte-level BPE (T = 64, 256 sequences,
batch 64, 200 SGD steps at lr 0.08 as in the CPU Table 1, so that the loss moves; the paper's
Table 2 run is lr x steps = 1.6). ``--paper``: the paper's settings (TinyStories from the hub,
BPE 10,000, T = 200, 65,536 sequences; GPU).

    python analyses/toy_table2.py             # writes results/toy/table2.{md,csv,png}
"""

from __future__ import annotations

from pathlib import Path

from toy_table1 import report

from pythia_probe.cli import run_main
from pythia_probe.results import read_results
from pythia_probe.toy import paper
from pythia_probe.toy.repro import parse_flags
from pythia_probe.toy.train import TrainConfig, run

CPU = dict(dataset="builtin", stories=800, tokenizer="bpe:1000", seq_len=64,
           n_seqs=256, batch_size=64, epochs=50, lr=0.08, layers=3, log_every=4)
PAPER = paper.TABLE2_RUN
PAPER_TABLE2 = paper.TABLE2


def main(argv: list[str] | None = None) -> int:
    (a,) = parse_flags(argv, "table2", "python analyses/toy_table2.py", __doc__)
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    table = paper.min_cosines(read_results(a.run_dir), paper.TABLE2)
    tag = "table2" + ("_paper" if a.paper else "")
    report(table, cfg, a.run_dir, Path(a.results), tag,
           "Table 2 (BPE tokenizer): min-over-training cosine with the leading term",
           "Table 2", paper.TABLE2, paper.TABLE2_RUN)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/toy_table2.py"))
