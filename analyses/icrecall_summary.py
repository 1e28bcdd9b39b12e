"""The six items of spec section C: our number next to the paper's claim, from the result tables.

Reads results/icrecall/{main,controls,dynamics,saddle,samples,pretrained,kpairs}.parquet
(written by the other analyses/icrecall_*.py scripts) and writes results/icrecall/summary.csv
and summary.md. Every number is computed from the tables.

Verdicts are judged on measures that a confused state fails (the control rows show it):
- P(correct relation | confusing prompt) at the memory's temperature ("P(conf)"), per seed;
- accuracy of two-step decoding sampled at the memory's temperature, pooled over seeds with a
  Wilson 95% interval;
- the attention row at '?' (within-pair gap, mass on s_query + '?').
Argmax accuracy (the paper's low-temperature decoding) is reported beside them, never judged
alone: uniform attention already gets ~99% argmax relation accuracy with the default memory.

    python analyses/icrecall_summary.py
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from pythia_probe.fileio import write_text
from pythia_probe.results import read_manifest, read_shard
from pythia_probe.toy.icrecall.curvature import LABELS, label_from_row
from pythia_probe.toy.icrecall.experiment import CONTROL_ROWS
from pythia_probe.toy.icrecall.intervals import bootstrap, wilson
from pythia_probe.toy.icrecall.report import OUT, wide
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts

GAP, OFF = 0.05, 0.05  # pattern: within-pair gap, mass on s_query + '?'
TELL = 0.99  # P(correct relation | confusing prompt), every seed
REL, ANS = 0.999, 0.995  # sampled two-step accuracy (relation, answer), pooled Wilson bound
REACH = 0.5  # curvature labels: PGD's perturbation radius rho_p (TrainConfig's default)
PATTERN_RULE = (f"a seed passes when its within-pair gap <= {GAP}, mass on s_query+'?' <= "
                f"{OFF} and P(conf) >= {TELL}; 'yes' if every seed passes, 'partly' if at "
                f"least half the seeds pass with twice the gap and mass tolerances, else 'no'")
ACCURACY_RULE = (f"a seed passes when the Wilson 95% lower bounds of its two-step accuracies "
                 f"sampled at the memory's temperature reach relation >= {REL} and answer >= "
                 f"{ANS}; 'yes' if every seed passes, 'partly' if at least half the seeds reach "
                 f"them by point estimate, else 'no'")


def _setting(out: Path, name: str, analysis: str, metric: str) -> float:
    df = read_shard(out / f"{name}.parquet")
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric)]["value"]
    return float(sel.iloc[0]) if len(sel) else float("nan")


def _load(out: Path, name: str, analysis: str) -> pd.DataFrame | None:
    path = out / f"{name}.parquet"
    if not path.exists():
        return None
    df = read_shard(path)
    df = df[df["analysis"] == analysis]
    return wide(df) if len(df) else None


def pooled(w: pd.DataFrame, metric: str, n_col: str = "n_all") -> tuple[float, float, float]:
    """Pooled proportion of ``metric`` (a per-run fraction over n_col prompts) and its Wilson
    95% interval."""
    n = float(w[n_col].sum())
    k = float((w[metric] * w[n_col]).round().sum())
    lo, hi = wilson(k, n)
    return (k / n if n else float("nan")), lo, hi


def _prop(w: pd.DataFrame, metric: str, n_col: str = "n_all") -> str:
    p, lo, hi = pooled(w, metric, n_col)
    return f"{p:.5f} [{lo:.5f}, {hi:.5f}]"


def tell_text(w: pd.DataFrame) -> str:
    """P(conf): median over seeds with a bootstrap interval over seeds, and the worst seed with
    its own bootstrap interval over prompts."""
    v = w["relation_prob_confusing"].to_numpy(float)
    lo, hi = bootstrap(v, np.median)
    worst = w.loc[w["relation_prob_confusing"].idxmin()]
    own = ""
    if "relation_prob_confusing_lo" in w:
        own = f" [{worst['relation_prob_confusing_lo']:.4f}, " \
              f"{worst['relation_prob_confusing_hi']:.4f}]"
    return (f"P(conf) median {np.median(v):.4f} [{lo:.4f}, {hi:.4f}], min "
            f"{worst['relation_prob_confusing']:.4f}{own}")


def _pattern_ok(r: pd.Series, scale: float = 1.0) -> bool:
    return bool(r["relation_prob_confusing"] >= TELL and r["pair_gap_max"] <= scale * GAP
                and r["offpair_mass"] <= scale * OFF)


def pattern_verdict(w: pd.DataFrame) -> tuple[str, str]:
    """The pairwise-pattern rule (PATTERN_RULE) over the runs (seeds) in ``w``."""
    gap, off = w["pair_gap_max"].max(), w["offpair_mass"].max()
    lo, hi = w["pair_mass_min"].min(), w["pair_mass_max"].max()
    strict = [_pattern_ok(r) for _, r in w.iterrows()]
    loose = [_pattern_ok(r, 2.0) for _, r in w.iterrows()]
    txt = (f"pattern passes on {sum(strict)}/{len(w)} seeds; max within-pair gap {gap:.3f}, "
           f"max mass on "
           f"s_query+'?' {off:.3f}, pair masses {lo:.3f}-{hi:.3f}, {tell_text(w)}")
    return _verdict(strict, loose), txt


def _verdict(strict: list[bool], loose: list[bool]) -> str:
    """yes: every seed passes; partly: at least half the seeds pass the looser test; else no."""
    if strict and all(strict):
        return "yes"
    return "partly" if loose and 2 * sum(loose) >= len(loose) else "no"


def _seed_accuracy(r: pd.Series, bound: bool) -> bool:
    n = r["n_all"]
    rel = wilson(round(r["relation_sampled"] * n), n)[0] if bound else r["relation_sampled"]
    ans = wilson(round(r["answer_sampled"] * n), n)[0] if bound else r["answer_sampled"]
    return bool(rel >= REL and ans >= ANS)


def accuracy_verdict(w: pd.DataFrame) -> tuple[str, str]:
    """The accuracy rule (ACCURACY_RULE) over the runs (seeds) in ``w``; argmax beside."""
    strict = [_seed_accuracy(r, True) for _, r in w.iterrows()]
    loose = [_seed_accuracy(r, False) for _, r in w.iterrows()]
    txt = (f"sampled accuracy passes on {sum(strict)}/{len(w)} seeds; pooled: sampled relation "
           f"{_prop(w, 'relation_sampled')} (confusing "
           f"{_prop(w, 'relation_sampled_confusing', 'n_confusing')}), sampled answer "
           f"{_prop(w, 'answer_sampled')}; argmax relation {_prop(w, 'relation_acc')}, answer "
           f"{_prop(w, 'answer_acc')}; {int(w['n_all'].sum())} fresh prompts, "
           f"{int(w['n_confusing'].sum())} confusing")
    return _verdict(strict, loose), txt


def combine(*verdicts: str) -> str:
    """'yes' if all are yes; 'partly' if any is yes or partly; else 'no'."""
    if verdicts and all(v == "yes" for v in verdicts):
        return "yes"
    return "partly" if any(v in ("yes", "partly") for v in verdicts) else "no"


def _row(item, what, paper, ours, verdict, rule, measure) -> dict:
    return {"item": item, "what": what, "paper": paper, "ours": ours, "reproduces": verdict,
            "rule": rule, "measure": measure}


def controls_lines(w: pd.DataFrame | None, title: str) -> list[str]:
    """Markdown table: each reference row under the item 1 and item 2 rules."""
    if w is None:
        return []
    lines = [f"## Controls: {title}", "",
             "| state | P(conf) [bootstrap 95%] | sampled relation [Wilson 95%] | sampled answer "
             "| argmax relation | item-1 rule | item-2 rule |", "|---|---|---|---|---|---|---|"]
    order = {s: i for i, s in enumerate(CONTROL_ROWS)}
    w = w.sort_values("state", key=lambda s: s.map(order))
    for _, r in w.iterrows():
        one = r.to_frame().T
        lines.append(
            f"| {r['state']} | {r['relation_prob_confusing']:.4f} "
            f"[{r['relation_prob_confusing_lo']:.4f}, {r['relation_prob_confusing_hi']:.4f}] | "
            f"{_prop(one, 'relation_sampled')} | {_prop(one, 'answer_sampled')} | "
            f"{_prop(one, 'relation_acc')} | {pattern_verdict(one)[0]} | "
            f"{accuracy_verdict(one)[0]} |")
    return lines + [""]


def control_failures(w: pd.DataFrame | None) -> str:
    """One sentence: which reference states each rule rejects (they must, except 'ideal')."""
    if w is None:
        return ""
    bad = w[w["state"] != "ideal"]
    fails = [s for s, r in zip(bad["state"], bad.iterrows(), strict=True)
             if pattern_verdict(r[1].to_frame().T)[0] == "no"
             and accuracy_verdict(r[1].to_frame().T)[0] == "no"]
    return (f"; the item-1 and item-2 rules reject {len(fails)}/{len(bad)} reference states "
            f"({', '.join(fails)})")


def item1_2(out: Path) -> list[dict]:
    w = _load(out, "main", "icrecall_main")
    if w is None:
        return []
    ctl = _load(out, "controls", "icrecall_controls")
    pgd, gd = w[w["method"] == "pgd"], w[w["method"] == "gd"]
    ok1, pat = pattern_verdict(pgd)
    ok2, acc = accuracy_verdict(pgd)
    pat += failures_note(out, "manifest_main", pgd)
    gd_txt = f"; GD for comparison: {pattern_verdict(gd)[1]}" if len(gd) else ""
    return [
        _row(1, "pairwise pattern at '?'", "v* = (a, a, 1/2-a, 1/2-a, 0, 0)", "PGD: " + pat,
             ok1, PATTERN_RULE + gd_txt + control_failures(ctl),
             "attention row at '?' and P(conf)"),
        _row(2, "accuracy on fresh prompts",
             f">= {REL} relation, near-perfect answer (low-temperature decoding)",
             "PGD: " + acc, ok2, ACCURACY_RULE + control_failures(ctl),
             "sampled two-step accuracy"),
    ]


def failures_note(out: Path, manifest: str, w: pd.DataFrame) -> str:
    """Name the seeds with P(conf) < TELL and whether their training prompts are one-sided
    (every ambiguous prompt ambiguous on the same pair: attending the other pair is then a global
    minimum of their training loss), from the run's manifest (TaskConfig, n_train)."""
    bad = w[w["relation_prob_confusing"] < TELL]
    path = out / manifest
    if not len(bad) or not (path / "manifest.json").exists():
        return ""
    cfg = read_manifest(path)["config"]
    kb = make_kb(TaskConfig(**cfg.get("TaskConfig", {})))
    notes = []
    for seed in bad["seed"].astype(int):
        amb = sample_prompts(kb, int(cfg["n_train"]), seed=seed).ambiguous
        a, b = int(amb[:, 0].sum()), int(amb[:, 1].sum())
        notes.append(f"seed {seed} ({a} training prompts ambiguous on pair 1, {b} on pair 2"
                     + (": one-sided)" if a == 0 or b == 0 else ")"))
    return "; P(conf) < " + f"{TELL}: " + ", ".join(notes)


