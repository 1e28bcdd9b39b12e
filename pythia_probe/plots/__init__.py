"""Figures drawn from tidy result tables only (pythia_probe.results), one module per idea:

- :mod:`.table`: what a figure reads (optional chance/ceiling/interval/revision columns, the
  1-based layer convention, the paper's steps);
- :mod:`.stepaxis`: the log step axis shared by every figure (step 0 behind a marked break);
- :mod:`.describe`: titles (what is compared with what, model, statistics in words from the
  manifest) and the raw panels' colours (the authors' plotting scripts);
- :mod:`.scale`: the effect (0 = chance, 1 = ceiling) drawn beside every raw panel;
- :mod:`.heatmap`, :mod:`.curves`: one panel; :mod:`.figures`: whole figures, saved through
  :mod:`pythia_probe.fileio`;
- :mod:`.paper`: the leading-terms paper's Figures 6 and 7 from the authors' targets;
- :mod:`.compare`: several models on one colour scale, layers on a relative depth axis;

- :mod:`.run`: :func:`plot_run` (every figure of a table) and ``python -m pythia_probe.plots``.
"""

from pythia_probe.lazy import faces

__all__ = ["PAPER_HEAD_LAYERS", "PAPER_STEPS", "PlotsConfig", "compare_figure", "compare_run",
           "compare_table", "curve_figure", "figure6", "figure7", "format_compare",
           "head_figure", "layer_figure", "layerless_figure", "main", "metric_figures",
           "model_size", "order_models", "paper_figures", "paper_layers", "pivot", "plot_run"]
__getattr__, __dir__ = faces(__name__, {
    ".compare": (
        "compare_figure",
        "compare_run",
        "compare_table",
        "format_compare",
        "model_size",
        "order_models",
    ),
    ".figures": ("curve_figure", "head_figure", "layer_figure", "layerless_figure"),
    ".paper": ("PAPER_HEAD_LAYERS", "figure6", "figure7", "paper_figures"),
    ".config": ("PlotsConfig",),
    ".run": ("main", "metric_figures", "plot_run"),
    ".table": ("PAPER_STEPS", "pivot"),
    "pythia_probe.summary.table": ("paper_layers",),
})
