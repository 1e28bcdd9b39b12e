"""The README's numbers about committed results, generated from the committed tables.

Each block of README.md between ``<!-- numbers:NAME -->`` and ``<!-- /numbers:NAME -->`` is the
text :data:`BLOCKS` [NAME] renders from the tables under results/ (never a number typed in):
``demo`` (results/demo/run), ``toy`` (results/toy), ``icrecall`` (results/icrecall/summary.csv)
and ``conventions`` (results/conventions). ``--write`` rewrites the blocks in place; without it
the script says which blocks are stale and exits 1 (tests/test_readme_numbers.py runs that
check, so a README sentence about a committed number cannot drift from its table).

    python analyses/readme_numbers.py --write
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.fileio import write_text
from pythia_probe.results import read_results
from pythia_probe.toy import paper as toy_paper

PROG = "python analyses/readme_numbers.py"
ROOT = Path(__file__).resolve().parents[1]
SCALED = ("embedding", "attention", "attention_lnfold")


@dataclass(frozen=True)
class Flags:
    write: bool = False
    """Rewrite the README's blocks (default: check them, exit 1 if any is stale)."""
    readme: str = str(ROOT / "README.md")
    """The README to check or rewrite."""
    results: str = str(ROOT / "results")
    """The committed results folder the numbers come from."""


# -- the demo -----------------------------------------------------------------------------------
def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def demo_block(results: Path) -> str:
    """What the committed demo table says, on the scale where chance is 0 and the ceiling 1."""
    df = read_results(results / "demo" / "run")
    scaled = df[df["analysis"].isin(SCALED)]
    steps = sorted(df["step"].unique())
    first, later = scaled[scaled["step"] == steps[0]], scaled[scaled["step"] > steps[0]]
    n0, f0 = len(first), int(first["above_chance"].sum())
    old0 = int((first["ci_low"] > first["chance"]).sum())
    z0 = ((first["value"] - first["chance"]) / first["chance_sd"]).abs().max()
    emb = later[later["analysis"] == "embedding"]
    att = later[later["analysis"] != "embedding"]
    mean = lambda m: att[(att["metric"] == m) & att["head"].isna()]  # noqa: E731
    theory, authors = mean("cos_mean"), mean("cos_mean_authors")
    pair = theory.merge(authors, on=["analysis", "step", "layer"], suffixes=("", "_a"))
    shift = (pair["value"] - pair["value_a"]).abs()
    text = df[df["analysis"] == "attention_text"]
    above_e = emb["value"].sub(emb["chance"]).max()
    unemb = df[(df["analysis"] == "unembedding") & (df["step"] > steps[0])]
    above_u = unemb["value"].sub(unemb["chance"]).max()
    lines = [
        f"At step {steps[0]} (random weights) {f0} of {n0} embedding and attention cells are "
        f"flagged above chance (the old rule, the interval's lower end above chance, flagged "
        f"{old0}); their largest distance from chance is {z0:.2f} standard deviations of the "
        "null.",
        f"Over steps {steps[1]}-{steps[-1]} the embedding rows' raw cosines reach "
        f"{_fmt(emb['value'].max())} but lie at most {_fmt(above_e, 4)} above their chance: "
        "the high raw cosine is the residual rows' shared direction against the shared profile "
        "of Phibar^T Bbar^T's rows. What depends on which token is which is small: effect at "
        f"most {_fmt(emb['effect'].max())}, though {int(emb['above_chance'].sum())} of "
        f"{len(emb)} cells are detectably above chance.",
        f"The attention maps do depend on the tokens: head-mean effect up to "
        f"{_fmt(theory['effect'].max())} against Qbar (cos_mean) and "
        f"{_fmt(authors['effect'].max())} against the authors' Qbar^T (cos_mean_authors), "
        f"{int(att['above_chance'].sum())} of {len(att)} attention cells above chance; the two "
        f"orientations' head-mean cosines differ by up to {_fmt(shift.max())} (mean "
        f"{_fmt(shift.mean())}).",
        f"The unembedding's value - chance reaches {_fmt(above_u)}"
        f" ({', '.join(sorted(unemb['metric'].unique()))}); attention_text's intervals, from "
        f"the left-out statistics, have a median width of "
        f"{_fmt((text['ci_high'] - text['ci_low']).median(), 4)}.",
    ]
    return "\n".join(lines)


# -- the toy --------------------------------------------------------------------------------------
def _table(csv: Path, title: str) -> list[str]:
    t = pd.read_csv(csv)
    out = [f"| {title} | ours | batch ceiling | paper |", "|---|---|---|---|"]
    for r in t.itertuples(index=False):
        paper = "not measured" if pd.isna(r.paper) else f"{r.paper:.6f}"
        out.append(f"| {r.weight} | {r.ours_min_cosine:.6f} | {r.batch_ceiling:.6f} | {paper} |")
    return out


def _loss(results: Path, run: str) -> tuple[int, float, int, float]:
    rows = toy_paper.upgrade_names(read_results(results / "toy" / "runs" / run))
    loss = rows[rows["metric"] == "loss"].sort_values("step")
    return (int(loss["step"].iloc[0]), float(loss["value"].iloc[0]),
            int(loss["step"].iloc[-1]), float(loss["value"].iloc[-1]))


