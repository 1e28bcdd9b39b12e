"""The sweep's targets, all in the factored form: one step's rows through the statistics'
sparse parts equal the rows against the dense oracle (float64), chance included, for every
analysis with a target; top-k statistics held as dense single factors equal the oracle too; the
once-per-statistics vectors are cached by stats_id (in the tool's cache, never beside a path)
and reused; the plan's vocabulary is the user's alone (memory decides only chunking)."""

import pytest
import torch
from test_analysis_factored import _corpus, _dense, parts_from_tokens

from pythia_probe.analysis import combined_needs, factored_cache, get_analyses
from pythia_probe.analysis.cosine import materialised_cosine, prepare_target, scores, tall
from pythia_probe.arch import NeoXConfig, NeoXWeights
from pythia_probe.errors import BadInputError
from pythia_probe.stats.reference import reference_stats
from pythia_probe.sweep.config import ScoringConfig, StatisticsConfig
from pythia_probe.sweep.held import held_targets, targets_cache
from pythia_probe.sweep.scoring import Scorer
from pythia_probe.sweep.statistics import choose_vocab
from pythia_probe.testing.dense import DenseTarget
from pythia_probe.testing.repos import random_state_dict, tiny_config

ANALYSES = ("embedding", "attention", "attention_lnfold", "unembedding")
V = 23


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The tool's cache in this test's folder: the stand-in statistics' ids are not content."""
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "tool"))


class PartsOnly:
    """What held_targets reads of full-vocabulary statistics: parts() and stats_id."""

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
    factored = held_targets(PartsOnly(parts), names, sc, progress=False)
    dense = {n: DenseTarget(n, _dense(n, ref)) for n in names}
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
    first = held_targets(PartsOnly(parts), ["Qbar"], sc, progress=False)
    assert (targets_cache("s1") / "Qbar-factored.safetensors").is_file()
    built = []
    real = factored_cache.target_vectors
    monkeypatch.setattr(factored_cache, "target_vectors",
                        lambda *a, **k: built.append(a[0]) or real(*a, **k))
    again = held_targets(PartsOnly(parts), ["Qbar"], sc, progress=False)
    assert built == [] and again["Qbar"].norm == first["Qbar"].norm
    other = held_targets(PartsOnly(parts, "s2"), ["Qbar"], sc, progress=False)
    assert built == ["Qbar"] and other["Qbar"].norm == pytest.approx(first["Qbar"].norm)


class TopK(PartsOnly):
    """Top-k restricted statistics: parts() with the restriction's ids, the target matrices
    (at the restricted vocabulary) dense."""

    def __init__(self, parts, ref, stats_id="k1"):
        super().__init__({**parts, "ids": [0, 1]}, stats_id)
        self.ref = ref

    def __getattr__(self, name):
        return self.ref[name]


