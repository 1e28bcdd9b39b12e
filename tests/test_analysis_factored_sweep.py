"""The sweep's factored targets (``--targets factored``): one step's rows through the
statistics' sparse parts equal the rows against the dense targets (float64), chance included,
for every analysis with a target; the once-per-statistics vectors are cached by stats_id and
reused; the plan's vocabulary is the user's alone (memory decides only chunking)."""

import pytest
import torch
from test_analysis_factored import _corpus, _dense, parts_from_tokens

from pythia_probe.analysis import combined_needs, factored_cache, get_analyses
from pythia_probe.analysis.cosine import prepare_target
from pythia_probe.arch import NeoXConfig, NeoXWeights
from pythia_probe.errors import BadInputError
from pythia_probe.stats.reference import reference_stats
from pythia_probe.sweep.config import ScoringConfig, StatisticsConfig
from pythia_probe.sweep.scoring import Scorer
from pythia_probe.sweep.statistics import choose_vocab
from pythia_probe.sweep.targets import factored_targets
from pythia_probe.testing.repos import random_state_dict, tiny_config

ANALYSES = ("embedding", "attention", "attention_lnfold", "unembedding")
V = 23


class PartsOnly:
    """What factored_targets reads of a CorpusStats: parts() and stats_id."""

    def __init__(self, parts, stats_id="s1"):
        self._parts, self.stats_id, self.calls = parts, stats_id, 0

    def parts(self):
        self.calls += 1
        return self._parts


@pytest.fixture(scope="module")
def step():
    tokens = _corpus(V)
    cfg = tiny_config(vocab_size=32, num_hidden_layers=2)
    sd = random_state_dict(cfg, seed=3, dtype=torch.float64)
    return parts_from_tokens(tokens, V), reference_stats(tokens, V), NeoXWeights(
        sd, NeoXConfig.from_hf(cfg))


def _rows(targets, weights, sc):
    analyses = get_analyses(list(ANALYSES))
    scorer = Scorer(analyses, combined_needs(analyses), targets, torch.arange(V), "s1", {},
                    None, sc)
    key = lambda r: (r["analysis"], r.get("layer") or 0, r.get("head") or -1,  # noqa: E731
                     r["metric"])
    return sorted(scorer.rows({}, weights), key=key)


def test_factored_step_equals_the_dense_step_in_float64(step, tmp_path):
    parts, ref, weights = step
    sc = ScoringConfig(ANALYSES, dtype="float64", chunk=7)
    names = combined_needs(get_analyses(list(ANALYSES))).targets
    factored = factored_targets(PartsOnly(parts), names, tmp_path, sc, progress=False)
    dense = {n: prepare_target(n, _dense(n, ref), dtype=torch.float64) for n in names}
    a, b = _rows(factored, weights, sc), _rows(dense, weights, sc)
    assert len(a) == len(b) > 20
    for x, y in zip(a, b, strict=True):
        assert (x["analysis"], x.get("layer"), x.get("head"), x["metric"]) == (
            y["analysis"], y.get("layer"), y.get("head"), y["metric"])
        assert x["value"] == pytest.approx(y["value"], abs=1e-10)
        assert x["chance"] == pytest.approx(y["chance"], abs=1e-10)


def test_vectors_are_cached_by_stats_id_and_recomputed_for_other_statistics(step, tmp_path,
                                                                            monkeypatch):
    parts, _, _ = step
    sc = ScoringConfig(("attention",), dtype="float64")
    first = factored_targets(PartsOnly(parts), ["Qbar"], tmp_path, sc, progress=False)
    built = []
    real = factored_cache.target_vectors
    monkeypatch.setattr(factored_cache, "target_vectors",
                        lambda *a, **k: built.append(a[0]) or real(*a, **k))
    again = factored_targets(PartsOnly(parts), ["Qbar"], tmp_path, sc, progress=False)
    assert built == [] and again["Qbar"].norm == first["Qbar"].norm
    other = factored_targets(PartsOnly(parts, "s2"), ["Qbar"], tmp_path, sc, progress=False)
    assert built == ["Qbar"] and other["Qbar"].norm == pytest.approx(first["Qbar"].norm)