def _count(s: pd.Series) -> str:
    k, n = int(s.sum()), int(s.count())
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def ablation_lines(w: pd.DataFrame) -> list[str]:
    """Markdown table of the 2x2 ablation: escapes per arm (Wilson), stall labels."""
    lines = ["## Item 3: 2x2 ablation (analyses/icrecall_dynamics.py)", "",
             "| arm | escaped [Wilson 95%] | median P(conf) | stalls by label | perturbation "
             "escapes at the stalls |", "|---|---|---|---|---|"]
    for arm, g in w.groupby("arm", sort=False):
        st = g[g["escaped"] == 0]
        labels = _labels(st)
        pert = (_count_pair(st["stall_perturb_escapes"], st["stall_perturb_draws"])
                if "stall_perturb_escapes" in st and len(st) else "-")
        lines.append(f"| {arm} | {_count(g['escaped'])} | "
                     f"{g['relation_prob_confusing'].median():.4f} | {labels or '-'} | {pert} |")
    return lines + [""]


def stall_labels(st: pd.DataFrame) -> pd.Series:
    """Label of each stalled run, recomputed from its stored curvature with curvature.label."""
    return pd.Series([label_from_row(r, "stall", REACH) for _, r in st.iterrows()],
                     index=st.index, dtype=object)


