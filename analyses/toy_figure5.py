"""Figure 5 of the leading-terms paper: the top associated tokens of one row per matrix:
Bbar "red" (next tokens), SigmaB "happy" (interchangeable tokens), Phibar "fish" (context),
from the theory matrices (first training batch) and from the trained weights (W_O ~ Bbar,
W_O^T W_O ~ SigmaB, pinv(W_O) V_1^T ~ Phibar, each up to scale). On the built-in corpus the
planted ground truth (pythia_probe.builtin_corpus.PLANTED) scores each list (precision@k).

Default: the CPU-scale Table 1 run (trained here if missing). ``--paper``: the paper's run.

    python analyses/toy_figure5.py            # writes results/toy/figure5.{md,png}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from matplotlib.figure import Figure
from toy_table1 import CPU, PAPER

from pythia_probe.builtin_corpus import FUNCTION_WORDS, PLANTED
from pythia_probe.cli import run_main
from pythia_probe.fileio import write_text
from pythia_probe.toy.repro import markdown, parse_flags, save_figure, settings_line
from pythia_probe.toy.train import TrainConfig, load_run, run

K = 5
#: (theory matrix, query word, the paper's top tokens, planted group that scores it)
QUERIES = [("Bbar", "red", "ball, car, dress, balloon, truck", "colour->toy/vehicle"),
           ("SigmaB", "happy", "sad, excited, scared, proud", "emotion"),
           ("Phibar", "fish", "big, small, pond, lake, water", "topic:pond")]


def learned(model, name: str) -> torch.Tensor:
    """The trained-weight counterpart of a theory matrix (up to a scalar)."""
    W_O = model.W_O.detach().double()
    if name == "Bbar":
        return W_O
    if name == "SigmaB":
        return W_O.T @ W_O
    return torch.linalg.pinv(W_O, rtol=1e-6) @ model.V[0].detach().double().T


def top_tokens(row: torch.Tensor, vocab: list[str], query: str, skip: set[str]) -> list[str]:
    order = torch.argsort(row, descending=True).tolist()
    return [vocab[i] for i in order if vocab[i] != query and vocab[i] not in skip][:K]


def planted_truth(group: str, name: str) -> set[str]:
    g = PLANTED[group]
    return set(g.words if name == "SigmaB" else g.partners)


def figure_rows(model, stats, vocab: list[str]) -> list[dict]:
    ids = {w: i for i, w in enumerate(vocab)}
    rows = []
    for name, query, paper, group in QUERIES:
        if query not in ids:
            print(f"'{query}' is not in this vocabulary; skipping {name}")
            continue
        skip = set(FUNCTION_WORDS) if name == "Phibar" else set()
        truth = planted_truth(group, name)
        for source, M in (("theory", stats[name]), ("trained", learned(model, name))):
            top = top_tokens(M[ids[query]], vocab, query, skip)
            rows.append({"matrix": name, "row": query, "source": source, "top": ", ".join(top),
                         "planted_precision": sum(w in truth for w in top) / len(top),
                         "paper (TinyStories)": paper})
    return rows


def save_png(table: pd.DataFrame, path: Path) -> None:
    fig = Figure(figsize=(12, 0.5 + 0.4 * len(table)))
    ax = fig.subplots()
    ax.axis("off")
    cells = table[["matrix", "row", "source", "top", "paper (TinyStories)"]].values.tolist()
    t = ax.table(cellText=cells, colLabels=["matrix", "row", "source", f"top {K} (ours)",
                                            "paper"], loc="center", cellLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.auto_set_column_width(list(range(5)))
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def main(argv: list[str] | None = None) -> int:
    (a,) = parse_flags(argv, "table1", "python analyses/toy_figure5.py", __doc__)
    cfg = TrainConfig(**(PAPER if a.paper else CPU), out=a.run_dir)
    run(cfg)
    cfg, model, stats, data = load_run(a.run_dir)
    table = pd.DataFrame(figure_rows(model, stats, data.vocab))
    head = settings_line(cfg, a.run_dir)
    print(head)
    print(table.to_string(index=False))
    out, tag = Path(a.results), "figure5" + ("_paper" if a.paper else "")
    write_text(out / f"{tag}.md", f"# Figure 5: top associated tokens\n\n{head}\n\n"
               f"Phibar rows skip builtin_corpus.FUNCTION_WORDS.\n\n{markdown(table)}\n")
    save_png(table, out / f"{tag}.png")
    print(f"wrote {out / tag}.md/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/toy_figure5.py"))
