"""The six items of spec section C: our number next to the paper's claim, from the result tables.

Reads results/icrecall/{main,dynamics,samples,pretrained,kpairs}.parquet (written by the other
analyses/icrecall_*.py scripts) and writes results/icrecall/summary.csv and summary.md. Every
number is computed from the tables; the verdict rules are stated in each row.

    python analyses/icrecall_summary.py
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from pythia_probe.results import read_manifest, read_shard
from pythia_probe.toy.icrecall.report import OUT, wide
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts

GAP, OFF, REL, ANS = 0.05, 0.05, 0.999, 0.995  # pattern and accuracy criteria
TELL = 0.99  # P(correct relation | confusing prompt) at the memory's temperature: both pairs used


def _load(out: Path, name: str, analysis: str) -> pd.DataFrame | None:
    path = out / f"{name}.parquet"
    if not path.exists():
        return None
    df = read_shard(path)
    return wide(df[df["analysis"] == analysis])


def _pattern(w: pd.DataFrame) -> tuple[str, bool | str]:
    gap, off = w["pair_gap_max"].max(), w["offpair_mass"].max()
    lo, hi = w["pair_mass_min"].min(), w["pair_mass_max"].max()
    tell = w["relation_prob_confusing"].min()
    txt = (f"max within-pair gap {gap:.3f}, max mass on s_query+last {off:.3f}, "
           f"pair masses {lo:.3f}-{hi:.3f}, min P(correct | confusing) {tell:.3f} "
           f"({len(w)} runs)")
    if gap <= GAP and off <= OFF and tell >= TELL:
        return txt, True
    return txt, "partly" if gap <= 2 * GAP and off <= 2 * OFF and tell >= TELL else False


def _accuracy(w: pd.DataFrame) -> tuple[str, bool]:
    n = int(w["n_all"].sum())
    pooled = (w["relation_acc"] * w["n_all"]).sum() / n
    conf = (w["relation_acc_confusing"] * w["n_confusing"]).sum() / w["n_confusing"].sum()
    ans = (w["answer_acc"] * w["n_all"]).sum() / n
    prob = (w["relation_prob"] * w["n_all"]).sum() / n
    txt = (f"argmax relation {pooled:.5f} (per seed min {w['relation_acc'].min():.5f}; confusing "
           f"{conf:.5f}), answer {ans:.5f} (min {w['answer_acc'].min():.5f}); sampling at the "
           f"memory's temperature: relation {prob:.5f}; {n} fresh prompts, "
           f"{int(w['n_confusing'].sum())} confusing")
    return txt, bool(w["relation_acc"].min() >= REL and w["answer_acc"].min() >= ANS)


def item1_2(out: Path) -> list[dict]:
    w = _load(out, "main", "icrecall_main")
    if w is None:
        return []
    pgd, gd = w[w["method"] == "pgd"], w[w["method"] == "gd"]
    pat, ok1 = _pattern(pgd)
    acc, ok2 = _accuracy(pgd)
    gd_pat = _pattern(gd)[0] if len(gd) else "n/a"
    return [
        _row(1, "pairwise pattern at '?'", "v* = (a, a, 1/2-a, 1/2-a, 0, 0)", "PGD: " + pat,
             ok1, f"every seed: gap <= {GAP}, s_query+last <= {OFF} and P(correct relation | "
             f"confusing) >= {TELL} (the pattern tells r from a confusing relation); 'partly' "
             f"with twice the gap and off-pair tolerances; "
             f"GD for comparison: {gd_pat}"),
        _row(2, "accuracy on fresh prompts", f">= {REL} relation, >= {ANS} answer (near-perfect)",
             "PGD: " + acc, ok2, "argmax (the paper's low-temperature decoding), min over seeds; "
             "note argmax also breaks ties on the smoothed AND's exponentially small tails"),
    ]


def item3(out: Path) -> list[dict]:
    w = _load(out, "dynamics", "icrecall_dynamics_summary")
    if w is None:
        return []
    parts, esc = [], {}
    for method in ("gd", "pgd"):
        m = w[w["method"] == method]
        e = m["escape_step"]
        esc[method] = e
        parts.append(f"{method.upper()}: escaped {int(e.notna().sum())}/{len(m)} seeds, median "
                     f"escape step {e.fillna(float('inf')).median():.0f}, median final loss "
                     f"{m['final_loss'].median():.1e}, median P(correct | confusing) "
                     f"{m['relation_prob_confusing'].median():.3f}")
    gd = w[w["method"] == "gd"]
    stuck = gd[gd["escape_step"].isna()]
    if len(stuck):
        free = ((stuck["check_path_barrier"] <= 1e-9) & (stuck["check_path_end_minus_start"] < 0))
        parts.append(f"at the end state of the {len(stuck)} GD seeds that never escaped, the loss "
                     f"falls without a barrier along the straight path to the balanced pairwise "
                     f"row in {int(free.sum())}/{len(stuck)} (median drop "
                     f"{-stuck['check_path_end_minus_start'].median():.2e}, median |grad| "
                     f"{stuck['check_grad_norm'].median():.1e}): a plateau/saddle, not a minimum")
    notes = _pgd_failures(out, w)
    parts += notes
    gd_e = esc["gd"].fillna(float("inf"))
    later = bool(gd_e.median() >= 5 * esc["pgd"].median())
    ok: bool | str = bool(esc["pgd"].notna().all() and later)
    if not ok and later and notes and all("one-sided" in n for n in notes):
        ok = "partly"
    return [_row(3, "two-phase dynamics (GD plateau, PGD escape)",
                 "GD stalls at a saddle confusing r with a confusing relation; PGD escapes",
                 "; ".join(parts), ok,
                 "escape = first step from which P(correct relation | confusing) stays >= the "
                 "escape level; passes if every PGD seed escapes and GD's median escape is >= 5x "
                 "later (never = inf); 'partly' if the only PGD failures are seeds whose training "
                 "set is one-sided")]


def _pgd_failures(out: Path, w: pd.DataFrame) -> list[str]:
    """Explain PGD seeds that never escaped by their training set's ambiguous pairs: when every
    ambiguous training prompt is ambiguous on the same pair, attending only the other pair is a
    global minimum of the training loss (a sample-size failure, not an optimisation one)."""
    bad = w[(w["method"] == "pgd") & w["escape_step"].isna()]
    if not len(bad):
        return []
    n_train = int(read_manifest(out / "manifest_dynamics")["config"]["n_train"])
    kb = make_kb(TaskConfig())
    notes = []
    for seed in bad["seed"].astype(int):
        amb = sample_prompts(kb, n_train, seed=seed).ambiguous
        one_sided = bool(amb[:, 0].sum() == 0 or amb[:, 1].sum() == 0)
        notes.append(f"PGD seed {seed} never escaped; its {n_train} training prompts have "
                     f"{int(amb[:, 0].sum())} ambiguous on pair 1 and {int(amb[:, 1].sum())} on "
                     f"pair 2" + (" (one-sided: the one-pair state is a global minimum of its "
                                  "training loss)" if one_sided else ""))
    return notes


def item4(out: Path) -> list[dict]:
    path = out / "samples.parquet"
    if not path.exists():
        return []
    df = read_shard(path)
    best = wide(df[df["analysis"] == "icrecall_samples_smallest_N"])
    target = float(df[df["metric"] == "target"]["value"].iloc[0])
    best["n"] = best["n"].astype(int)
    med = best.groupby("n")["smallest_N_at_target"].median()
    worst = best.groupby("n")["smallest_N_at_target"].max()
    txt = ", ".join(f"n={n}: median {med[n]:.0f}, max {worst[n]:.0f}" for n in med.index)
    lo, hi = med.index.min(), med.index.max()
    bound = (math.log(hi) / math.log(lo)) ** 2
    ok = bool(med.notna().all() and med[hi] <= med[lo] * bound)
    return [_row(4, "sample complexity vs n", "smallest N grows at most polylog(n); ~8 samples",
                 f"smallest N from which every larger N reaches relation acc >= {target} "
                 f"(3 seeds per n): {txt}", ok,
                 f"passes if median N*(n_max) <= N*(n_min) * (log n_max / log n_min)^2 = "
                 f"{bound:.2f} x")]


def item5(out: Path) -> list[dict]:
    w = _load(out, "pretrained", "icrecall_pretrained")
    mem = _load(out, "pretrained", "icrecall_pretrained_memory")
    if w is None:
        return []
    pgd = w[w["method"] == "pgd"]
    pat, ok1 = _pattern(pgd)
    acc, ok2 = _accuracy(pgd)
    rec = (f"; memory's own answer recall {mem['memory_answer_recall'].iloc[0]:.4f}"
           if mem is not None and len(mem) else "")
    gd = w[w["method"] == "gd"]
    gd_txt = f"; GD: {_pattern(gd)[0]}, {_accuracy(gd)[0]}" if len(gd) else ""
    return [_row(5, "pre-trained memory", "same pattern and accuracy as the constructed memory",
                 f"PGD: {pat}; {acc}{rec}", _both(ok1, ok2),
                 f"criteria of items 1 and 2{gd_txt}")]


def item6(out: Path) -> list[dict]:
    w = _load(out, "kpairs", "icrecall_kpairs")
    if w is None:
        return []
    w["k"] = w["k"].astype(int)
    parts, oks = [], []
    for k, g in w.groupby("k"):
        pat, _ = _pattern(g)
        acc, _ = _accuracy(g)
        parts.append(f"k={k}: {pat}; {acc}")
        if k > 2:
            gap, off = g["pair_gap_max"].max(), g["offpair_mass"].max()
            oks.append(True if gap <= GAP and off <= OFF else
                       "partly" if gap <= 2 * GAP and off <= 2 * OFF else False)
    return [_row(6, "k > 2 pairs", "the pairwise pattern generalises (equal weight within pairs)",
                 " | ".join(parts), _all(oks),
                 f"every run with k > 2: within-pair gap <= {GAP} and s_query+last <= {OFF} "
                 "('partly' within twice that); spec item 6 is about the pattern, so accuracy is "
                 "reported, not judged")]


def _designs(out: Path) -> list[str]:
    """Markdown lines: per design tried and method, seeds ending confused and median escape."""
    w = _load(out, "design", "icrecall_design")
    if w is None:
        return []
    lines = ["## Memory designs tried (analyses/icrecall_design.py, n = 2000, N = 8)", "",
             "| design | method | seeds ending confused (P(correct given confusing) < 0.9) | "
             "median escape step | median final s_query+last |", "|---|---|---|---|---|"]
    for (d, m), g in w.groupby(["design", "method"], sort=False):
        conf = int((g["relation_prob_confusing"] < 0.9).sum())
        esc = g["escape_step"].fillna(float("inf")).median()
        lines.append(f"| {d} | {m} | {conf}/{len(g)} | {esc:.0f} | "
                     f"{(g['attn_s_query'] + g['attn_last']).median():.2f} |")
    return lines + [""]


def _both(a: bool | str, b: bool | str) -> bool | str:
    return _all([a, b])


def _all(oks: list[bool | str]) -> bool | str:
    """True if all True; 'partly' if any is True or 'partly'; else False."""
    if oks and all(o is True for o in oks):
        return True
    return "partly" if any(o is True or o == "partly" for o in oks) else False


def _row(item, what, paper, ours, ok, rule) -> dict:
    return {"item": item, "what": what, "paper": paper, "ours": ours,
            "reproduces": ok if isinstance(ok, str) else ("yes" if ok else "no"), "rule": rule}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(OUT))
    out = Path(p.parse_args(argv).out)
    rows = item1_2(out) + item3(out) + item4(out) + item5(out) + item6(out)
    if not rows:
        print(f"no result tables under {out}; run the analyses/icrecall_*.py scripts first")
        return 1
    df = pd.DataFrame(rows)
    df.to_csv(out / "summary.csv", index=False)
    lines = ["# IC-recall: section C, ours vs the paper", "",
             "Generated by analyses/icrecall_summary.py from the tables in this folder.", ""]
    for r in rows:
        lines += [f"## {r['item']}. {r['what']}: reproduces **{r['reproduces']}**", "",
                  f"- paper: {r['paper']}", f"- ours: {r['ours']}", f"- rule: {r['rule']}", ""]
    lines += _designs(out)
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
