"""Figures are drawn from tidy tables: check what is drawn (axes, colour ranges, marks, titles)
on constructed tables, with and without the chance/ceiling/interval/revision columns."""

import logging
import os

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import QuadMesh

from pythia_probe import plots
from pythia_probe.hub.steps import PYTHIA_STEPS
from pythia_probe.plots import figures, stepaxis
from pythia_probe.results import make_rows, write_manifest, write_shard

STEPS = [0, 1, 2, 4, 512, 1000]
MANIFEST = {"vocabulary": {"rows": 5000, "reason": "r", "recipe": {
    "dataset": "Skylion007/openwebtext", "docs": 100_000, "min_chars": 512, "seq_len": 128,
    "top_k": 5000}}, "statistics": "x.safetensors"}


def table(n_layers=3, steps=STEPS, heads=2, first_layer=1, model="EleutherAI/pythia-tiny"):
    """Layers first_layer.. with value = 0.1 + layer/100 + step/1e5; per-head rows; layerless
    unembedding and loss rows."""
    rows = []
    for s in steps:
        for i in range(n_layers):
            layer = first_layer + i
            for m in ("cos_post", "cos_attn"):
                rows.append({"step": s, "analysis": "embedding", "layer": layer, "metric": m,
                             "value": 0.1 + layer / 100 + s / 1e5})
            rows.append({"step": s, "analysis": "attention_lnfold", "layer": layer,
                         "metric": "cos_mean", "value": 0.5})
            rows += [{"step": s, "analysis": "attention_lnfold", "layer": layer, "head": h,
                      "metric": "cos_head", "value": 0.3 + h / 10} for h in range(heads)]
        rows.append({"step": s, "analysis": "unembedding", "layer": None,
                     "metric": "cos_WU_Bbar", "value": 0.4})
        rows.append({"step": s, "analysis": "toy_train", "layer": None, "metric": "loss",
                     "value": 5.0 - s / 1000})
    return make_rows(rows, model=model, stats_id="abc123")


def with_scale(df, chance=0.05, ceiling=0.9, half=0.02):
    df = df.copy()
    df["chance"], df["ceiling"] = chance, ceiling
    df["ci_low"], df["ci_high"] = df["value"] - half, df["value"] + half
    df["revision_status"] = pd.array(["ok"] * len(df), dtype="string")
    df.loc[df["step"] == 1, "revision_status"] = "duplicate"
    df.loc[df["step"] == 4, "revision_status"] = "suspect"
    return df


@pytest.fixture
def drawn(monkeypatch):
    """Every figure saved, by file name."""
    seen = {}
    real = figures.save

    def spy(fig, path):
        seen[os.path.basename(path)] = fig
        return real(fig, path)

    monkeypatch.setattr(figures, "save", spy)
    return seen


def panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"
            and any(isinstance(c, QuadMesh) for c in ax.collections)]


def mesh(ax):
    return next(c for c in ax.collections if isinstance(c, QuadMesh))


def dot_cells(ax, values):
    """(row, column) indices of the cells of ``values`` that carry a dot on ``ax``."""
    x = stepaxis.positions([int(s) for s in values.columns])
    y = np.arange(len(values))
    out = set()
    for col in ax.collections:
        if isinstance(col, QuadMesh):
            continue
        for px, py in col.get_offsets():
            out.add((int(np.argmin(np.abs(y - py))), int(np.argmin(np.abs(x - px)))))
    return out


def xlabels(ax):
    return [t.get_text() for t in ax.get_xticklabels()]


def ylabels(ax):
    return [t.get_text() for t in ax.get_yticklabels()]


def test_pivot_is_layer_by_sorted_step():
    df = table().sample(frac=1, random_state=0)
    t = plots.pivot(df, "embedding", "cos_post")
    assert list(t.index) == [1, 2, 3] and list(t.columns) == STEPS
    assert t.loc[3, 512] == pytest.approx(0.13512)
    h = plots.pivot(df, "attention_lnfold", "cos_head", rows="head", layer=2)
    assert list(h.index) == [0, 1] and h.loc[1, 4] == pytest.approx(0.4)