def _labels(st: pd.DataFrame) -> str:
    if "stall_eig1" not in st or not len(st):
        return ""
    labs = stall_labels(st)
    one = st["one_sided"] == 1 if "one_sided" in st else pd.Series(False, index=st.index)
    parts = [f"{int((labs == lab).sum())} {lab}" for lab in LABELS if (labs == lab).any()]
    return ", ".join(parts) + (f" ({int(one.sum())} on one-sided training sets)"
                               if one.any() else "")


def _count_pair(k: pd.Series, n: pd.Series) -> str:
    kk, nn = int(k.sum()), int(n.sum())
    lo, hi = wilson(kk, nn)
    return f"{kk}/{nn} [{lo:.2f}, {hi:.2f}]"


def item3(out: Path) -> list[dict]:
    w = _load(out, "dynamics", "icrecall_dynamics_summary")
    if w is None:
        return []
    esc = {a: g["escaped"] for a, g in w.groupby("arm")}
    gd = w[w["arm"] == "gd"]
    stalls = gd[(gd["escaped"] == 0) & (gd["one_sided"] == 0)]
    labs = stall_labels(stalls) if len(stalls) else pd.Series(dtype=object)
    strict = bool(len(labs)) and bool((labs == "strict saddle").all())
    allst = w[w["escaped"] == 0]
    pk = allst["stall_perturb_escapes"].sum() if len(allst) else 0.0
    pn = allst["stall_perturb_draws"].sum() if len(allst) else 0.0
    perturb_escapes = pn > 0 and pk / pn >= 0.5
    pgd_better = esc.get("pgd", pd.Series()).mean() > esc.get("gd", pd.Series()).mean()
    txt = "; ".join(f"{a}: escaped {_count(e)}" for a, e in esc.items())
    if len(stalls):
        txt += (f"; GD stalls (two-sided training sets): {_labels(stalls)}; lowest eigenvalue "
                f"median {stalls['stall_eig1'].median():.1e}, |grad| median "
                f"{stalls['stall_grad_norm'].median():.1e}, escape radius median "
                f"{stalls['stall_escape_radius'].median():.2f}, loss change at distance rho_p "
                f"along -u1 / +u1 median {stalls['stall_line_minus'].median():.1e} / "
                f"{stalls['stall_line_plus'].median():.1e}")
    txt += _states_text(out)
    if pn:
        pert = _count_pair(allst["stall_perturb_escapes"], allst["stall_perturb_draws"])
        txt += f"; random perturbations (radius rho_p) at the stalls of all arms escape {pert}"
    verdict = "yes" if strict and perturb_escapes and pgd_better else (
        "partly" if pgd_better else "no")
    level = _setting(out, "dynamics", "icrecall_dynamics_settings", "escape_level")
    rule = ("'yes' if every GD stall on a two-sided training set is a strict saddle (a "
            "negative Hessian eigenvalue beyond noise, and the loss falls on both sides along "
            "it), random PGD perturbations at the stalls escape in >= 50% of draws, and PGD "
            "escapes in more seeds than GD; 'partly' if only the last holds; escaped: the last "
            f"monitored P(conf) on fresh prompts >= {level}; stall: a run that did not escape")
    return [_row(3, "two-phase dynamics (GD stalls at a saddle, PGD escapes)",
                 "GD stalls at a saddle confusing r with a confusing relation; PGD's "
                 "perturbation escapes", txt, verdict, rule, "P(conf), exact Hessian in W_PP")]