def toy_block(results: Path) -> str:
    toy = results / "toy"
    t1 = pd.read_csv(toy / "table1.csv")
    below = bool((t1["ours_min_cosine"] < t1["batch_ceiling"]).all())
    fig = pd.read_csv(toy / "figure4.csv")
    end = fig[fig["epoch"] == fig["epoch"].max()].set_index("metric")["min"]
    t3 = pd.read_csv(toy / "table3.csv").set_index("ablated")["ours_increase"]
    worst = {k: t3[t3.index.str.startswith(k)].max() for k in ("value", "attention")}
    lines = [*_table(toy / "table1.csv", "Table 1 (min cosine over training and layers)"), "",
             f"Table 1: every minimum is {'below' if below else 'not below'} its batch ceiling; "
             "loss at step {} {:.4f} -> step {} {:.4f}.".format(*_loss(results, "table1")),
             f"Figure 4 at its last epoch (min over layers): W {end['cos_W_Qbar']:.2f}, "
             f"V {end['cos_V_PhiBT']:.2f}, W_O {end['cos_W_O_Bbar']:.2f}; loss at step "
             "{} {:.4f} -> step {} {:.4f}.".format(*_loss(results, "figure4")),
             f"Table 3 (ablation on the Figure 4 run): removing W_O's leading term costs "
             f"+{t3['output']:.3f} loss, the worst value layer +{worst['value']:.3f}, the worst "
             f"attention layer +{worst['attention']:.4f}.", "",
             *_table(toy / "table2.csv", "Table 2 (byte-level BPE)"), "",
             "Table 2: loss at step {} {:.4f} -> step {} {:.4f}.".format(
                 *_loss(results, "table2"))]
    return "\n".join(lines)


# -- IC-recall ------------------------------------------------------------------------------------
def icrecall_block(results: Path) -> str:
    s = pd.read_csv(results / "icrecall" / "summary.csv")
    out = ["| item of the paper | ours (results/icrecall/summary.md) | verdict |", "|---|---|---|"]
    for r in s.itertuples(index=False):
        ours = str(r.ours).replace("|", "\\|").replace("\n", " ")
        out.append(f"| C{r.item} {r.what} (paper: {r.paper}) | {ours} | {r.reproduces} |")
    return "\n".join(out)


# -- the conventions ------------------------------------------------------------------------------
def conventions_block(results: Path) -> str:
    e = pd.read_csv(results / "conventions" / "effect.csv")
    o = pd.read_csv(results / "conventions" / "orientations.csv")
    out = ["| difference (alone, or all together) | vocabulary | Bbar | Phibar | PhiBT | Qbar "
           "| QbarHead | kept ids shared |", "|---|---|---|---|---|---|---|---|"]
    for r in e.itertuples(index=False):
        cells = " | ".join(f"{100 * getattr(r, n):.2g}%" for n in ("Bbar", "Phibar", "PhiBT",
                                                                   "Qbar", "QbarHead"))
        what = str(r.what).replace("|", "\\|")
        out.append(f"| {r.difference}: {what} | {r.vocabulary} | {cells} | "
                   f"{100 * r.overlap:.1f}% |")
    pair = o[(o["a"] == "Qbar") & (o["b"] == "QbarT")]
    head = o[(o["a"] == "QbarT") & (o["b"] == "QbarHeadT")]
    out += ["", f"The two attention targets' covariances (cosine, same corpus): Qbar vs Qbar^T "
            f"{pair['cosine'].min():.2f}-{pair['cosine'].max():.2f}, pythia.py's Qbar^T vs the "
            f"per-head script's QbarHead^T {head['cosine'].min():.2f}-{head['cosine'].max():.2f} "
            "(both conventions, top-K and full; results/conventions/orientations.md)."]
    return "\n".join(out)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "demo": demo_block, "toy": toy_block, "icrecall": icrecall_block,
    "conventions": conventions_block}
PATTERN = re.compile(r"(<!-- numbers:(\w+) -->\n)(.*?)(<!-- /numbers:\2 -->)", re.S)


def blocks_in(text: str) -> dict[str, str]:
    """Each generated block of a README: name -> its text (without the newline before the
    closing marker)."""
    return {m.group(2): m.group(3).removesuffix("\n") for m in PATTERN.finditer(text)}


def rewrite(text: str, results: Path) -> str:
    """``text`` with every block regenerated from ``results``."""
    return PATTERN.sub(lambda m: m.group(1) + BLOCKS[m.group(2)](results) + "\n" + m.group(4),
                       text)


def main(argv: list[str] | None = None) -> int:
    (values,) = parse_configs([Flags], argv, PROG, __doc__)
    f = Flags(**values)
    readme, results = Path(f.readme), Path(f.results)
    text = readme.read_text()
    new = rewrite(text, results)
    missing = sorted(set(BLOCKS) - set(blocks_in(text)))
    if f.write:
        write_text(readme, new)
    stale = [n for n, b in blocks_in(text).items() if blocks_in(new)[n] != b]
    print(f"blocks: {', '.join(sorted(blocks_in(text)))}; stale: {', '.join(stale) or 'none'}"
          + (f"; missing: {', '.join(missing)}" if missing else "")
          + (" (rewritten)" if f.write and stale else ""))
    return 0 if f.write or not (stale or missing) else 1


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