def test_pivot_errors_name_the_problem():
    with pytest.raises(ValueError, match="no rows for analysis='embedding' metric='cos_x'"):
        plots.pivot(table(), "embedding", "cos_x")
    dup = make_rows([{"step": 1, "analysis": "a", "layer": 1, "metric": "m", "value": 1.0}] * 2,
                    model="toy")
    with pytest.raises(ValueError, match="duplicate"):
        plots.pivot(dup, "a", "m")


def test_step_axis_is_log2_with_step0_behind_a_break():
    x = stepaxis.positions([0, 1, 2, 4, 512, 1000, 143000])
    assert x[1:] == pytest.approx(np.log2([1, 2, 4, 512, 1000, 143000]))
    assert x[0] == pytest.approx(-1.0)  # one octave left of step 1, not dropped
    assert stepaxis.break_at([0, 1, 2]) == pytest.approx(-0.5)
    assert stepaxis.break_at([1, 2]) is None
    assert stepaxis.positions([0, 1000])[0] == pytest.approx(np.log2(1000) - 1)
    e = stepaxis.edges(PYTHIA_STEPS)
    assert len(e) == len(PYTHIA_STEPS) + 1 and np.all(np.diff(e) > 0)
    shown = [stepaxis.label(s) for s in stepaxis.ticks(PYTHIA_STEPS)]
    assert shown == ["0", "1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1k", "2k",
                     "4k", "8k", "16k", "32k", "64k", "143k"]  # 128k is too close to 143k


def test_figure6_as_the_paper_draws_it(tmp_path, drawn):
    df = table(n_layers=24, steps=[0, 1, 2, 4, 8, 512, 1000, 2000], heads=1)
    paths = plots.paper_figures(df, tmp_path, manifest=MANIFEST)
    assert [p.name for p in paths] == ["figure6.png", "figure7.png"]
    fig = drawn["figure6.png"]
    axes = panels(fig)
    assert len(axes) == 3  # no chance in this table: no effect row
    for ax in axes:
        assert xlabels(ax) == ["0", "1", "2", "4", "8", "512"]  # the figure's steps, 0 kept
        assert ylabels(ax) == [str(i) for i in range(1, 25)]  # the paper's layer numbers
        m = mesh(ax)
        assert (m.norm.vmin, m.norm.vmax, m.cmap.name) == (0.0, 1.0, "RdYlBu_r")
        assert m.get_array().shape == (24, 6)
    # the authors' order: attention | no MLP | embedding
    assert "attention map" in axes[0].get_title() and "LN-folded" in axes[0].get_title()
    assert "no cos_mean_authors: not the authors' target" in axes[0].get_title()
    assert "no MLP" in axes[1].get_title()
    assert "residual stream after layer l" in axes[2].get_title()
    top = fig._suptitle.get_text()
    assert "pythia-tiny" in top and "plot-cosine-similarity.py" in top
    assert ("statistics: Skylion007/openwebtext, first 100,000 documents of >= 512 characters, "
            "T = 128; top 5,000 tokens; stats_id abc123") in top
    caption = fig._supxlabel.get_text()
    assert "2 other steps of this table (1000..2000)" in caption
    assert "no chance level or ceiling" in caption


def test_figure7_panels_are_the_papers_layers_clipped(tmp_path, drawn):
    plots.paper_figures(table(n_layers=24, steps=[1, 2, 4]), tmp_path)
    axes = panels(drawn["figure7.png"])
    assert [ax.get_title() for ax in axes] == ["layer 2", "layer 13", "layer 24"]
    # plot-per-head-similarity.py: RdBu_r on the range of the cells drawn, shared by the layers
    assert all((mesh(ax).norm.vmin, mesh(ax).norm.vmax, mesh(ax).cmap.name)
               == pytest.approx((0.3, 0.4, "RdBu_r")) for ax in axes)
    assert ylabels(axes[0]) == ["0", "1"]
    plots.paper_figures(table(n_layers=4, steps=[1, 2, 4]), tmp_path / "small")
    assert [ax.get_title() for ax in panels(drawn["figure7.png"])] == ["layer 2", "layer 4"]