def _states_text(out: Path) -> str:
    """Labels at W = 0 and after PGD's large step (no perturbation), per seed."""
    w = _load(out, "dynamics", "icrecall_dynamics_states")
    if w is None:
        return ""
    parts = []
    for prefix, name in (("init", "at W = 0 (uniform attention)"),
                         ("after_large", "after the large step")):
        labs = pd.Series([label_from_row(r, prefix, REACH) for _, r in w.iterrows()])
        counts = ", ".join(f"{int((labs == lab).sum())} {lab}" for lab in LABELS
                           if (labs == lab).any())
        parts.append(f"{name}: {counts} (lowest eigenvalue median "
                     f"{w[f'{prefix}_eig1'].median():.1e}, |grad| median "
                     f"{w[f'{prefix}_grad_norm'].median():.1e})")
    return "; curvature " + "; ".join(parts)


def item4(out: Path) -> list[dict]:
    path = out / "samples.parquet"
    if not path.exists():
        return []
    df = read_shard(path)
    best = wide(df[df["analysis"] == "icrecall_samples_smallest_N"])
    fit = df[df["analysis"] == "icrecall_samples_fit"].set_index("metric")["value"]
    st = df[df["analysis"] == "icrecall_samples_settings"].set_index("metric")["value"]
    if "smallest_N_at_target" not in best:
        best["smallest_N_at_target"] = float("nan")
    best["n"] = best["n"].astype(int)
    parts = []
    for n, g in best.groupby("n"):
        v = g["smallest_N_at_target"]
        cap = np.where(v.isna(), 2 * st["max_N"], v)
        lo, hi = bootstrap(cap, np.median)
        parts.append(f"n={n}: median {_N(np.median(cap), st)} [{_N(lo, st)}, {_N(hi, st)}] "
                     f"(per seed "
                     f"{'/'.join('never' if x != x else f'{x:.0f}' for x in v)})")
    ns = sorted(best["n"].unique())
    bound = 2 * (math.log(math.log(ns[-1])) - math.log(math.log(ns[0]))) / (
        math.log(ns[-1]) - math.log(ns[0]))
    lo, hi, b = fit["loglog_slope_lo"], fit["loglog_slope_hi"], fit["loglog_slope"]
    never = best.groupby("n")["smallest_N_at_target"].apply(lambda v: v.isna().mean() >= 0.5)
    verdict = ("no" if never.any() or lo > bound else "yes" if hi <= bound else "partly")
    txt = (f"smallest N with P(conf) >= {st['target']} for every larger N, d = "
           f"{st['d_scale']:g} sqrt(n): {'; '.join(parts)}; log-log slope {b:.3f} "
           f"[{lo:.3f}, {hi:.3f}], polylog exponent k = {fit['polylog_slope']:.2f} "
           f"[{fit['polylog_slope_lo']:.2f}, {fit['polylog_slope_hi']:.2f}] (bootstrap over "
           f"seeds); {int(fit['censored'])} (n, seed) never reached it up to N = "
           f"{st['max_N']:.0f} (counted as {2 * st['max_N']:.0f}); n "
           + ("does not measurably matter (the slope interval contains 0)"
              if lo <= 1e-9 and hi >= -1e-9 else "matters (the slope interval excludes 0)"))
    rule = (f"'yes' if the upper bound of the log-log slope's 95% interval is <= {bound:.3f}, "
            f"the log-log slope of (log n)^2 between n = {ns[0]} and {ns[-1]}; 'no' if the "
            f"lower bound exceeds it or at some n most seeds never reach the target; else "
            f"'partly' (inconclusive)")
    return [_row(4, "sample complexity vs n", "smallest N grows at most polylog(n); ~8 samples",
                 txt, verdict, rule, "P(conf)")]


