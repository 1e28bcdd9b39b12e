"""What a figure says about its numbers: what is compared with what, for which model and which
statistics, on which colour scale. Built from the table (model, analysis, metric, stats_id) and
the run's manifest when there is one; nothing about a run is typed in here.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pythia_probe.plots.table import short_model

PHIBT, QBAR, BBAR, BBART, DELTA = "Phibar^T Bbar^T", "Qbar", "Bbar", "Bbar^T", "Delta"
QBART, QHEADT = "Qbar^T", "QbarHead^T"
#: the theory names as matplotlib mathtext
MATH = {PHIBT: r"$\bar{\Phi}^{\top}\bar{B}^{\top}$", QBAR: r"$\bar{Q}$", BBAR: r"$\bar{B}$",
        BBART: r"$\bar{B}^{\top}$", DELTA: r"$\Delta$", QBART: r"$\bar{Q}^{\top}$",
        QHEADT: r"$\bar{Q}_{\mathrm{head}}^{\top}$"}
#: the attention metrics: (who, target, whose target, in words)
_ATTN_METRICS = {
    "cos_mean": ("mean over heads", QBAR, "the theory's orientation, query-token rows"),
    "cos_head": ("per head", QBAR, "the theory's orientation, query-token rows"),
    "cos_mean_authors": ("mean over heads", QBART,
                         "the authors' target (pythia.py), key-token rows"),
    "cos_head_authors": ("per head", QHEADT,
                         "the authors' per-head target (pythia-per-head.py)")}

_EMBEDDING = {"cos_pre": "residual stream before layer l",
              "cos_attn": "residual + attention output of layer l (no MLP)",
              "cos_post": "residual stream after layer l"}
_ATTN_MAP = {"attention": "raw W_Q W_K", "attention_lnfold": "LN-folded W_Q W_K, as the paper"}
_UNEMBEDDING = {"cos_WU_Bbar": ("unembedding W_U^T", BBART),
                "cos_WEWU_Bbar": ("direct path W_E W_U", BBAR),
                "cos_WE_PhiBT": ("embedding W_E", PHIBT)}
_EQ13 = {"qbar": f"Eq. 13's token term {QBAR}", "delta": f"Eq. 13's position term {DELTA}",
         "eq13": f"Eq. 13 ({QBAR} + {DELTA})"}
_TOY = {"W_O_Bbar": ("W_O", BBAR), "V_PhiBT": ("W_V of layer l", PHIBT),
        "W_Qbar": ("W (query-key) of layer l", QBAR),
        "P_Delta": ("P (positions) of layer l", DELTA)}


@dataclass(frozen=True)
class What:
    """The model side and the theory side of one metric, and what the number is."""

    model: str
    theory: str | None = None
    measure: str = "cosine"
    target: str = ""
    """whose target, in words (the attention metrics: the theory's or the authors')"""

    def text(self, math: bool = False) -> str:
        if self.theory is None:
            return self.model
        side = MATH.get(self.theory, self.theory) if math else self.theory
        return f"{self.model} vs {side}" + (f" ({self.target})" if self.target else "")


def _toy(metric: str) -> What | None:
    kind, _, pair = metric.partition("_")
    if pair not in _TOY:
        return None
    weight, term = _TOY[pair]
    if kind == "cos":
        return What(weight, term)
    if kind == "relerr":
        return What(f"relative error of {weight} vs its Theorem 4.1 prediction", None, "error")
    if kind == "normratio":
        return What(f"norm of {weight} / norm of its Theorem 4.1 prediction", None, "ratio")
    return None


def what(analysis: str, metric: str) -> What:
    """What ``metric`` of ``analysis`` compares; unknown pairs are named by their codes."""
    if analysis == "embedding" and metric in _EMBEDDING:
        return What(_EMBEDDING[metric], PHIBT)
    if analysis in _ATTN_MAP and metric in _ATTN_METRICS:
        who, theory, target = _ATTN_METRICS[metric]
        return What(f"attention map of layer l ({_ATTN_MAP[analysis]}, {who})", theory,
                    target=target)
    if analysis == "unembedding" and metric in _UNEMBEDDING:
        return What(*_UNEMBEDDING[metric])
    if analysis == "attention_text" and metric.startswith("corr_"):
        term = metric[5:].removesuffix("_head")
        if term in _EQ13:
            who = "per head" if metric.endswith("_head") else "mean over heads"
            return What(f"log attention on text, layer l ({who})", _EQ13[term], "correlation")
    if metric == "loss":
        return What("training loss", None, "loss")
    found = _toy(metric) if analysis.startswith("toy") else None
    return found or What(f"{analysis}: {metric}", None, metric)


#: the authors' colour maps: plot-cosine-similarity.py (Figure 6) and
#: plot-per-head-similarity.py (Figure 7)
PAPER_CMAP, PAPER_HEAD_CMAP = "RdYlBu_r", "RdBu_r"


def color_range(metric: str, per_head: bool = False,
                values: np.ndarray | None = None) -> tuple[float | None, float | None, str]:
    """(vmin, vmax, colormap) of a raw panel, as the authors' plotting scripts draw it.

    Cosines: RdYlBu_r on 0-1 (plot-cosine-similarity.py: ``imshow(..., cmap='RdYlBu_r',
    vmin=0, vmax=1)``). Per head: RdBu_r on the range of the cells drawn, one range for all the
    layers shown. We follow plot-per-head-similarity.py here, the script that drew Figure 7
    (``plot_multi_layer_comparison``: ``vmin=global_min, vmax=global_max`` over the layers
    drawn); the 0.2-0.8 used before was read off the published colour bar, i.e. that rule on
    the authors' numbers, and no script fixes it. A data range is not comparable across
    figures, so every per-head figure also draws the effect (fixed -1..1, chance 0) beneath.
    Correlations: RdBu_r on -1..1; anything else: viridis on the data's range."""
    if metric.startswith("cos_") and not per_head:
        return 0.0, 1.0, PAPER_CMAP
    if metric.startswith("cos_"):
        v = np.asarray([] if values is None else values, dtype=float)
        v = v[np.isfinite(v)]
        return ((float(v.min()), float(v.max())) if v.size else (0.0, 1.0)) + (PAPER_HEAD_CMAP,)
    if metric.startswith("corr_"):
        return -1.0, 1.0, "RdBu_r"
    return None, None, "viridis"