def test_zero_based_tables_are_drawn_with_the_papers_numbers(tmp_path, drawn, caplog):
    with caplog.at_level(logging.WARNING):
        plots.plot_run(table(first_layer=0), tmp_path, every_metric=False)
    assert "numbers layers from 0" in caplog.text
    assert ylabels(panels(drawn["figure6.png"])[0]) == ["1", "2", "3"]
    assert plots.paper_layers(table())["layer"].dropna().min() == 1  # 1-based: unchanged


def test_chance_ceiling_intervals_and_revisions_are_marked(tmp_path, drawn):
    """An older table (no above_chance, effect, chance_sd): the dots follow ci_low <= chance,
    the effect is computed from value, chance and ceiling."""
    df = with_scale(table(), chance=0.12, ceiling=0.9, half=0.02)
    plots.metric_figures(df, tmp_path, manifest=MANIFEST)
    fig = drawn["embedding_cos_post.png"]
    main, share = panels(fig)
    c = plots.pivot(df, "embedding", "cos_post")
    below = int(((c - 0.02) <= 0.12).to_numpy().sum())  # ci_low <= chance
    assert 0 < below < c.size
    caption = fig._supxlabel.get_text()
    assert f"o: {below} cells not above chance (older table: the interval's lower end" in caption
    assert "chance (a model unrelated to the statistics): 0.120" in caption
    assert ("ceiling (the statistics against themselves: two halves of the corpus, not "
            "corrected to the full corpus): 0.900") in caption
    for ax in (main, share):  # the same cells dotted on both panels
        assert dot_cells(ax, c) == set(zip(*np.nonzero(((c - 0.02) <= 0.12).to_numpy()),
                                           strict=True))
    letters = {t.get_text(): t.get_position()[0] for t in main.texts}
    e = stepaxis.edges(STEPS)
    assert e[1] < letters["D"] < e[2] and e[3] < letters["S"] < e[4]  # step 1 and step 4
    expect = ((c - 0.12) / (0.9 - 0.12)).to_numpy()
    assert np.asarray(mesh(share).get_array()) == pytest.approx(expect)
    assert (mesh(share).norm.vmin, mesh(share).norm.vmax, mesh(share).cmap.name) == (
        -1.0, 1.0, "BrBG")
    assert (mesh(main).norm.vmin, mesh(main).norm.vmax, mesh(main).cmap.name) == (
        0.0, 1.0, "RdYlBu_r")
    bar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
    assert any(np.allclose(line.get_ydata(), 0.9) for line in bar.lines)  # ceiling line


def test_the_second_panel_is_effect_or_value_minus_chance_or_none(tmp_path, drawn):
    df = with_scale(table())
    df.loc[df["metric"] == "cos_attn", "ceiling"] = np.nan  # chance only: value - chance
    df.loc[df["metric"] == "cos_mean", ["chance", "ceiling"]] = np.nan  # neither
    plots.metric_figures(df, tmp_path)
    assert len(panels(drawn["embedding_cos_post.png"])) == 2
    main, diff = panels(drawn["embedding_cos_attn.png"])
    v = plots.pivot(df, "embedding", "cos_attn") - 0.05
    assert np.asarray(mesh(diff).get_array()) == pytest.approx(v.to_numpy())
    top = float(np.abs(v.to_numpy()).max())  # symmetric about chance
    assert (mesh(diff).norm.vmin, mesh(diff).norm.vmax) == pytest.approx((-top, top))
    assert "value - chance (no ceiling in the table)" in diff.get_title()
    assert len(panels(drawn["attention_lnfold_cos_mean.png"])) == 1
    assert "no chance level or ceiling" in \
        drawn["attention_lnfold_cos_mean.png"]._supxlabel.get_text()


def test_curves_show_interval_chance_and_ceiling(tmp_path, drawn):
    df = with_scale(table())
    plots.metric_figures(df, tmp_path)
    ax = drawn["embedding_cos_post_curve.png"].axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert {"chance", "ceiling", "suspect step", "duplicate step"} <= set(labels)
    lines = [line for line in ax.lines if line.get_label().startswith("layer")]
    assert [line.get_label() for line in lines] == ["layer 1", "layer 2", "layer 3"]
    # step 0 is not joined to step 1 across the break
    assert list(lines[0].get_xdata()) == pytest.approx(np.log2(STEPS[1:]))