def _N(x: float, st: pd.Series) -> str:
    """A smallest N, 'never' when it is the stand-in 2 x max N."""
    return "never" if x >= 2 * st["max_N"] else f"{x:.0f}"


def item5(out: Path) -> list[dict]:
    w = _load(out, "pretrained", "icrecall_pretrained")
    if w is None:
        return []
    mem = _load(out, "pretrained", "icrecall_pretrained_memory")
    ctl = _load(out, "pretrained", "icrecall_controls")
    pgd, gd = w[w["method"] == "pgd"], w[w["method"] == "gd"]
    ok1, pat = pattern_verdict(pgd)
    ok2, acc = accuracy_verdict(pgd)
    pat += failures_note(out, "manifest_pretrained", pgd)
    rec = (f"; memory's own answer recall {mem['memory_answer_recall'].iloc[0]:.4f}"
           if mem is not None and "memory_answer_recall" in mem else "")
    gd_txt = f"; GD: {pattern_verdict(gd)[1]}" if len(gd) else ""
    return [_row(5, "pre-trained memory", "same pattern and accuracy as the constructed memory",
                 f"PGD: {pat}; {acc}{rec}", combine(ok1, ok2),
                 f"items 1 and 2: {PATTERN_RULE}; {ACCURACY_RULE}{gd_txt}"
                 + control_failures(ctl), "attention row, P(conf), sampled accuracy")]


