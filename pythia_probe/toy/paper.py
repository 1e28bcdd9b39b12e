"""What the leading-terms paper reports for its toy model (Sec. 5.1, App. B), and one run's
numbers beside it: the minimum over training of each weight's cosine with its leading term
(Tables 1 and 2), next to the run's batch ceiling and the paper's number, with the settings that
differ from the paper's.

Batch ceiling: the theory matrices come from the first training batch, as in the paper; the model
is trained on every sequence. The cosine between a first-batch leading term and the same term
over the whole training set is what a weight that has learnt the whole set's term scores against
the first-batch term: an upper bound on the first-batch agreement to expect once the model has
learnt the whole set (not a floor). A weight's cosine at or near its ceiling is as high as the
batch lets it be; one far below it has left its leading term. Runs written before the rename
name it ``noise_floor`` (rows/noise_floor.parquet, metric ``noise_floor_*``);
:func:`upgrade_names` reads them under the new names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

#: weight -> metric suffix naming its leading term (as in the trainer's rows)
PAIRS = {"W_O": "W_O_Bbar", "V": "V_PhiBT", "W": "W_Qbar", "P": "P_Delta"}
LABELS = {"cos_W_Qbar": "attention (W vs Qbar)", "cos_V_PhiBT": "value (V vs Phibar^T Bbar^T)",
          "cos_W_O_Bbar": "output (W_O vs Bbar)", "cos_P_Delta": "positional (P vs Delta)"}
#: Table 1 (word tokenizer, lr 0.005) and Table 2 (BPE 10,000, lr 0.005): min cosine over epochs
#: and layers; the paper never compares P with Delta
TABLE1 = {"cos_W_Qbar": 0.999496, "cos_V_PhiBT": 0.999169, "cos_W_O_Bbar": 0.998486}
TABLE2 = {"cos_W_Qbar": 0.999914, "cos_V_PhiBT": 0.998800, "cos_W_O_Bbar": 0.997891}
#: the paper's runs as trainer settings
TABLE1_RUN = dict(dataset="roneneldan/TinyStories", tokenizer="word:3000", seq_len=200,
                  n_seqs=65536, batch_size=2048, micro_batch=512, epochs=100, lr=0.005, layers=3)
TABLE2_RUN = {**TABLE1_RUN, "tokenizer": "bpe:10000", "epochs": 10, "micro_batch": 256}
FIGURE4_RUN = {**TABLE1_RUN, "lr": 0.05}
COMPARED = ("dataset", "tokenizer", "seq_len", "n_seqs", "batch_size", "epochs", "lr", "layers")


CEILING = "batch_ceiling_"
"""Metric prefix of the trainer's batch-ceiling rows (analysis ``toy_batch_ceiling``)."""
OLD_NAMES = {"metric": ("noise_floor_", CEILING),
             "analysis": ("toy_noise_floor", "toy_batch_ceiling")}
"""column -> (name in runs written before the rename, name now)."""


def ceiling_metric(metric: str) -> str:
    """'cos_W_O_Bbar' -> 'batch_ceiling_W_O_Bbar' (the trainer's row of that weight's ceiling)."""
    return CEILING + metric.removeprefix("cos_")


def upgrade_names(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of a run written before the rename (metric ``noise_floor_*``, analysis
    ``toy_noise_floor``) under today's names; other rows unchanged."""
    out = df.copy()
    for col, (old, new) in OLD_NAMES.items():
        if col in out:
            out[col] = out[col].map(
                lambda v, o=old, n=new: n + v[len(o):] if isinstance(v, str) and v.startswith(o)
                else v)
    return out


def min_cosines(df: pd.DataFrame, paper: Mapping[str, float] = TABLE1) -> pd.DataFrame:
    """Per weight: our minimum cosine over logged steps and layers (``layer`` is 1-based, as in
    the paper), where it occurred, the run's batch ceiling (nan for runs without one; runs
    written before the rename are read through :func:`upgrade_names`) and the paper's number
    (nan where the paper has none)."""
    df = upgrade_names(df)
    out = []
    for metric, label in LABELS.items():
        sel = df[df["metric"] == metric]
        if not len(sel):
            continue
        worst = sel.loc[sel["value"].idxmin()]
        ceiling = df.loc[df["metric"] == ceiling_metric(metric), "value"]
        out.append({"weight": label, "ours_min_cosine": float(worst["value"]),
                    "at_step": int(worst["step"]),
                    "at_layer": None if pd.isna(worst["layer"]) else int(worst["layer"]),
                    "batch_ceiling": float(ceiling.iloc[0]) if len(ceiling) else math.nan,
                    "paper": paper.get(metric, math.nan)})
    return pd.DataFrame(out).astype({"at_layer": "Int64"})


def loss_moved(df: pd.DataFrame) -> tuple[float, float, int]:
    """(first, last) logged interval-mean training loss and the last logged step."""
    loss = df[df["metric"] == "loss"].sort_values("step")
    return float(loss["value"].iloc[0]), float(loss["value"].iloc[-1]), int(loss["step"].iloc[-1])


def settings_diff(cfg: Any, run: Mapping[str, Any], d_vocab: int) -> str:
    """The settings of ``cfg`` that differ from the paper's run, 'ours (paper)'."""
    parts = [f"{k} {getattr(cfg, k)} (paper {run[k]})" for k in COMPARED
             if getattr(cfg, k) != run[k]]
    paper_v = int(str(run["tokenizer"]).split(":")[1])
    if d_vocab != paper_v:
        parts.append(f"|V| {d_vocab} (paper {paper_v})")
    return ", ".join(parts) if parts else "none"


def comparison_lines(df: pd.DataFrame, cfg: Any, d_vocab: int,
                     paper: Mapping[str, float] = TABLE1,
                     run: Mapping[str, Any] = TABLE1_RUN, name: str = "Table 1") -> list[str]:
    """Our headline numbers beside the paper's: the min-cosine table with batch ceilings, the
    loss movement and the settings that differ."""
    table = min_cosines(df, paper)
    lines = [f"{name}: min over logged steps and layers of the cosine with the leading term",
             f"{'weight':30s} {'ours':>9s} {'step':>6s} {'layer':>5s} {'batch ceiling':>13s} "
             f"{'paper':>9s}"]
    for r in table.itertuples(index=False):
        layer = "-" if pd.isna(r.at_layer) else str(r.at_layer)
        lines.append(f"{r.weight:30s} {r.ours_min_cosine:9.6f} {r.at_step:6d} {layer:>5s} "
                     f"{_f(r.batch_ceiling, 13)} {_f(r.paper, 9)}")
    first, last, step = loss_moved(df)
    lines += [f"training loss (interval means): {first:.4f} -> {last:.4f} by step {step} "
              f"(uniform prediction: log |V| = {math.log(d_vocab):.4f})",
              "batch ceiling: cosine of the first-batch leading term with the same term over "
              "the whole training set (what a weight that has learnt the whole set scores: an "
              "upper bound on first-batch agreement, not a floor)",
              f"settings that differ from the paper's {name} run: "
              + settings_diff(cfg, run, d_vocab)]
    return lines


def _f(v: float, width: int) -> str:
    return f"{'-':>{width}s}" if v != v else f"{v:{width}.6f}"
