"""Figures on the scale from chance to ceiling (issue 26 item 4): the effect beside every raw
panel, the authors' targets, colour maps and ranges in Figures 6 and 7, dots from
``above_chance``, and titles that say in words what the table and manifest say (checked on every
title drawn for a realistic table, the committed demo's included)."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import QuadMesh

from pythia_probe import plots
from pythia_probe.analysis.intervals import Z_ABOVE
from pythia_probe.plots import figures, paper, stepaxis
from pythia_probe.plots.describe import statistics_label
from pythia_probe.results import make_rows, read_results

STEPS = [0, 1, 2, 4, 8, 512, 1000]
DEMO = Path(__file__).resolve().parents[1] / "results" / "demo" / "run"
RECIPE = {"dataset": "Skylion007/openwebtext", "docs": 100_000, "min_chars": 512,
          "seq_len": 128, "top_k": None, "split": "train", "text_field": "text",
          "data_dir": None, "groups": 10, "conventions": "authors"}


def recipe_manifest(stats_id="abc123def456", rows=50_277, **recipe):
    """The manifest layout the sweep writes for statistics it built from a recipe."""
    return {"vocabulary": {"rows": rows, "reason": f"full vocabulary ({rows:,} ids)"},
            "statistics": {"file": "/cache/stats/x.safetensors", "stats_id": stats_id,
                           "rows": rows, "recipe": {**RECIPE, **recipe}}}


def realistic(n_layers=3, heads=2, steps=STEPS, model="EleutherAI/pythia-160m", seed=0,
              stats_id="abc123def456"):
    """Every analysis and metric a sweep writes, with the scale columns of the contract:
    chance, chance_sd, ceiling (sqrt(2r/(1+r)) of ceiling_half r), ci, effect, above_chance."""
    rng = np.random.default_rng(seed)
    rows = []

    def add(analysis, metric, layer=None, head=None, scaled=True, ceiling=True):
        for s in steps:
            value = float(rng.uniform(0.05, 0.95))
            row = {"step": s, "analysis": analysis, "metric": metric, "layer": layer,
                   "head": head, "value": value, "ci_low": value - 0.01,
                   "ci_high": value + 0.01}
            if scaled:
                half = float(rng.uniform(0.8, 0.95)) if ceiling else np.nan
                row |= {"chance": float(rng.uniform(0.0, 0.5)),
                        "chance_sd": float(rng.uniform(0.001, 0.02)), "ceiling_half": half,
                        "ceiling": (2 * half / (1 + half)) ** 0.5}
            rows.append(row)

    for layer in range(1, n_layers + 1):
        for m in ("cos_pre", "cos_attn", "cos_post"):
            add("embedding", m, layer)
        for a in ("attention", "attention_lnfold"):
            for m in ("cos_mean", "cos_mean_authors"):
                add(a, m, layer)
            for h in range(heads):
                for m in ("cos_head", "cos_head_authors"):
                    add(a, m, layer, h)
        for m in ("corr_qbar", "corr_delta", "corr_eq13"):
            add("attention_text", m, layer, scaled=False)
        for h in range(heads):
            add("attention_text", "corr_qbar_head", layer, h, scaled=False)
    for m in ("cos_WU_Bbar", "cos_WEWU_Bbar", "cos_WE_PhiBT"):
        add("unembedding", m, ceiling=False)
    df = make_rows(rows, model=model, stats_id=stats_id)
    extra = pd.DataFrame(rows)
    for c in ("chance_sd", "ceiling_half"):
        df[c] = extra[c].to_numpy(float)
    df["effect"] = (df["value"] - df["chance"]) / (df["ceiling"] - df["chance"])
    se = (df["ci_high"] - df["value"]) / 2.262
    z = (df["value"] - df["chance"]) / np.sqrt(df["chance_sd"] ** 2 + se ** 2)
    df["above_chance"] = pd.array(np.where(df["chance"].isna(), None, z > Z_ABOVE),
                                  dtype="boolean")
    return df


@pytest.fixture
def drawn(monkeypatch):
    """Every figure made, by file name; nothing is written (the figures are read as objects)."""
    seen = {}

    def keep(fig, path):
        seen[Path(path).name] = fig
        return Path(path)

    monkeypatch.setattr(figures, "save", keep)
    return seen


def panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"
            and any(isinstance(c, QuadMesh) for c in ax.collections)]


def mesh(ax):
    return next(c for c in ax.collections if isinstance(c, QuadMesh))


def scale_of(ax):
    m = mesh(ax)
    return m.norm.vmin, m.norm.vmax, m.cmap.name


def dots(ax, values):
    """(row, column) of the cells of ``values`` that carry a dot on ``ax``."""
    x = stepaxis.positions([int(s) for s in values.columns])
    y = np.arange(len(values))
    return {(int(np.argmin(np.abs(y - py))), int(np.argmin(np.abs(x - px))))
            for col in ax.collections if not isinstance(col, QuadMesh)
            for px, py in col.get_offsets()}


def cells_of(mask: pd.DataFrame) -> set:
    return set(zip(*np.nonzero(mask.to_numpy()), strict=True))


def test_figure6_draws_the_authors_targets_in_their_colours_and_the_effect_beneath(
        tmp_path, drawn):
    df = realistic(steps=[0, 1, 2, 4, 8, 512, 1000])
    plots.paper_figures(df, tmp_path, manifest=recipe_manifest())
    fig = drawn["figure6.png"]
    axes = panels(fig)
    assert len(axes) == 6  # attention | no MLP | embedding, raw above, effect beneath
    raw, eff = axes[:3], axes[3:]
    want = [("attention_lnfold", "cos_mean_authors"), ("embedding", "cos_attn"),
            ("embedding", "cos_post")]
    steps = [0, 1, 2, 4, 8, 512]  # the figure's steps
    for ax, e, (a, m) in zip(raw, eff, want, strict=True):
        v = plots.pivot(df, a, m)[steps]
        assert np.asarray(mesh(ax).get_array()) == pytest.approx(v.to_numpy())
        assert scale_of(ax) == (0.0, 1.0, "RdYlBu_r")  # plot-cosine-similarity.py
        effect = plots.pivot(df, a, m, values="effect")[steps]
        assert np.asarray(mesh(e).get_array()) == pytest.approx(effect.to_numpy())
        assert scale_of(e) == (-1.0, 1.0, "BrBG")
    assert "the authors' target (pythia.py)" in raw[0].get_title()
    assert "not the authors' target" not in raw[0].get_title()
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert [t.get_text() for t in bars[1].get_yticklabels()] == [
        "-1", "-0.5", "0 chance", "0.5", "1 ceiling"]
    # without the authors' columns: the theory's orientation, and the title says so
    theory = df[~df["metric"].str.endswith("_authors")]
    plots.paper_figures(theory, tmp_path)
    title = panels(drawn["figure6.png"])[0].get_title()
    assert "no cos_mean_authors: not the authors' target" in title
    assert "query-token rows" in title


def test_figure6_falls_back_to_the_raw_map_after_the_ln_folded_one(tmp_path, drawn):
    df = realistic()
    no_fold = df[df["analysis"] != "attention_lnfold"]
    plots.paper_figures(no_fold, tmp_path)
    title = panels(drawn["figure6.png"])[0].get_title()
    assert "raw W_Q W_K" in title and "the authors' target" in title
    both = df[~((df["analysis"] == "attention_lnfold") & (df["metric"] == "cos_mean_authors"))]
    assert paper.figure6_panels(both)[0] == ("attention_lnfold", "cos_mean")


def test_figure7_per_head_as_plot_per_head_similarity(tmp_path, drawn):
    df = realistic(n_layers=24, heads=3, steps=[0, 1, 2, 4])
    plots.paper_figures(df, tmp_path, manifest=recipe_manifest())
    fig = drawn["figure7.png"]
    axes = panels(fig)
    raw, eff = axes[:3], axes[3:]
    assert [ax.get_title() for ax in raw] == ["layer 2", "layer 13", "layer 24"]
    values = [plots.pivot(df, "attention_lnfold", "cos_head_authors", rows="head", layer=la)
              for la in (2, 13, 24)]
    lo = min(float(v.to_numpy().min()) for v in values)
    hi = max(float(v.to_numpy().max()) for v in values)
    for ax, e, v, la in zip(raw, eff, values, (2, 13, 24), strict=True):
        assert np.asarray(mesh(ax).get_array()) == pytest.approx(v.to_numpy())
        assert scale_of(ax) == pytest.approx((lo, hi, "RdBu_r"))  # one range, the cells'
        effect = plots.pivot(df, "attention_lnfold", "cos_head_authors", rows="head",
                             layer=la, values="effect")
        assert np.asarray(mesh(e).get_array()) == pytest.approx(effect.to_numpy())
        assert scale_of(e) == (-1.0, 1.0, "BrBG")
    top = fig._suptitle.get_text().replace("\n", " ")
    assert "plot-per-head-similarity.py" in top
    assert "the authors' per-head target (pythia-per-head.py)" in top
    assert "RdBu_r on the range of the cells drawn" in fig._supxlabel.get_text()
    assert "(this table has no" not in top


def only(df, analysis, metric=None):
    keep = df["analysis"] == analysis
    return df[keep if metric is None else keep & (df["metric"] == metric)]


def test_dots_follow_above_chance_not_the_interval(tmp_path, drawn):
    df = only(realistic(), "embedding", "cos_post").copy()
    sel = (df["analysis"] == "embedding") & (df["metric"] == "cos_post")
    # a pattern the old rule (ci_low <= chance) would not give: layer 2 and step 0 not above
    flag = ~((df["layer"] == 2) | (df["step"] == 0))
    df.loc[sel, "above_chance"] = flag[sel].astype("boolean")
    df.loc[sel & (df["layer"] == 3) & (df["step"] == 4), "above_chance"] = pd.NA  # not judged
    df.loc[sel, "ci_low"] = df.loc[sel, "chance"] + 0.5  # old rule: all above chance
    plots.metric_figures(df, tmp_path)
    fig = drawn["embedding_cos_post.png"]
    above = plots.pivot(df, "embedding", "cos_post", values="above_chance")
    expect = cells_of(above == 0.0)
    assert len(expect) == 3 + len(STEPS) - 1  # layer 2's steps and step 0 of layers 1, 3
    for ax in panels(fig):
        assert dots(ax, above) == expect
    assert f"o: {len(expect)} cells not above chance (the table's above_chance" in \
        fig._supxlabel.get_text()


def test_effect_is_the_tables_where_it_has_one_else_computed(tmp_path, drawn):
    df = only(realistic(), "embedding", "cos_pre").copy()
    sel = (df["analysis"] == "embedding") & (df["metric"] == "cos_pre")
    df.loc[sel, "effect"] = 0.25  # the table's column wins over value/chance/ceiling
    plots.metric_figures(df, tmp_path)
    second = panels(drawn["embedding_cos_pre.png"])[1]
    assert np.asarray(mesh(second).get_array()) == pytest.approx(0.25)
    old = df.drop(columns=["effect", "above_chance", "chance_sd", "ceiling_half"])
    plots.metric_figures(old, tmp_path)
    second = panels(drawn["embedding_cos_pre.png"])[1]
    c = {k: plots.pivot(df, "embedding", "cos_pre", values=k)
         for k in ("value", "chance", "ceiling")}
    expect = (c["value"] - c["chance"]) / (c["ceiling"] - c["chance"])
    assert np.asarray(mesh(second).get_array()) == pytest.approx(expect.to_numpy())


def test_effect_curves_show_chance_at_0_its_band_and_the_ceiling_at_1(tmp_path, drawn):
    df = only(realistic(), "embedding", "cos_post")
    plots.metric_figures(df, tmp_path)
    fig = drawn["embedding_cos_post_curve.png"]
    raw, eff = fig.axes[0], fig.axes[1]
    lines = [line for line in eff.lines if line.get_label().startswith("layer")]
    effect = plots.pivot(df, "embedding", "cos_post", values="effect")
    for line, (_, row) in zip(lines, effect.iterrows(), strict=True):
        assert list(line.get_ydata()) == pytest.approx(list(row.to_numpy()[1:]))  # step > 0
    flat = {round(float(line.get_ydata()[0]), 6) for line in eff.lines
            if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2}
    assert {0.0, 1.0} <= flat  # axhline: chance and ceiling
    lo, hi = eff.get_ylim()
    assert lo <= -0.1 and hi >= 1.1  # chance and ceiling always in view
    labels = set(eff.get_legend_handles_labels()[1])
    assert {"chance", "ceiling", "chance +- 1.96 SD of the null"} <= labels
    band = [c for c in eff.collections if c.get_label() == "chance +- 1.96 SD of the null"]
    sd = plots.pivot(df, "embedding", "cos_post", values="chance_sd")
    span = (plots.pivot(df, "embedding", "cos_post", values="ceiling")
            - plots.pivot(df, "embedding", "cos_post", values="chance"))
    top = (Z_ABOVE * sd / span).max().to_numpy()[1:]
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx(top.max())
    label = "chance (to the above-chance threshold, +1.96 SD of the null)"
    assert label in raw.get_legend_handles_labels()[1]


def test_unembedding_rows_without_a_ceiling_read_as_value_minus_chance(tmp_path, drawn):
    df = only(realistic(), "unembedding")
    plots.metric_figures(df, tmp_path)
    fig = drawn["unembedding.png"]
    below = [ax for ax in fig.axes if ax.get_ylabel() == "value - chance"]
    assert len(below) == 3
    sel = df[(df["analysis"] == "unembedding") & (df["metric"] == "cos_WE_PhiBT")]
    sel = sel.sort_values("step")
    metrics = sorted(df.loc[df["analysis"] == "unembedding", "metric"].unique())
    ax = below[metrics.index("cos_WE_PhiBT")]
    line = next(line for line in ax.lines if line.get_marker() == ".")
    expect = (sel["value"] - sel["chance"]).to_numpy()[1:]
    assert list(line.get_ydata()) == pytest.approx(list(expect))


def test_compare_figure_draws_the_effect_when_every_model_has_one(tmp_path, drawn):
    df = pd.concat([realistic(model="EleutherAI/pythia-70m", n_layers=2),
                    realistic(model="EleutherAI/pythia-160m", n_layers=4, seed=1)])
    df = only(df, "embedding", "cos_post")
    plots.plot_run(df, tmp_path, paper=False, every_metric=False)
    fig = drawn["compare_embedding_cos_post.png"]
    for ax, model in zip(panels(fig), ("EleutherAI/pythia-70m", "EleutherAI/pythia-160m"),
                         strict=True):
        assert scale_of(ax) == (-1.0, 1.0, "BrBG")
        effect = plots.pivot(df[df["model"] == model], "embedding", "cos_post",
                             values="effect")
        assert np.asarray(mesh(ax).get_array()) == pytest.approx(effect.to_numpy())
    assert "as effect" in fig._suptitle.get_text()


# -- titles ---------------------------------------------------------------------------------
MATHTEXT = re.compile(r"\$[^$]*\$")
NUMBER = re.compile(r"(?<![\w./-])\d[\d,]*(?:\.\d+)?")  # a number, not a name's digits


def titles(fig) -> list[str]:
    """Every title drawn on ``fig``: its suptitle and each axes' titles."""
    out = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        out += [ax.get_title(loc) for loc in ("left", "center", "right") if ax.get_title(loc)]
    return out