def test_top_k_statistics_are_refused_in_one_line(step, tmp_path):
    parts, _, _ = step
    with pytest.raises(BadInputError, match="top-k restricted"):
        factored_targets(PartsOnly({**parts, "ids": [0, 1]}), ["Qbar"], tmp_path,
                         ScoringConfig(("attention",)))


@pytest.mark.parametrize("asked,k", [("full", None), ("300", 300)])
def test_the_vocabulary_is_the_users_choice_alone(asked, k):
    top_k, why = choose_vocab(StatisticsConfig(top_k=asked), 50277)
    assert top_k == k
    assert why == ("full vocabulary (50,277 ids), the default" if k is None else
                   "the 300 most frequent tokens, --top-k 300 given")
    assert StatisticsConfig().top_k == "full"  # the default, on every machine
    with pytest.raises(BadInputError, match="--top-k auto is retired .*: use --top-k full"):
        choose_vocab(StatisticsConfig(top_k="auto"), 50277)


def test_rows_with_scale_join_replicates_and_hold_their_values(step, tmp_path):
    """Leave-one-group-out targets from separate statistics of document subsets (the stand-in
    for st.leave_out(g)); the ceiling from the two halves; every interval holds its value."""
    from pythia_probe.analysis.intervals import (
        above_chance,
        ceiling,
        full_ceiling,
        jackknife,
        jackknife_se,
    )

    _, _, weights = step
    tokens, G = _corpus(V, N=12), 4
    groups = [tokens[i::G] for i in range(G)]
    names = ("PhiBT", "Qbar", "QbarT", "QbarHeadT")
    sc = ScoringConfig(ANALYSES, dtype="float64")

    def targets(tok):
        ref = reference_stats(tok, V)
        return {n: prepare_target(n, _dense(n, ref), dtype=torch.float64)
                for n in combined_needs(get_analyses(list(ANALYSES))).targets}

    left = [targets(torch.cat([g for j, g in enumerate(groups) if j != i])) for i in range(G)]
    A, B = targets(torch.cat(groups[:2])), targets(torch.cat(groups[2:]))
    ceilings = {n: ceiling(A[n], B[n]) for n in names}
    analyses = get_analyses(list(ANALYSES))
    scorer = Scorer(analyses, combined_needs(analyses), targets(tokens), torch.arange(V), "s",
                    {}, None, sc)
    rows = scorer.rows_with_scale({}, weights, left, ceilings)
    plain = scorer.rows({}, weights)
    assert [r["value"] for r in rows] == [r["value"] for r in plain]
    one = next(r for r in rows if r["analysis"] == "attention" and r["head"] == 1)
    loo = [next(x for x in scorer.rows({}, weights, t) if x["analysis"] == "attention"
                and x["head"] == 1 and x["layer"] == one["layer"])["value"] for t in left]
    assert (one["ci_low"], one["ci_high"]) == pytest.approx(jackknife(one["value"], loo))
    assert one["above_chance"] is above_chance(one["value"], one["chance"], one["chance_sd"],
                                               jackknife_se(loo))
    assert all(r["above_chance"] is above_chance(r["value"], r["chance"], r["chance_sd"])
               and "effect" in r for r in plain)  # no intervals: chance_sd alone
    for r in rows:
        assert r["ci_low"] <= r["value"] <= r["ci_high"]
        assert r["chance_sd"] > 0 and isinstance(r["above_chance"], bool)
        if r["analysis"] != "unembedding":
            want = ceilings[{"cos_mean_authors": "QbarT", "cos_head_authors": "QbarHeadT"}.get(
                r["metric"], "Qbar" if r["analysis"].startswith("attention") else "PhiBT")]
            assert r["ceiling_half"] == want and r["ceiling"] == full_ceiling(want)


