"""What a figure says about its numbers: what is compared with what, for which model and which
statistics, on which colour scale. Built from the table (model, analysis, metric, stats_id) and
the run's manifest when there is one; nothing about a run is typed in here.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from pythia_probe.plots.table import short_model

PHIBT, QBAR, BBAR, BBART, DELTA = "Phibar^T Bbar^T", "Qbar", "Bbar", "Bbar^T", "Delta"
#: the theory names as matplotlib mathtext
MATH = {PHIBT: r"$\bar{\Phi}^{\top}\bar{B}^{\top}$", QBAR: r"$\bar{Q}$", BBAR: r"$\bar{B}$",
        BBART: r"$\bar{B}^{\top}$", DELTA: r"$\Delta$"}

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

    def text(self, math: bool = False) -> str:
        if self.theory is None:
            return self.model
        return f"{self.model} vs {MATH.get(self.theory, self.theory) if math else self.theory}"


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
    if analysis in _ATTN_MAP and metric in ("cos_mean", "cos_head"):
        who = "mean over heads" if metric == "cos_mean" else "per head"
        return What(f"attention map of layer l ({_ATTN_MAP[analysis]}, {who})", QBAR)
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


def color_range(metric: str, per_head: bool = False) -> tuple[float | None, float | None, str]:
    """(vmin, vmax, colormap): the paper's fixed ranges for cosines (0-1; per-head panels
    0.2-0.8), -1..1 for correlations, the data's range otherwise."""
    if metric.startswith("cos_"):
        return (0.2, 0.8, "viridis") if per_head else (0.0, 1.0, "viridis")
    if metric.startswith("corr_"):
        return -1.0, 1.0, "RdBu_r"
    return None, None, "viridis"


def _count(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else f"{n:,}"


def _recipe_parts(recipe: dict[str, Any], rows: Any) -> list[str]:
    docs = recipe.get("docs")
    top_k = recipe.get("top_k")
    vocab = (f"top {top_k:,}" if top_k else
             f"full vocabulary ({rows:,} ids)" if isinstance(rows, int) else "full vocabulary")
    return [Path(str(recipe.get("dataset", "?"))).name,
            f"{_count(docs)} docs" if docs else "all docs", vocab]


def statistics_label(df: pd.DataFrame, manifest: dict[str, Any] | None = None) -> str:
    """The statistics a table was scored against: the recipe from the manifest (corpus,
    documents, vocabulary) or the statistics file's name, and the stats_id of the rows."""
    manifest = manifest or {}
    vocab = manifest.get("vocabulary") or {}
    rows = vocab.get("rows")
    if vocab.get("recipe"):
        parts = _recipe_parts(vocab["recipe"], rows)
    elif manifest.get("statistics"):
        parts = [Path(str(manifest["statistics"])).name]
        parts += [f"{rows:,} tokens"] if isinstance(rows, int) else []
    else:
        parts = []
    ids = sorted({str(x) for x in df["stats_id"].dropna()}) if "stats_id" in df else []
    if ids:
        parts.append("stats " + ", ".join(ids))
    return ", ".join(parts) or "statistics not recorded"


def title(df: pd.DataFrame, analysis: str, metric: str, manifest: dict[str, Any] | None = None,
          *, math: bool = True, width: int = 95) -> str:
    """"pythia-1.4b: residual stream after layer l vs Phibar^T Bbar^T (openwebtext, 100k
    docs, top 5,000, stats ...)", wrapped to ``width`` characters."""
    models = ", ".join(sorted({short_model(m) for m in df["model"].dropna()})) or "model?"
    settings = sorted({str(s) for s in df["settings"].dropna()}) if "settings" in df else []
    run = f" [{'; '.join(settings)}]" if settings else ""
    stats = statistics_label(df, manifest) if what(analysis, metric).theory else None
    text = f"{models}{run}: {what(analysis, metric).text(math)}"
    text += f" ({stats})" if stats else ""
    return "\n".join(textwrap.wrap(text, width)) if width else text