def garbage(text: str) -> list[str]:
    """What a title should never hold outside its mathtext: braces, brackets, double quotes,
    backslashes, a quote that is not an English possessive, a Python repr's None or nan."""
    plain = MATHTEXT.sub("", text)
    bad = re.findall(r"[{}\[\]\"\\]|(?<![A-Za-z0-9])'|'(?![\sA-Za-z:)])", plain)
    return bad + re.findall(r"\b(?:None|nan|NaN)\b", plain)


def numbers(text: str) -> set[float]:
    return {float(n.replace(",", "")) for n in NUMBER.findall(text)}


def ints_in(record) -> set[float]:
    """Every number a manifest record holds, at any depth."""
    if isinstance(record, dict):
        return set().union(*(ints_in(v) for v in record.values())) if record else set()
    if isinstance(record, list):
        return set().union(*(ints_in(v) for v in record)) if record else set()
    return {float(record)} if isinstance(record, int | float) and \
        not isinstance(record, bool) else set()


def check_titles(figs: dict, record: dict, stats_ids: set[str], must: list[str], T: int):
    seen = 0
    for name, fig in figs.items():
        for text in titles(fig):
            assert garbage(text) == [], (name, text)
            assert "statistics not recorded" not in text, (name, text)
            if "statistics:" not in text:
                continue
            seen += 1
            stats = text.split("statistics:", 1)[1].replace("\n", " ")
            found = re.findall(r"stats_id ([0-9a-f, ]+)", stats)
            assert found and {s.strip() for s in found[0].split(",")} == stats_ids
            for sid in stats_ids:
                stats = stats.replace(sid, "")
            assert numbers(stats) <= ints_in(record) | {float(T)}, (name, stats)
            for phrase in must:
                assert phrase in text.replace("\n", " "), (name, phrase, text)
        for caption in [fig._supxlabel.get_text()] if fig._supxlabel else []:
            assert garbage(caption) == [], (name, caption)
    return seen