def range_words(metric: str, per_head: bool = False) -> str:
    """Where :func:`color_range`'s colours come from, in words (for captions)."""
    if metric.startswith("cos_") and not per_head:
        return "colours: RdYlBu_r on 0-1, as the authors' plot-cosine-similarity.py"
    if metric.startswith("cos_"):
        return ("colours: RdBu_r on the range of the cells drawn, one range for all layers, as "
                "the authors' plot-per-head-similarity.py")
    return ""


def statistics_record(manifest: dict[str, Any] | None, models=()) -> dict[str, Any]:
    """The manifest's record of the statistics the rows of ``models`` were scored against, as
    one dict (file, stats_id, rows, recipe or from_file, and T, counts, conventions where
    recorded), whatever the manifest's layout: ``statistics`` a dict (the sweep since it
    records where its statistics came from), ``statistics_by_model`` (runs whose models'
    statistics differ), or the older layout (``statistics`` a file name and
    ``vocabulary.recipe``)."""
    manifest = manifest or {}
    by_model = manifest.get("statistics_by_model") or {}
    entry = next((by_model[k] for m in models for k in (m, short_model(m)) if k in by_model),
                 manifest)
    stats = entry.get("statistics")
    record = dict(stats) if isinstance(stats, dict) else {"file": str(stats)} if stats else {}
    vocab = entry.get("vocabulary") or {}
    if "recipe" not in record and vocab.get("recipe"):
        record["recipe"] = vocab["recipe"]
    if record.get("rows") is None and vocab.get("rows") is not None:
        record["rows"] = vocab["rows"]
    return record


def _recorded(record: dict[str, Any], key: str):
    """``key`` from the record, its recipe or the provenance the file holds (first found)."""
    for where in (record, record.get("recipe") or {}, record.get("from_file") or {}):
        if where.get(key) is not None:
            return where[key]
    return None