def test_every_metric_gets_a_picture_layerless_as_curves(tmp_path, drawn):
    paths = plots.plot_run(table(), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(["figure6.png", "figure7.png", "attention_lnfold_cos_head_heads.png",
                            "attention_lnfold_cos_mean.png", "attention_lnfold_cos_mean_curve.png",
                            "embedding_cos_attn.png", "embedding_cos_attn_curve.png",
                            "embedding_cos_post.png", "embedding_cos_post_curve.png",
                            "toy_train.png", "unembedding.png"])
    ax = drawn["toy_train.png"].axes[0]
    assert ax.get_title() == "training loss"
    assert list(ax.lines[0].get_ydata()) == pytest.approx([5.0 - s / 1000 for s in STEPS[1:]])
    assert all(p.stat().st_size > 1000 for p in paths)


def test_several_models_get_a_folder_each(tmp_path):
    df = pd.concat([table(model="EleutherAI/pythia-70m"), table(model="EleutherAI/pythia-1b")])
    paths = plots.plot_run(df, tmp_path, paper=True, every_metric=False)
    compared = [f"compare_{m}.{ext}" for m in ("attention_lnfold_cos_mean", "embedding_cos_attn",
                                               "embedding_cos_post") for ext in ("png", "txt")]
    assert sorted(str(p.relative_to(tmp_path)) for p in paths) == compared + [
        "pythia-1b/figure6.png", "pythia-1b/figure7.png", "pythia-70m/figure6.png",
        "pythia-70m/figure7.png"]


def test_figures_replace_a_symlink_never_follow_it_and_honour_the_umask(tmp_path):
    """Issue 16: a link planted where a figure goes must not let the tool write outside."""
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"keep")
    out = tmp_path / "plots"
    out.mkdir()
    (out / "embedding_cos_post.png").symlink_to(outside)
    old = os.umask(0o077)
    try:
        plots.plot_run(table(), out)
    finally:
        os.umask(old)
    assert outside.read_bytes() == b"keep"
    target = out / "embedding_cos_post.png"
    assert not target.is_symlink() and target.stat().st_size > 1000
    assert target.stat().st_mode & 0o777 == 0o600
    old = os.umask(0o022)
    try:
        plots.plot_run(table(), out, every_metric=False)
    finally:
        os.umask(old)
    assert (out / "figure6.png").stat().st_mode & 0o777 == 0o644
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_cli_paper_preset_from_shards_and_manifest(tmp_path, capsys):
    df = table()
    run = tmp_path / "run"
    for s in STEPS:
        write_shard(df[df["step"] == s], run / "shards" / f"step{s}.parquet")
    write_manifest(run, {}, extra=MANIFEST)
    assert plots.main(["--results", str(run), "--paper"]) == 0
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["figure6.png", "figure7.png"]
    assert plots.main(["--results", str(run), "--out", str(tmp_path / "all"),
                       "--head-layers", "1,3"]) == 0
    assert (tmp_path / "all" / "unembedding.png").exists()
    assert str(tmp_path / "all" / "figure6.png") in capsys.readouterr().out


def test_cli_refuses_zero_based_head_layers_and_undrawable_tables(tmp_path, capsys):
    from pythia_probe.cli import run_main
    assert run_main(lambda: plots.main(["--results", "x", "--head-layers", "0,2"]), "p") == 2
    assert "numbered from 1" in capsys.readouterr().err
    toy = table()
    toy = toy[toy["analysis"] == "toy_train"]
    write_shard(toy, tmp_path / "toy" / "s.parquet")
    assert run_main(lambda: plots.main(["--results", str(tmp_path / "toy"), "--paper"]),
                    "p") == 2
    assert "nothing to draw for Figures 6 and 7" in capsys.readouterr().err


CSTEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128]


def bump_model(model, n_layers, peak_index):
    """value 0.9 at step CSTEPS[peak_index(l)], 0.5 one step later, 0.1 after, 0.3 before."""
    rows = []
    for layer in range(1, n_layers + 1):
        p = peak_index(layer)
        for i, s in enumerate(CSTEPS):
            v = 0.3 if i < p else 0.9 if i == p else 0.5 if i == p + 1 else 0.1
            rows.append({"step": s, "analysis": "embedding", "layer": layer,
                         "metric": "cos_post", "value": v})
    return make_rows(rows, model=model, stats_id="abc123")