def test_every_title_of_a_realistic_table_says_the_manifests_numbers(tmp_path, drawn):
    df = realistic()
    manifest = recipe_manifest(docs=12_345, min_chars=700, seq_len=96)
    paths = plots.plot_run(df, tmp_path, manifest=manifest)
    assert len(drawn) == len(paths) > 20
    seen = check_titles(drawn, manifest["statistics"], {"abc123def456"}, [
        "statistics: Skylion007/openwebtext, first 12,345 documents of >= 700 characters, "
        "T = 96; full vocabulary (50,277 ids); authors conventions; stats_id abc123def456"],
        T=96)
    assert seen >= len(paths) - 1  # every comparison with the theory names its statistics


def test_titles_of_the_committed_demo_say_its_manifest_not_a_repr(tmp_path, drawn):
    """The committed figures' titles read "(1'}}}}, 509 tokens": the manifest's statistics
    became a dict and its repr was cut at the last "/" as if it were a file name."""
    df = read_results(DEMO)
    manifest = json.loads((DEMO / "manifest.json").read_text())
    plots.plot_run(df, tmp_path, manifest=plots.run.run_manifest(DEMO))
    record = manifest["statistics"]
    counts = record["from_file"]["counts"]
    T = counts["positions"] // counts["sequences"]
    assert counts["positions"] == T * counts["sequences"]  # every window full: T is exact
    must = [f"{counts['sequences']:,} sequences", f"{counts['tokens']:,} tokens", f"T = {T}",
            f"full vocabulary ({record['rows']:,} ids)",
            f"{record['from_file']['corpus']['dataset']} corpus"]
    seen = check_titles(drawn, record, set(df["stats_id"].dropna()), must, T)
    assert seen >= 10