def _window(record: dict[str, Any]) -> int | None:
    """T, the positions per window: recorded, the recipe's seq_len, or the counts' positions
    per sequence when every window is full."""
    T = _recorded(record, "T") or _recorded(record, "seq_len")
    if T is not None:
        return int(T)
    counts = _recorded(record, "counts") or {}
    seqs, positions = counts.get("sequences"), counts.get("positions")
    if seqs and positions and positions % seqs == 0:
        return positions // seqs
    return None


def _corpus_words(record: dict[str, Any]) -> list[str]:
    recipe, corpus = record.get("recipe") or {}, (record.get("from_file") or {}).get("corpus")
    words = []
    if recipe:
        where = " ".join(str(x) for x in (recipe.get("dataset"), recipe.get("data_dir")) if x)
        docs = recipe.get("docs")
        words.append(f"{where}, " + (f"first {docs:,} documents" if docs else "all documents")
                     + (f" of >= {recipe['min_chars']:,} characters"
                        if recipe.get("min_chars") else ""))
    elif corpus:
        words.append(f"{corpus.get('dataset', 'corpus')} corpus"
                     + (f" ({corpus['what']})" if corpus.get("what") else ""))
    elif record.get("file"):
        words.append(f"statistics file {Path(str(record['file'])).name}")
    counts = _recorded(record, "counts") or {}
    if counts.get("sequences") and not recipe:
        words.append(f"{counts['sequences']:,} sequences")
    if counts.get("tokens"):
        words.append(f"{counts['tokens']:,} tokens")
    T = _window(record)
    if T is not None:
        words.append(f"T = {T}")
    return words


def _vocabulary_words(record: dict[str, Any]) -> str | None:
    top_k, rows = (record.get("recipe") or {}).get("top_k"), record.get("rows")
    d_vocab = ((record.get("from_file") or {}).get("tokenizer") or {}).get("d_vocab")
    if top_k:
        return f"top {top_k:,} tokens"
    if rows is None:
        return None
    if d_vocab is None or rows == d_vocab:
        return f"full vocabulary ({rows:,} ids)"
    return f"{rows:,} of {d_vocab:,} token ids"


def statistics_label(df: pd.DataFrame, manifest: dict[str, Any] | None = None) -> str:
    """The statistics a table was scored against, in words: the corpus (recipe, or what the
    statistics file records), documents, tokens, T, the vocabulary, the conventions when
    recorded, and the stats_id of the rows; from the manifest and the table only."""
    models = sorted({str(m) for m in df["model"].dropna()}) if "model" in df else []
    record = statistics_record(manifest, models)
    words = ", ".join(_corpus_words(record))
    parts = [words] if words else []
    vocab = _vocabulary_words(record)
    parts += [vocab] if vocab else []
    conventions = _recorded(record, "conventions")
    parts += [f"{conventions} conventions"] if conventions else []
    ids = sorted({str(x) for x in df["stats_id"].dropna()}) if "stats_id" in df else []
    ids = ids or ([str(record["stats_id"])] if record.get("stats_id") else [])
    parts += [f"stats_id {', '.join(ids)}"] if ids else []
    return "statistics: " + "; ".join(parts) if parts else "statistics not recorded"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) if width else text


def title(df: pd.DataFrame, analysis: str, metric: str, manifest: dict[str, Any] | None = None,
          *, math: bool = True, width: int = 95) -> str:
    """Two lines (each wrapped to ``width`` characters): "pythia-1.4b: residual stream after
    layer l vs Phibar^T Bbar^T" and, for a comparison with the theory, the statistics
    (:func:`statistics_label`)."""
    models = ", ".join(sorted({short_model(m) for m in df["model"].dropna()})) or "model?"
    settings = sorted({str(s) for s in df["settings"].dropna()}) if "settings" in df else []
    run = f" (settings {'; '.join(settings)})" if settings else ""
    lines = [_wrap(f"{models}{run}: {what(analysis, metric).text(math)}", width)]
    if what(analysis, metric).theory:
        lines.append(_wrap(statistics_label(df, manifest), width))
    return "\n".join(lines)