class Grouped:
    """The groups interface (st.groups, st.filled_groups(), st.leave_out(g), st.halves())
    with each part's statistics built separately from its documents (the stand-in for one
    grouped build; every group holds documents)."""

    def __init__(self, tokens, G, build):
        self.groups, self._g = G, [tokens[i::G] for i in range(G)]
        self._build = build

    def _of(self, keep):
        return self._build(torch.cat([self._g[i] for i in keep]))

    def filled_groups(self):
        return list(range(self.groups))

    def leave_out(self, g):
        return self._of([i for i in range(self.groups) if i != g])

    def halves(self):
        h = self.groups // 2
        return self._of(range(h)), self._of(range(h, self.groups))


class Lazy:
    """A LazyStats: the header's meta (groups.G) and load()."""

    def __init__(self, st, path):
        self.st, self.path = st, path
        self.meta = {"groups": {"G": getattr(st, "groups", 0)}}

    def load(self):
        return self.st


def test_prepare_scale_gives_the_same_columns_every_way(step, tmp_path):
    """Memory, streamed and factored targets of the parts: the same ceilings (equal to the
    halves' cosine computed directly) and the same intervals, each holding its value."""
    from pythia_probe.analysis.intervals import ceiling
    from pythia_probe.stats import batch_stats
    from pythia_probe.sweep.config import TargetsConfig
    from pythia_probe.sweep.targets import prepare_scale

    _, _, weights = step
    tokens, G = _corpus(V, N=12), 4
    halves = [torch.cat([tokens[i::G] for i in part]) for part in ((0, 1), (2, 3))]
    ref = [{n: prepare_target(n, reference_stats(h, V)[n], dtype=torch.float64)
            for n in ("Qbar", "PhiBT")} for h in halves]
    analyses = get_analyses(["attention", "embedding"])
    dense = {n: prepare_target(n, reference_stats(tokens, V)[n], dtype=torch.float64)
             for n in ("Qbar", "PhiBT")}
    sc = ScoringConfig(("attention", "embedding"), dtype="float64")
    seen = {}
    for mode in ("memory", "streamed", "factored"):
        build = ((lambda t: PartsOnly(parts_from_tokens(t, V), str(hash(t.numpy().tobytes()))))
                 if mode == "factored" else (lambda t: batch_stats(t, V)))
        cache = tmp_path / mode
        scale = prepare_scale(Lazy(Grouped(tokens, G, build), tmp_path / "s.safetensors"),
                              ["Qbar", "PhiBT"], TargetsConfig(cache=str(cache)), mode, sc,
                              progress=False)
        assert len(scale.left_out) == G
        for n in ("Qbar", "PhiBT"):
            assert scale.ceilings[n] == pytest.approx(ceiling(ref[0][n], ref[1][n]), abs=1e-10)
        if mode != "memory":  # every part in its own cache folder, keyed by its stats_id
            assert len(list(cache.glob("part-*"))) == G + 2
        rows = Scorer(analyses, combined_needs(analyses), dense, torch.arange(V), "s", {}, None,
                      sc, scale).rows({}, weights)
        assert all(r["ci_low"] <= r["value"] <= r["ci_high"] and "ceiling" in r for r in rows)
        seen[mode] = torch.tensor([(r["ci_low"], r["ci_high"]) for r in rows])
    for mode in ("streamed", "factored"):
        assert torch.allclose(seen[mode], seen["memory"], rtol=0, atol=1e-9)


def test_no_groups_or_intervals_off_give_no_scale(step, tmp_path):
    from dataclasses import replace

    from pythia_probe.stats import batch_stats
    from pythia_probe.sweep.config import TargetsConfig
    from pythia_probe.sweep.targets import prepare_scale

    st = batch_stats(_corpus(V), V)
    sc = ScoringConfig(("attention",), dtype="float64")
    tc = TargetsConfig(cache=str(tmp_path))
    assert prepare_scale(Lazy(st, tmp_path / "s"), ["Qbar"], tc, "memory", sc) is None
    grouped = Grouped(_corpus(V, N=12), 4, lambda t: batch_stats(t, V))
    assert prepare_scale(Lazy(grouped, tmp_path / "s"), ["Qbar"], tc, "memory",
                         replace(sc, intervals=False)) is None