def test_statistics_label_reads_every_manifest_layout():
    df = realistic(model="EleutherAI/pythia-70m", n_layers=1, steps=[1])
    old = {"vocabulary": {"rows": 5000, "recipe": {"dataset": "Skylion007/openwebtext",
                                                   "docs": 100_000, "min_chars": 512,
                                                   "seq_len": 128, "top_k": 5000}},
           "statistics": "x.safetensors"}
    assert statistics_label(df, old) == (
        "statistics: Skylion007/openwebtext, first 100,000 documents of >= 512 characters, "
        "T = 128; top 5,000 tokens; stats_id abc123def456")
    by_model = {"statistics_by_model": {
        "EleutherAI/pythia-70m": recipe_manifest(rows=2000, top_k=2000, conventions="paper"),
        "other": recipe_manifest(docs=1)}}
    assert statistics_label(df, by_model) == (
        "statistics: Skylion007/openwebtext, first 100,000 documents of >= 512 characters, "
        "T = 128; top 2,000 tokens; paper conventions; stats_id abc123def456")
    file_only = {"statistics": {"file": "/a/b/mine.safetensors", "stats_id": "s", "rows": 300,
                                "T": 32, "counts": {"tokens": 9_900}}}
    assert statistics_label(df.assign(stats_id=None), file_only) == (
        "statistics: statistics file mine.safetensors, 9,900 tokens, T = 32; full vocabulary "
        "(300 ids); stats_id s")
    assert statistics_label(df.assign(stats_id=None)) == "statistics not recorded"