class DenseOnly:
    """First-format statistics: no sparse parts, the target matrices dense."""

    def __init__(self, st, stats_id):
        self.st, self.stats_id = st, stats_id

    def parts(self):
        raise BadInputError("these statistics are dense tensors (a first-format file)")

    def __getattr__(self, name):
        return getattr(self.st, name)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_top_k_statistics_are_dense_single_factors_equal_to_the_oracle(step, dtype):
    parts, ref, _ = step
    sc = ScoringConfig(("embedding", "attention"), dtype=dtype)
    held = held_targets(TopK(parts, ref), ["PhiBT", "Qbar"], sc, progress=False)
    assert {n: t.parts.raw.get("T") is not None for n, t in held.items()} == {
        "PhiBT": True, "Qbar": True}
    E = torch.randn(V, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for n, t in held.items():
        assert t.norm == pytest.approx(DenseTarget(n, ref[n]).norm, rel=1e-12)
        got = scores([tall(E, sc.torch_dtype)], t)[0]
        tol = 1e-10 if dtype == "float64" else 1e-5
        assert got.value == pytest.approx(materialised_cosine(E, ref[n]), rel=tol)
        assert got.chance == pytest.approx(scores([tall(E)], DenseTarget(n, ref[n]))[0].chance,
                                           rel=tol)


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
    """The parts' targets through their sparse parts (a CorpusStats, a parts-only stand-in) and
    as dense single factors (first-format statistics): the same ceilings (equal to the dense
    oracle's cosine of the halves) and the same intervals, each holding its value."""
    from pythia_probe.analysis.intervals import ceiling
    from pythia_probe.stats import batch_stats
    from pythia_probe.sweep.held import prepare_scale

    _, _, weights = step
    tokens, G = _corpus(V, N=12), 4
    halves = [torch.cat([tokens[i::G] for i in part]) for part in ((0, 1), (2, 3))]
    ref = [{n: DenseTarget(n, reference_stats(h, V)[n]) for n in ("Qbar", "PhiBT")}
           for h in halves]
    analyses = get_analyses(["attention", "embedding"])
    dense = {n: DenseTarget(n, reference_stats(tokens, V)[n]) for n in ("Qbar", "PhiBT")}
    sc = ScoringConfig(("attention", "embedding"), dtype="float64")
    ident = lambda t: str(hash(t.numpy().tobytes()))  # noqa: E731
    ways = {"stats": lambda t: batch_stats(t, V),
            "parts": lambda t: PartsOnly(parts_from_tokens(t, V), ident(t)),
            "dense": lambda t: DenseOnly(batch_stats(t, V), "dense" + ident(t))}
    seen = {}
    for way, build in ways.items():
        scale = prepare_scale(Lazy(Grouped(tokens, G, build), tmp_path / "s.safetensors"),
                              ["Qbar", "PhiBT"], sc, progress=False)
        assert len(scale.left_out) == G
        for n in ("Qbar", "PhiBT"):
            assert scale.ceilings[n] == pytest.approx(ceiling(ref[0][n], ref[1][n]), abs=1e-10)
        rows = Scorer(analyses, combined_needs(analyses), dense, torch.arange(V), "s", {}, None,
                      sc, scale).rows({}, weights)
        assert all(r["ci_low"] <= r["value"] <= r["ci_high"] and "ceiling" in r for r in rows)
        seen[way] = torch.tensor([(r["ci_low"], r["ci_high"]) for r in rows])
    # every part's vectors cached in a folder of its own stats_id: G + 2 parts, three ways
    assert len(list((tmp_path / "tool" / "targets").iterdir())) == 3 * (G + 2)
    for way in ("parts", "dense"):
        assert torch.allclose(seen[way], seen["stats"], rtol=0, atol=1e-9)


def test_no_groups_or_intervals_off_give_no_scale(step, tmp_path):
    from dataclasses import replace

    from pythia_probe.stats import batch_stats
    from pythia_probe.sweep.held import prepare_scale

    st = batch_stats(_corpus(V), V)
    sc = ScoringConfig(("attention",), dtype="float64")
    assert prepare_scale(Lazy(st, tmp_path / "s"), ["Qbar"], sc) is None
    grouped = Grouped(_corpus(V, N=12), 4, lambda t: batch_stats(t, V))
    assert prepare_scale(Lazy(grouped, tmp_path / "s"), ["Qbar"],
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
    from pythia_probe.sweep.held import prepare_scale
    from pythia_probe.sweep.statistics import LazyStats

    _, _, weights = step
    tokens, G = _corpus(V, N=12), 4
    path = batch_stats(tokens, V, groups=G).save(tmp_path / "g.safetensors")
    lazy = LazyStats(path, read_meta(path))
    sc = ScoringConfig(("attention", "embedding"), dtype="float64")
    scale = prepare_scale(lazy, ["PhiBT", "Qbar"], sc, progress=False)
    assert len(scale.left_out) == G
    halves = [torch.cat([tokens[g::G] for g in part]) for part in ((0, 1), (2, 3))]
    A, B = (DenseTarget("PhiBT", reference_stats(h, V)["PhiBT"]) for h in halves)
    assert scale.ceilings["PhiBT"] == pytest.approx(ceiling(A, B), abs=1e-10)
    analyses = get_analyses(["attention", "embedding"])
    targets = held_targets(lazy.load(), ["PhiBT", "Qbar"], sc, False)
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


def test_empty_groups_leave_the_intervals_those_of_the_filled_groups(step, tmp_path):
    """Issue 28: --groups past the documents (10 groups over 6 documents, one each) gave a
    jackknife over the empty groups too. The replicates and the halves come from the filled
    groups: the ceilings and intervals equal those of the same documents in 6 groups."""
    from pythia_probe.stats import batch_stats, read_meta
    from pythia_probe.sweep.held import prepare_scale
    from pythia_probe.sweep.statistics import LazyStats

    _, _, weights = step
    tokens = _corpus(V, N=6)
    sc = ScoringConfig(("attention", "embedding"), dtype="float64")
    analyses = get_analyses(["attention", "embedding"])
    got = {}
    for G in (10, 6):
        path = batch_stats(tokens, V, groups=G).save(tmp_path / f"g{G}.safetensors")
        lazy = LazyStats(path, read_meta(path))
        assert lazy.load().filled_groups() == list(range(6))
        scale = prepare_scale(lazy, ["PhiBT", "Qbar"], sc, progress=False)
        assert len(scale.left_out) == 6
        targets = held_targets(lazy.load(), ["PhiBT", "Qbar"], sc, False)
        rows = Scorer(analyses, combined_needs(analyses), targets, torch.arange(V), "g", {},
                      None, sc, scale).rows({}, weights)
        got[G] = (scale.ceilings, torch.tensor([(r["ci_low"], r["ci_high"]) for r in rows]))
    assert got[10][0] == pytest.approx(got[6][0], abs=1e-12)
    assert torch.allclose(got[10][1], got[6][1], rtol=0, atol=1e-12)
