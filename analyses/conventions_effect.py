"""How much each of the authors' conventions moves the statistics (``--conventions authors``
differs from ``paper`` in five ways, stats/conventions.py): each difference switched on alone,
then all together, against the paper's statistics of the same corpus.

Offline and Pythia-like: the built-in stories (median ~270 tokens, so few are shorter than a
window, like OpenWebText's documents of >= 512 characters) tokenised by the Pythia-format test
tokenizer (pythia_probe/testing/tokenizers.py: byte-level BPE, <|endoftext|> = id 0 as BOS)
with --tokenizer-ids ids and a model config.json of --model-ids rows (Pythia: 50,277 and
50,304), T = --seq-len, top-K = --top-k; the word-ranking row uses word:--words on the same
stories. Each cell is the relative Frobenius difference ||X - X_paper||_F / ||X_paper||_F over
the ids both runs hold (by token id; by word for the word ranking), and the overlap of the two
runs' kept ids (or word vocabularies).

    python analyses/conventions_effect.py        # writes results/conventions/effect.{csv,md}
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.fileio import write_text
from pythia_probe.stats import CorpusStats
from pythia_probe.stats.conventions import Rules
from pythia_probe.stats.job import StatsConfig, compute
from pythia_probe.testing.tokenizers import pythia_like_backend, write_pythia_tokenizer
from pythia_probe.tokenizer import load_tokenizer

PROG = "python analyses/conventions_effect.py"
MATRICES = ("Bbar", "Phibar", "PhiBT", "Gbar", "Qbar", "QbarHead")
WHAT = {"windows": "BOS first, first T tokens zero-padded, last target 0 (rule 1)",
        "bos": "BOS alone: the paper's windows of BOS + document (--bos '<|endoftext|>')",
        "d_vocab": "centring and side by the model's embedding rows (rule 2)",
        "top_k": "top-K by document counts, ties first seen (rule 3)",
        "compose": "SigmaB, PhiBT, Gbar and pass 2 over the kept ids (rule 4)",
        "authors": "all of them (--conventions authors)",
        "word_ties": "word:K ties in first-seen order (rule 5)"}
ROWS = (("windows", "top"), ("bos", "top"), ("d_vocab", "top"), ("top_k", "top"),
        ("compose", "top"), ("authors", "top"), ("windows", "full"), ("bos", "full"),
        ("d_vocab", "full"), ("authors", "full"), ("word_ties", "word"))
BOS = "<|endoftext|>"


@dataclass(frozen=True)
class Flags:
    stories: int = 1000
    """Built-in stories (documents)."""
    seq_len: int = 128
    """T."""
    top_k: int = 200
    """K of the top-K rows."""
    tokenizer_ids: int = 2000
    """Ids of the Pythia-format test tokenizer."""
    model_ids: int = 2048
    """vocab_size of its model config.json (the embedding rows)."""
    words: int = 400
    """K of the word:K tokenizer of the word-ranking row (the 1,000 stories hold 509 words;
    at 400 nine words tie for the last places)."""
    out: str = "results/conventions"
    """Folder of effect.csv and effect.md."""
    engine: str = "auto"
    """Statistics engine (``stats compute --engine``; the same numbers to float64 rounding)."""


def tokenizer_folder(root: Path, f: Flags) -> Path:
    """The Pythia-format test tokenizer with a model config.json of f.model_ids rows."""
    folder = write_pythia_tokenizer(root / "tokenizer",
                                    pythia_like_backend(f.tokenizer_ids, f.tokenizer_ids))
    (folder / "config.json").write_text(json.dumps({"vocab_size": f.model_ids}))
    return folder


def build(root: Path, f: Flags, tokenizer: str, rules: Rules, top_k: int | None,
          oov: str = "skip", bos: str | None = None) -> CorpusStats:
    name = f"{rules.name}-{top_k}-{Path(tokenizer).name}-{bos is None}".replace(":", "")
    cfg = StatsConfig(dataset="builtin", stories=f.stories, seq_len=f.seq_len,
                      tokenizer=tokenizer, top_k=top_k, groups=0, progress=False, oov=oov,
                      engine=f.engine, bos=bos, out=str(root / f"{name}.safetensors"))
    return compute(cfg, rules=rules)


def positions(ours: list, theirs: list) -> tuple[list[int], list[int]]:
    """Where the keys both lists hold sit in each (in ``theirs``' order)."""
    where = {k: i for i, k in enumerate(ours)}
    common = [k for k in theirs if k in where]
    return [where[k] for k in common], [theirs.index(k) for k in common]


def relative(a: CorpusStats, b: CorpusStats, keys_a: list, keys_b: list) -> dict[str, float]:
    """||A - B||_F / ||B||_F of each matrix over the keys both hold; the kept keys' overlap."""
    pa, pb = positions(keys_a, keys_b)
    out = {n: float(torch.linalg.norm(a.block(n, pa, pa) - b.block(n, pb, pb))
                    / torch.linalg.norm(b.block(n, pb, pb))) for n in MATRICES}
    out["overlap"] = len(pa) / len(keys_b)
    return out


def words_of(st: CorpusStats, path: Path) -> list[str]:
    tok = load_tokenizer(str(path) + ".tokenizer.json")
    return [str(w) for w in tok.convert_ids_to_tokens(st.token_ids.tolist())]


def measure(f: Flags, root: Path) -> pd.DataFrame:
    """One row per (difference, vocabulary) of :data:`ROWS`."""
    folder = str(tokenizer_folder(root, f))
    paper = {"top": build(root, f, folder, Rules(), f.top_k),
             "full": build(root, f, folder, Rules(), None)}
    rows = []
    for diff, vocab in ROWS:
        if vocab == "word":
            word = f"word:{f.words}"
            base = build(root, f, word, Rules(), None, "unk")
            alt = build(root, f, word, Rules(word_ties=True), None, "unk")
            keys = [words_of(s, Path(s.meta["config"]["out"])) for s in (alt, base)]
            cells = relative(alt, base, *keys)
            size = f"word:{f.words}"
        else:
            rules = (Rules.named("authors") if diff == "authors" else Rules() if diff == "bos"
                     else Rules(**{diff: True}))
            base = paper[vocab]
            alt = build(root, f, folder, rules, f.top_k if vocab == "top" else None,
                        bos=BOS if diff == "bos" else None)
            cells = relative(alt, base, alt.token_ids.tolist(), base.token_ids.tolist())
            size = f"top-{f.top_k}" if vocab == "top" else "full"
        cells.update(docs=alt.meta["counts"]["docs"], docs_paper=base.meta["counts"]["docs"])
        rows.append({"difference": diff, "vocabulary": size, **cells, "what": WHAT[diff]})
    return pd.DataFrame(rows)


def render(table: pd.DataFrame, f: Flags) -> str:
    """The markdown of ``table`` (every number from it)."""
    head = ("| difference | vocabulary | " + " | ".join(MATRICES) + " | kept ids shared |",
            "|---|---|" + "---|" * (len(MATRICES) + 1))
    settings = ", ".join(f"{k}={v}" for k, v in asdict(f).items() if k not in ("out", "engine"))
    lines = ["# The authors' conventions, one difference at a time", "",
             f"Generated by `{PROG}` ({settings}):"
             f" built-in stories, Pythia-format test tokenizer ({f.tokenizer_ids:,} ids, model "
             f"config {f.model_ids:,} rows), T = {f.seq_len}. Each cell is ||X - X_paper||_F / "
             "||X_paper||_F over the ids both runs hold; the last column is the share of the "
             "paper run's kept ids (or words) the other run keeps. Documents counted: "
             f"{_docs(table, 'windows', 'docs_paper')} of {_docs(table, 'windows', 'docs')} "
             f"under the paper's windows (a story shorter than T+1 = {f.seq_len + 1} tokens is "
             "skipped), every one under the authors' (padded and counted).", "", *head]
    for r in table.itertuples(index=False):
        cells = " | ".join(f"{getattr(r, n):.2e}" for n in MATRICES)
        lines.append(f"| {r.difference}: {r.what} | {r.vocabulary} | {cells} | "
                     f"{r.overlap:.1%} |")
    return "\n".join(lines) + "\n"


def _docs(table: pd.DataFrame, diff: str, column: str) -> str:
    return f"{int(table.loc[table['difference'] == diff, column].iloc[0]):,}"


def write_table(table: pd.DataFrame, md: str, out: Path, stem: str) -> None:
    """``out/stem.csv`` (the table) and ``out/stem.md`` (its rendering), printed too."""
    write_text(out / f"{stem}.csv", table.to_csv(index=False))
    write_text(out / f"{stem}.md", md)
    print(md)


def main(argv: list[str] | None = None) -> int:
    (values,) = parse_configs([Flags], argv, PROG, __doc__)
    f = Flags(**values)
    with tempfile.TemporaryDirectory() as tmp:
        table = measure(f, Path(tmp))
    write_table(table, render(table, f), Path(f.out), "effect")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