def two_models():
    return pd.concat([bump_model("EleutherAI/pythia-160m", 12, lambda l: 1 + l // 2),
                      bump_model("EleutherAI/pythia-70m", 6, lambda l: l + 1)])


def test_model_sizes_from_names_or_given(caplog):
    assert plots.model_size("EleutherAI/pythia-1.4b-deduped") == pytest.approx(1.4e9)
    assert plots.model_size("pythia-70m") == pytest.approx(7e7)
    assert plots.model_size("runs/demo-neox") is None
    names = ["EleutherAI/pythia-1b", "demo-neox", "EleutherAI/pythia-160m",
             "EleutherAI/pythia-1.4b"]
    with caplog.at_level(logging.WARNING):
        assert plots.order_models(names) == ["EleutherAI/pythia-160m", "EleutherAI/pythia-1b",
                                             "EleutherAI/pythia-1.4b", "demo-neox"]
    assert "no size in the name of demo-neox" in caplog.text
    assert plots.order_models(names, {"demo-neox": 1e6})[0] == "demo-neox"


def test_compare_table_has_each_models_peak_and_exit_per_layer():
    t = plots.compare_table(two_models(), "embedding", "cos_post")
    assert len(t) == 12 + 6
    small = t[t["model"] == "EleutherAI/pythia-70m"]
    assert list(small["n_layers"]) == [6] * 6
    assert list(small["depth"]) == pytest.approx([l / 6 for l in range(1, 7)])
    assert list(small["peak_step"]) == [CSTEPS[l + 1] for l in range(1, 7)]
    # exit two steps after the peak (0.5 >= 0.45 one step later); the last layer never falls
    # within the steps measured
    assert list(small["exit_step"].astype("float")[:5]) == [CSTEPS[l + 3] for l in range(1, 6)]
    assert list(small["censored"]) == [False] * 5 + [True]
    big = t[t["model"] == "EleutherAI/pythia-160m"]
    assert list(big["peak_step"]) == [CSTEPS[1 + l // 2] for l in range(1, 13)]
    text = plots.format_compare(t, ["EleutherAI/pythia-70m", "EleutherAI/pythia-160m"])
    assert text.index("pythia-70m (6 layers)") < text.index("pythia-160m (12 layers)")
    assert "censored" in text


def test_compare_figure_small_multiples_on_relative_depth(tmp_path, drawn):
    paths = plots.plot_run(two_models(), tmp_path, paper=False, every_metric=False)
    assert sorted(p.name for p in paths) == ["compare_embedding_cos_post.png",
                                             "compare_embedding_cos_post.txt"]
    fig = drawn["compare_embedding_cos_post.png"]
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == ["pythia-70m (6 layers)",
                                               "pythia-160m (12 layers)"]  # smallest first
    for ax, n in zip(axes, (6, 12), strict=True):
        m = mesh(ax)
        assert (m.norm.vmin, m.norm.vmax) == (0.0, 1.0)  # one colour scale
        ys = list(np.asarray(m.get_coordinates())[:, 0, 1])
        assert ys == pytest.approx(np.arange(n + 1) / n)  # layer l spans ((l-1)/n, l/n]
        assert ax.get_ylim() == pytest.approx((0.0, 1.0))
    x = dict(zip(CSTEPS, stepaxis.positions(CSTEPS), strict=True))
    peaks = np.array([(line.get_xdata()[0], line.get_ydata()[0]) for line in axes[0].lines
                      if line.get_marker() == "o"])
    expect = np.array([(x[CSTEPS[l + 1]], (l - 0.5) / 6) for l in range(1, 7)])
    assert peaks.shape == expect.shape and np.allclose(peaks, expect)
    censored = [line.get_ydata()[0] for line in axes[0].lines if line.get_marker() == ">"]
    assert censored == pytest.approx([5.5 / 6])
    exits = [line.get_xdata()[0] for line in axes[0].lines if line.get_marker() == "X"]
    assert exits == pytest.approx([x[CSTEPS[l + 3]] for l in range(1, 6)])
    text = (tmp_path / "compare_embedding_cos_post.txt").read_text()
    assert "EleutherAI/pythia-70m (6 layers)" in text
