"""Top associated tokens per row of each statistic (the paper's Figure 5 lists), as a table.

``python -m pythia_probe.stats top --stats stats.safetensors --rows red,happy,fish --k 5``
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from pythia_probe.errors import BadInputError
from pythia_probe.stats.config import TopFlags
from pythia_probe.stats.result import MATRICES, CorpusStats
from pythia_probe.tokenizer import load_tokenizer


@dataclass(frozen=True)
class TopConfig(TopFlags):
    __doc__ = TopFlags.__doc__  # the flags and their help: stats/config.py

    def __post_init__(self) -> None:
        bad = [m for m in self.matrices if m not in MATRICES or m == "Delta"]
        if bad:
            raise BadInputError(f"unknown matrices {bad}; valid: {', '.join(MATRICES[:-1])}")
        if self.k < 1 or self.n_rows < 1:
            raise BadInputError("k and n_rows must be >= 1")


SPACE = "\u2423"  # ␣, the visible space
_VISIBLE = {" ": SPACE, "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def visible(text: str) -> str:
    """A token's text with its whitespace made visible (" the" -> "␣the", "\n" -> "\\n"), so
    two tokens never print alike."""
    return "".join(_VISIBLE.get(c, c) for c in text) or "''"


def load_names(stats: CorpusStats, stats_path: str, tokenizer: str | None) -> list[str]:
    """Display name of every row/column: the decoded token with whitespace made visible
    (:func:`visible`), its id appended where two tokens still read the same (bytes of one
    character decoded alone), or the id when no tokenizer is known."""
    return [n for n, _, _ in token_names(stats, stats_path, tokenizer)]


def token_names(stats: CorpusStats, stats_path: str, tokenizer: str | None
                ) -> list[tuple[str, str, str]]:
    """(display name, decoded text, tokenizer string) of every row/column."""
    ids = stats.token_ids.tolist()
    src = tokenizer or _saved_tokenizer(stats, stats_path)
    if src is None:
        return [(str(i), str(i), str(i)) for i in ids]
    tok = load_tokenizer(src)
    texts = [tok.decode([i]) for i in ids]
    raw = [str(t) for t in tok.convert_ids_to_tokens(ids)]
    shown = [visible(t) for t in texts]
    seen = Counter(shown)
    names = [f"{n}#{i}" if seen[n] > 1 else n for n, i in zip(shown, ids, strict=True)]
    return list(zip(names, texts, raw, strict=True))


def _saved_tokenizer(stats: CorpusStats, stats_path: str) -> str | None:
    f = stats.meta.get("tokenizer_file")
    if f and (Path(stats_path).parent / f).is_file():
        return str(Path(stats_path).parent / f)
    name = (stats.meta.get("tokenizer") or {}).get("name")
    return name if name and name != "unnamed" else None


def row_indices(rows: tuple[str, ...], names: list, stats: CorpusStats, n: int) -> list[int]:
    """Row positions of the requested tokens (see TopConfig.rows); default: the n most
    frequent. ``names``: :func:`token_names` (or plain display names)."""
    if not rows:
        counts = stats.token_counts
        order = torch.argsort(counts, descending=True) if counts is not None else torch.arange(n)
        return order[:n].tolist()
    lookup: dict[str, int] = {}
    for i, entry in enumerate(names):
        for form in (entry if isinstance(entry, tuple) else (entry,)):
            lookup.setdefault(form, i)
    ids = {int(t): i for i, t in enumerate(stats.token_ids.tolist())}
    out = []
    for r in rows:
        if r in lookup:
            out.append(lookup[r])
        elif r.lstrip("-").isdigit() and int(r) in ids:
            out.append(ids[int(r)])
        else:
            raise BadInputError(f"row token {r!r} is not in the statistics' vocabulary (give it "
                                f"as shown by `top`, e.g. {SPACE}the for a space before it, or "
                                "as an id)")
    return out


def top_table(stats: CorpusStats, names: list[str], matrices: tuple[str, ...],
              rows: list[int], k: int, keep_self: bool = False) -> pd.DataFrame:
    """One line per (matrix, row): the k largest entries of that row, as 'token (value)'.
    Only the asked rows are read (``stats.block``): cheap at the full vocabulary too."""
    records = []
    for m in matrices:
        M = stats.block(m, rows)
        for i, r in enumerate(rows):
            row = M[i].clone().double()
            if not keep_self:
                row[r] = -float("inf")
            vals, idx = torch.topk(row, min(k, row.numel() - (not keep_self)))
            pairs = zip(vals.tolist(), idx.tolist(), strict=True)
            tops = [f"{names[j]} ({v:.3g})" for v, j in pairs]
            records.append({"matrix": m, "row": names[r], "top": ", ".join(tops)})
    return pd.DataFrame(records)


def render(cfg: TopConfig) -> str:
    """The top lists of ``cfg`` as a printable table."""
    stats = CorpusStats.load(cfg.stats)
    forms = token_names(stats, cfg.stats, cfg.tokenizer)
    names = [f[0] for f in forms]
    rows = row_indices(cfg.rows, forms, stats, cfg.n_rows)
    table = top_table(stats, names, cfg.matrices, rows, cfg.k, cfg.keep_self)
    with pd.option_context("display.max_colwidth", None, "display.width", 200):
        return table.to_string(index=False)
