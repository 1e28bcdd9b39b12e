"""Plots are drawn from tidy tables: check the pivoted data and the drawn axes."""

import matplotlib.pyplot as plt
import pytest

from pythia_probe import plots
from pythia_probe.results import make_rows, write_shard

STEPS = [0, 1, 2, 4, 512, 1000]


def _table():
    rows = [{"step": s, "analysis": "embedding", "layer": layer, "metric": "cos_post",
             "value": layer + s / 10_000} for s in STEPS for layer in range(3)]
    rows += [{"step": s, "analysis": "attention", "layer": layer, "head": h,
              "metric": "cos_head", "value": 10 * layer + h + s / 10_000}
             for s in STEPS for layer in range(3) for h in range(2)]
    rows += [{"step": s, "analysis": "unembedding", "layer": None, "metric": "cos_WU_Bbar",
              "value": 0.5} for s in STEPS]
    return make_rows(rows, model="toy", stats_id="x")


def test_pivot_is_layer_by_sorted_step():
    df = _table().sample(frac=1, random_state=0)
    t = plots.pivot(df, "embedding", "cos_post")
    assert list(t.index) == [0, 1, 2] and list(t.columns) == STEPS
    assert t.loc[2, 512] == pytest.approx(2.0512)
    h = plots.pivot(df, "attention", "cos_head", rows="head", layer=1)
    assert list(h.index) == [0, 1] and h.loc[1, 4] == pytest.approx(11.0004)


def test_pivot_errors_name_the_problem():
    df = _table()
    with pytest.raises(ValueError, match="no rows for analysis='embedding' metric='cos_x'"):
        plots.pivot(df, "embedding", "cos_x")
    dup = make_rows([{"step": 1, "analysis": "a", "layer": 0, "metric": "m", "value": 1.0}] * 2,
                    model="toy")
    with pytest.raises(ValueError, match="duplicate"):
        plots.pivot(dup, "a", "m")


def test_heatmap_axes_follow_the_table(tmp_path, monkeypatch):
    seen = {}
    real_save = plots._save

    def spy(fig, path):
        ax = fig.axes[0]
        seen["x"] = [t.get_text() for t in ax.get_xticklabels()]
        seen["y"] = [t.get_text() for t in ax.get_yticklabels()]
        seen["data"] = ax.images[0].get_array().copy()
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", spy)
    path = plots.heatmap(_table(), "embedding", "cos_post", tmp_path / "h.png")
    assert path.stat().st_size > 1000
    assert seen["x"] == [str(s) for s in STEPS] and seen["y"] == ["0", "1", "2"]
    assert seen["data"].shape == (3, len(STEPS))
    assert seen["data"][1, 0] == pytest.approx(1.0)


def test_plot_run_from_shards_makes_each_figure(tmp_path):
    from pythia_probe.results import read_results
    df = _table()
    for s in STEPS:
        write_shard(df[df["step"] == s], tmp_path / "run" / f"step{s}.parquet")
    assert plots.main(["--results", str(tmp_path / "run"), "--head-layers", "0,2"]) == 0
    names = sorted(p.name for p in (tmp_path / "run" / "plots").iterdir())
    assert names == ["attention_cos_head_heads.png", "embedding_cos_post.png",
                     "embedding_cos_post_curve.png"]
    paths = plots.plot_run(read_results(tmp_path / "run"), tmp_path / "p2")
    assert len(paths) == 3
    plt.close("all")