def item6(out: Path) -> list[dict]:
    w = _load(out, "kpairs", "icrecall_kpairs")
    if w is None:
        return []
    w["k"] = w["k"].astype(int)
    parts, oks = [], []
    for k, g in w.groupby("k"):
        ok, pat = pattern_verdict(g)
        parts.append(f"k={k}: {pat}; {accuracy_verdict(g)[1]}")
        if k > 2:
            oks.append(ok)
    return [_row(6, "k > 2 pairs", "the pairwise pattern generalises (equal weight within pairs)",
                 " | ".join(parts), combine(*oks),
                 f"every run with k > 2: {PATTERN_RULE} (P(conf) rejects attention on fewer "
                 "pairs); accuracy reported, not judged", "attention row and P(conf)")]


def saddle_lines(out: Path) -> list[str]:
    """Markdown table of the saddle search: per design, GD stalls and their labels."""
    w = _load(out, "saddle", "icrecall_saddle")
    if w is None:
        return []
    lines = ["## Item 3: memories tried for a strict saddle (analyses/icrecall_saddle.py, "
             "n = 2000, N = 8)", "",
             "| design | GD escaped [Wilson 95%] | PGD escaped | GD stalls by label | median "
             "lowest eigenvalue at stalls | perturbation escapes at the stalls |",
             "|---|---|---|---|---|---|"]
    for d, g in w.groupby("design", sort=False):
        gd, pgd = g[g["method"] == "gd"], g[g["method"] == "pgd"]
        st = gd[gd["escaped"] == 0]
        eig = f"{st['stall_eig1'].median():.1e}" if "stall_eig1" in st and len(st) else "-"
        pert = (_count_pair(st["stall_perturb_escapes"], st["stall_perturb_draws"])
                if "stall_perturb_escapes" in st and len(st) else "-")
        lines.append(f"| {d} | {_count(gd['escaped'])} | {_count(pgd['escaped'])} | "
                     f"{_labels(st) or '-'} | {eig} | {pert} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(OUT))
    out = Path(p.parse_args(argv).out)
    rows = item1_2(out) + item3(out) + item4(out) + item5(out) + item6(out)
    if not rows:
        print(f"no result tables under {out}; run the analyses/icrecall_*.py scripts first")
        return 1
    pd.DataFrame(rows).to_csv(out / "summary.csv", index=False)
    lines = ["# IC-recall: section C, ours vs the paper", "",
             "Generated by analyses/icrecall_summary.py from the tables in this folder. "
             "P(conf) = P(correct relation | confusing prompt) at the memory's temperature; "
             "intervals are 95%: Wilson for pooled proportions, percentile bootstrap for "
             "medians and slopes.", ""]
    for r in rows:
        lines += [f"## {r['item']}. {r['what']}: reproduces **{r['reproduces']}**", "",
                  f"- paper: {r['paper']}", f"- ours: {r['ours']}",
                  f"- measure: {r['measure']}", f"- rule: {r['rule']}", ""]
    lines += controls_lines(_load(out, "controls", "icrecall_controls"),
                            "reference rows, constructed memory (main.py's prompts)")
    lines += controls_lines(_load(out, "pretrained", "icrecall_controls"),
                            "reference rows, pre-trained memory")
    dyn = _load(out, "dynamics", "icrecall_dynamics_summary")
    lines += ablation_lines(dyn) if dyn is not None else []
    lines += saddle_lines(out)
    write_text(out / "summary.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