def test_no_intervals_flag_reaches_the_scoring():
    from pythia_probe import sweep

    on = sweep.SweepConfig(model="m", steps="0", stats="s", out="o").split().scoring
    off = sweep.SweepConfig(model="m", steps="0", stats="s", out="o", intervals=False).split()
    assert on.intervals and not off.scoring.intervals


def test_a_grouped_statistics_file_gives_the_ceiling_and_intervals(step, tmp_path):
    """Statistics built with document groups (batch_stats(..., groups=G), the stats package's
    real leave_out/halves): PhiBT's halves are exact sub-corpora, so its ceiling equals the one
    from separately built halves; every row then carries an interval holding its value."""
    from pythia_probe.analysis.intervals import ceiling
    from pythia_probe.stats import batch_stats, read_meta
    from pythia_probe.sweep.config import TargetsConfig
    from pythia_probe.sweep.statistics import LazyStats
    from pythia_probe.sweep.targets import factored_targets, prepare_scale

    _, _, weights = step
    tokens, G = _corpus(V, N=12), 4
    path = batch_stats(tokens, V, groups=G).save(tmp_path / "g.safetensors")
    lazy = LazyStats(path, read_meta(path))
    sc = ScoringConfig(("attention", "embedding"), dtype="float64")
    tc = TargetsConfig(cache=str(tmp_path / "c"))
    scale = prepare_scale(lazy, ["PhiBT", "Qbar"], tc, "factored", sc, progress=False)
    assert len(scale.left_out) == G
    halves = [torch.cat([tokens[g::G] for g in part]) for part in ((0, 1), (2, 3))]
    A, B = (prepare_target("PhiBT", reference_stats(h, V)["PhiBT"], dtype=torch.float64)
            for h in halves)
    assert scale.ceilings["PhiBT"] == pytest.approx(ceiling(A, B), abs=1e-10)
    analyses = get_analyses(["attention", "embedding"])
    targets = factored_targets(lazy.load(), ["PhiBT", "Qbar"], tmp_path / "c", sc, False)
    rows = Scorer(analyses, combined_needs(analyses), targets, torch.arange(V), "g", {}, None,
                  sc, scale).rows({}, weights)
    assert rows and all(r["ci_low"] <= r["value"] <= r["ci_high"] for r in rows)
    assert {r["ceiling_half"] for r in rows} == set(scale.ceilings.values())


def test_target_sets_share_one_forward_pass_and_equal_separate_scorings(step, tmp_path,
                                                                        monkeypatch):
    """rows_sets: the G + 1 interval scorings read ONE forward pass (Scorer.layers called
    once), and each set's rows equal scoring that set alone (same order, same numbers)."""
    from pythia_probe.sweep import scoring

    _, _, weights = step
    tokens, sc = _corpus(V, N=12), ScoringConfig(ANALYSES, dtype="float64", chunk=5)
    names = combined_needs(get_analyses(list(ANALYSES))).targets
    sets = [{n: prepare_target(n, _dense(n, reference_stats(tokens[i::3], V)),
                               dtype=torch.float64) for n in names} for i in range(3)]
    analyses = get_analyses(list(ANALYSES))
    scorer = Scorer(analyses, combined_needs(analyses), sets[0], torch.arange(V), "s", {},
                    None, sc)
    alone = [scorer.rows({}, weights, t) for t in sets]
    calls = []
    real = scoring.Scorer.layers
    monkeypatch.setattr(scoring.Scorer, "layers",
                        lambda self, *a: calls.append(1) or real(self, *a))
    shared = scorer.rows_sets({}, weights, sets)
    assert len(calls) == 1
    assert [[r["value"] for r in rows] for rows in shared] == \
        [[r["value"] for r in rows] for rows in alone]
    assert len({rows[0]["value"] for rows in shared}) == 3  # the sets do differ
