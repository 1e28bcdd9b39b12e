"""Statistics of parts of the corpus (document groups, ``stats/groups.py``): a subset's pass-1
statistics equal a fresh build over exactly its documents, bit for bit; its Qbar and Delta equal
a literal float64 reference that uses the full corpus's Gbar; the assignment does not depend on
ranks, shards or batch sizes; leave_out and halves partition the documents."""

from __future__ import annotations

import types
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from pythia_probe.errors import BadInputError
from pythia_probe.stats import CorpusStats, batch_stats, groups
from pythia_probe.stats import driver as run
from pythia_probe.stats.pass1 import Windows
from pythia_probe.stats.reference import reference_q_given
from pythia_probe.stats.sequences import SequencePolicy, Sequencer
from pythia_probe.testing.dist import stats_in_processes
from pythia_probe.testing.shards import IdShard, encode_ids

V, T, G = 11, 6, 4
PASS1 = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar")


def documents(n: int = 36, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(3, 14, (1,), generator=g))
        out.append(" ".join(map(str, torch.randint(0, V, (k,), generator=g).tolist())))
    return out


def shards_of(docs: list[str], n: int, name: str = "s") -> list[IdShard]:
    step = -(-len(docs) // n)
    return [IdShard(f"{name}{i}", tuple(docs[i * step:(i + 1) * step])) for i in range(n)]


def spec(work: Path, engine: str, groups: int = G, **kw) -> run.RunSpec:
    kw.setdefault("batch_size", 3)
    return run.RunSpec(V, SequencePolicy(T), encode_ids, {"test": 1}, work, progress=False,
                       engine=engine, groups=groups, **kw)


def windows(docs: list[str]) -> list[torch.Tensor]:
    seq = Sequencer(SequencePolicy(T), V)
    return [torch.tensor(w) for w in seq.windows(encode_ids(docs))]


@pytest.mark.parametrize("engine", ["dense", "sparse"])
@pytest.mark.parametrize("kill_at", [1, 7])
def test_subset_equals_a_fresh_build_of_its_documents(tmp_path, monkeypatch, engine, kill_at):
    """Five shards, killed after pass 1 (1: before the group counts; 7: in pass 2) and resumed;
    each subset's pass-1 statistics are bit-identical to a build over only its documents (two
    other shards), its Qbar / Delta equal the literal reference with the FULL corpus's Gbar."""
    docs = documents()
    real, calls = Windows.load, []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) == kill_at:
            raise KeyboardInterrupt("killed between the passes")
        return real(*a, **k)

    monkeypatch.setattr(Windows, "load", dying)
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(shards_of(docs, 5), spec(tmp_path / "w", engine), {})
    monkeypatch.setattr(Windows, "load", real)
    st = run.compute_stats(shards_of(docs, 5), spec(tmp_path / "w", engine), {})
    st = CorpusStats.load(st.save(tmp_path / "g.safetensors"))  # through the file
    assert st.groups == G
    for which in ([0, 2], [3], [1, 2, 3]):
        sub = st.subset(which)
        mine = [d for i, d in enumerate(docs) if i % G in which]
        fresh = run.compute_stats(shards_of(mine, 2, "f"), spec(tmp_path / f"f{which}", engine,
                                                                groups=0), {})
        for n in PASS1:
            assert torch.equal(sub[n], fresh[n]), (which, n)
        for k in ("docs", "sequences", "positions", "tokens"):
            assert sub.meta["counts"][k] == fresh.meta["counts"][k], k
        assert (sub.d_vocab, sub.T) == (V, T) and sub.groups == 0
        ref = reference_q_given(windows(mine), V, st.Gbar)
        for n in ("Qbar", "Delta"):
            scale = float(ref[n].abs().max())
            torch.testing.assert_close(sub[n], ref[n], rtol=0, atol=1e-12 * scale)
        assert sub.stats_id not in (st.stats_id, fresh.stats_id)
        assert st.subset(which).stats_id == sub.stats_id


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_group_tables_wait_on_disk_while_pass_2_runs(tmp_path, monkeypatch, engine):
    """While pass 2 runs, each group's pass-1 tables are in a scratch file of the work folder
    and not in memory; they come back bit for bit (the kept groups equal a run that never
    spilled them); the scratch folder is gone after the run, and after a run killed in pass 2."""
    eng = run.ENGINES[engine]
    real, seen = type(eng).second_pass, []

    def watching(self, fp, windows_, ids, spec_, d):
        files = sorted((tmp_path / "w").glob("groups-spill-*/group-*.safetensors"))
        held = [p for p, _ in spills[-1].held.values()]
        seen.append((len(files), [len(p.context) + p.bigram_keys.size for p in held]))
        if len(seen) == 1:
            raise KeyboardInterrupt("killed in pass 2")
        return real(self, fp, windows_, ids, spec_, d)

    spills, init = [], groups.Spill.__init__
    monkeypatch.setattr(groups.Spill, "__init__",
                        lambda self, w: (init(self, w), spills.append(self))[0])
    monkeypatch.setattr(type(eng), "second_pass", watching)
    docs = documents()
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(shards_of(docs, 3), spec(tmp_path / "w", engine), {})
    assert not list((tmp_path / "w").glob("groups-spill-*"))
    st = run.compute_stats(shards_of(docs, 3), spec(tmp_path / "w", engine), {})
    assert seen == [(G, [0] * G)] * 2
    assert not list((tmp_path / "w").glob("groups-spill-*"))
    monkeypatch.setattr(groups, "Spill", lambda w: types.SimpleNamespace(
        put=lambda g, part: part, restore=lambda: None, close=lambda: None))
    kept = run.compute_stats(shards_of(docs, 3), spec(tmp_path / "k", engine), {})
    for a, b in zip(st.store.groups, kept.store.groups, strict=True):
        assert len(a.context) > 0 and torch.equal(a.token_counts, b.token_counts)
        for x, y in zip(a.count_tensors().values(), b.count_tensors().values(), strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_leave_out_and_halves_partition_the_documents(engine):
    torch.manual_seed(1)
    tok = torch.randint(0, V, (30, T + 1))
    st = batch_stats(tok, V, engine=engine, groups=6, top_k=7)
    total = st.meta["counts"]
    a, b = st.halves()
    assert a.meta["subset"]["groups"] == [0, 1, 2] and b.meta["subset"]["groups"] == [3, 4, 5]
    for k in ("docs", "sequences", "positions", "tokens"):
        assert a.meta["counts"][k] + b.meta["counts"][k] == total.get(k, 30)
        for g in range(6):
            out, one = st.leave_out(g).meta["counts"][k], st.subset([g]).meta["counts"][k]
            assert out + one == total.get(k, 30)
    whole = st.subset(range(6))
    for n in PASS1:
        assert torch.equal(whole[n], st[n]), n
    for n in ("Qbar", "Delta"):  # the same sums, added in another order
        torch.testing.assert_close(whole[n], st[n], rtol=1e-12, atol=1e-18)
    ids = st.token_ids
    ref = reference_q_given(list(tok[[i for i in range(30) if i % 6 != 4]]), V,
                            batch_stats(tok, V)["Gbar"])
    torch.testing.assert_close(st.leave_out(4)["Qbar"], ref["Qbar"][ids][:, ids], rtol=0,
                               atol=1e-12 * float(ref["Qbar"].abs().max()))
    with pytest.raises(BadInputError, match=r"need one or more of 0\.\.5"):
        st.subset([6])
    with pytest.raises(BadInputError, match=r"need one or more of 0\.\.5"):
        st.subset([])
    for bad in ([1.5], [torch.tensor(2.0)], [True], ["1"]):
        with pytest.raises(BadInputError, match=r"group id .* is not an integer: group ids are "
                                                r"0\.\.5"):
            st.subset(bad)
    for bad in (1.7, 1.0, torch.tensor(1.0)):
        with pytest.raises(BadInputError, match=r"group id .* is not an integer"):
            st.leave_out(bad)
    with pytest.raises(BadInputError, match=r"groups 3: need a sequence of group ids 0\.\.5"):
        st.subset(3)
    same = st.subset([np.int64(1), torch.tensor(2)])
    assert same.stats_id == st.subset([1, 2]).stats_id
    assert torch.equal(same["Bbar"], st.subset([1, 2])["Bbar"])


def test_statistics_without_groups_are_refused_in_one_line(tmp_path):
    st = batch_stats(torch.randint(0, V, (8, T + 1)), V)
    assert st.groups == 0
    for call in (lambda: st.subset([0]), lambda: st.leave_out(0), st.halves):
        with pytest.raises(BadInputError, match="keep no document groups; rebuild .*--groups"):
            call()
    for bad in (1, -2):
        with pytest.raises(BadInputError, match="--groups must be 0 .* >= 2"):
            batch_stats(torch.randint(0, V, (8, T + 1)), V, groups=bad)


def test_assignment_ignores_shards_batch_size_and_packing_origin(tmp_path):
    docs = documents(40, seed=3)
    runs = [run.compute_stats(shards_of(docs, n), spec(tmp_path / f"{n}-{bs}", "sparse",
                                                       batch_size=bs), {})
            for n, bs in ((1, 1), (3, 4), (7, 2))]
    first = runs[0]
    assert first.meta["groups"]["counts"][0]["docs"] == 10  # 40 documents, 4 groups
    for other in runs[1:]:
        assert other.meta["groups"] == first.meta["groups"]
        for g in range(G):
            for n in PASS1:
                assert torch.equal(other.subset([g])[n], first.subset([g])[n])
    seq = Sequencer(SequencePolicy(3, mode="packed"), V)  # a window: its first token's doc
    out = list(seq.windows([[1, 2], [3, 4, 5, 6, 7], [8], [9, 1, 2]]))
    assert out == [[1, 2, 3, 4], [5, 6, 7, 8]] and seq.origins == [0, 1]
    seq = Sequencer(SequencePolicy(3, mode="packed", short="keep"), V)
    list(seq.windows([[1, 2], [3, 4, 5, 6, 7], [8], [9, 1, 2]]))
    assert seq.origins == [0, 1, 3]


def _job(work: str):
    return shards_of(documents(), 5), spec(Path(work), "sparse")


def test_two_processes_assign_the_same_groups(tmp_path):
    """Rank 1 counts shards 1 and 3 without having read shards 0 and 2: the ordinals come from
    a scan of the documents before them."""
    single = run.compute_stats(shards_of(documents(), 5), spec(tmp_path / "one", "sparse"), {})
    out = tmp_path / "two.safetensors"
    stats_in_processes(partial(_job, str(tmp_path / "two")), out)
    two = CorpusStats.load(out)
    assert two.meta["groups"] == single.meta["groups"] and two.stats_id == single.stats_id
    for g in range(G):
        a, b = two.leave_out(g), single.leave_out(g)
        for n in PASS1:
            assert torch.equal(a[n], b[n]), n
        for n in ("Qbar", "Delta"):
            torch.testing.assert_close(a[n], b[n], rtol=1e-12, atol=1e-18)


def test_more_groups_than_documents_names_the_empty_groups(tmp_path, capsys):
    """--groups 50 on a 30-document corpus (issue 28 item 5): one warning naming the 20 empty
    groups at build time; the file keeps them, and the jackknife (``filled_groups``) and the
    halves use the 30 that hold documents."""
    from pythia_probe.cli import run_main
    from pythia_probe.stats.__main__ import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(documents(30)))
    out = tmp_path / "s.safetensors"
    args = ["compute", "--dataset", str(corpus), "--tokenizer", "word:3000", "--seq-len", "4",
            "--keep-short", "--no-progress", "--out", str(out), "--groups", "50"]
    assert run_main(lambda: main(args), "stats") == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "WARNING" in ln]
    assert len(warned) == 1 and warned[0].endswith(
        "--groups 50: 20 of the 50 groups hold no counted window (groups 30..49): the "
        "intervals use the other 30; a smaller --groups gives every group documents"), warned
    st = CorpusStats.load(out)
    assert st.groups == 50 and st.filled_groups() == list(range(30))
    assert [c["docs"] for c in st.meta["groups"]["counts"]] == [1] * 30 + [0] * 20
    a, b = st.halves()
    assert a.meta["subset"]["groups"] == list(range(15))
    assert b.meta["subset"]["groups"] == list(range(15, 30))
    assert torch.equal(st.leave_out(45)["Bbar"], st["Bbar"])  # why empty ones are skipped


def test_halves_need_two_filled_groups():
    st = batch_stats(torch.randint(0, V, (1, T + 1)), V, groups=4)
    assert st.filled_groups() == [0] and "groups 1..3" in groups.empty_groups(st.store.groups)
    with pytest.raises(BadInputError, match="1 of their 4 document groups hold documents; "
                                            "halves need 2"):
        st.halves()
