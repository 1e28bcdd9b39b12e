"""Prepared targets: a dense target matrix (a hand-built one, a top-k or first-format statistics
file's) converted to the factored form gives the dense oracle's and the materialised cosines;
its once-per-statistics vectors cache is a valid safetensors file, reused, and rebuilt when the
statistics change or its bytes do not match their digest."""

import pytest
import torch
from safetensors import safe_open

from pythia_probe.analysis import Options
from pythia_probe.analysis.attention import attention_rows
from pythia_probe.analysis.cosine import (
    cosine,
    cosines,
    materialised_cosine,
    packed_cosines,
    prepare_target,
    product,
    tall,
)
from pythia_probe.analysis.embedding import embedding_rows
from pythia_probe.analysis.factored import FactoredTarget, Parts, dense_parts
from pythia_probe.analysis.factored_cache import cached_vectors, read_vectors, vectors_path
from pythia_probe.testing.dense import DenseTarget

TOL = 1e-10


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _never():
    raise AssertionError("the cache should have been reused, not rebuilt")


def _target(tmp_path, seed=0, V=37, chunk=5, stats_id="s0", dtype=torch.float64):
    """T and its factored target, its vectors through the cache in ``tmp_path``."""
    T = _rand(V, V, seed=seed)
    T[4] = 0  # a token the corpus never shows
    p = dense_parts(T)
    vec = cached_vectors("PhiBT", lambda: p, tmp_path, stats_id, chunk)
    return T, FactoredTarget("PhiBT", Parts(p, dtype, "cpu", {"PhiBT"}), vec, stats_id)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_factored_equals_the_dense_oracle_and_materialised(tmp_path, chunk):
    T, pt = _target(tmp_path, chunk=chunk)
    oracle = DenseTarget("PhiBT", T)
    E, F, G = _rand(37, 6, seed=1), _rand(37, 4, seed=2), _rand(37, 4, seed=3)
    got = cosines([tall(E), product(F, G)], pt, chunk)
    want = cosines([tall(E), product(F, G)], oracle, chunk)
    assert got == pytest.approx(want, rel=TOL)
    assert pt.norm == pytest.approx(oracle.norm, rel=1e-13)
    assert got[0] == pytest.approx(materialised_cosine(E, T), rel=TOL)
    assert got[1] == pytest.approx(materialised_cosine(F @ G.T, T), rel=TOL)


def test_cache_is_safetensors_holding_the_row_scales_and_means(tmp_path):
    T, pt = _target(tmp_path)
    oracle = DenseTarget("PhiBT", T)
    with safe_open(str(vectors_path(tmp_path, "PhiBT")), framework="pt") as f:
        assert f.metadata()["stats_id"] == "s0"
        assert torch.allclose(f.get_tensor("scale"), oracle.scale, rtol=1e-14, atol=0)
        assert torch.allclose(f.get_tensor("mean"), oracle.mean, rtol=0, atol=1e-15)
        assert float(f.metadata()["norm"]) == pytest.approx(oracle.norm, rel=1e-13)
    assert pt.norm == pytest.approx(float(torch.linalg.matrix_norm(oracle.C @ oracle.C.T)),
                                    rel=TOL)


def test_analyses_factored_equal_the_oracle(tmp_path):
    V, d, L = 29, 8, 2
    res = {k: [_rand(32, d, seed=10 * i + j) for j in range(L)]
           for i, k in enumerate(("pre", "attn", "post"))}
    WQ = [_rand(2, d, 4, seed=50 + j) for j in range(L)]
    WK = [_rand(2, d, 4, seed=60 + j) for j in range(L)]
    T = _rand(V, V, seed=7)
    pt = prepare_target("Qbar", T, chunk=6)
    oracle = DenseTarget("Qbar", T)
    for fn in (lambda th, k: embedding_rows(res, th, chunk=6, max_rank=k),
               lambda th, k: attention_rows(res["pre"], WQ, WK, th,
                                            options=Options(chunk=6, per_head=[1], max_rank=k))):
        b = fn(oracle, 0)
        for a in (fn(pt, 0), fn(pt, 10**6), fn(oracle, 20)):  # packed layers: same numbers
            assert [(r["layer"], r["metric"], r.get("head")) for r in a] == \
                [(r["layer"], r["metric"], r.get("head")) for r in b] and len(a) > 2
            assert [r["value"] for r in a] == pytest.approx([r["value"] for r in b], rel=TOL)


class _Counting:
    """A target that counts passes over its column blocks."""

    def __init__(self, th):
        self.th, self.passes = th, 0
        self.name, self.d_vocab, self.dtype, self.norm = th.name, th.d_vocab, th.dtype, th.norm
        self.trace, self.total, self.null_terms = th.trace, th.total, th.null_terms

    def grams(self, F, edges, chunk):
        self.passes += 1
        return self.th.grams(F, edges, chunk)


@pytest.mark.parametrize("max_rank,passes", [(0, 4), (16, 2), (100, 1)])
def test_packed_cosines_share_passes_and_keep_values(max_rank, passes):
    """Each group: two bases of width 3 + 1 (a basis holds E's row-centred part and its row
    means), so 8 columns per group."""
    T = _rand(23, 23, seed=8)
    th = prepare_target("T", T, chunk=4)
    Es = [[_rand(23, 3, seed=s), _rand(23, 3, seed=s + 50)] for s in range(4)]
    counting = _Counting(th)
    got = list(packed_cosines(iter([[tall(E) for E in g] for g in Es]), counting, 4, max_rank))
    assert counting.passes == passes
    for g, vals in zip(Es, got, strict=True):
        assert vals == pytest.approx([materialised_cosine(E, T) for E in g], rel=TOL)


def test_cache_reused_then_rebuilt_when_stats_id_changes(tmp_path):
    T, pt = _target(tmp_path, stats_id="s0")
    path = vectors_path(tmp_path, "PhiBT")
    stamp = path.stat().st_mtime_ns
    again = cached_vectors("PhiBT", _never, tmp_path, "s0")
    assert path.stat().st_mtime_ns == stamp and again.norm == pt.norm
    T2 = _rand(37, 37, seed=99)
    new = cached_vectors("PhiBT", lambda: dense_parts(T2), tmp_path, "s1", 5)
    assert read_vectors(path, "PhiBT", "s1")[0] is not None
    th = FactoredTarget("PhiBT", Parts(dense_parts(T2), torch.float64, "cpu", {"PhiBT"}), new)
    E = _rand(37, 5, seed=4)
    assert cosine(tall(E), th) == pytest.approx(materialised_cosine(E, T2), rel=TOL)
    assert cosine(tall(E), th) != pytest.approx(materialised_cosine(E, T), rel=1e-3)


def test_truncated_cache_is_rebuilt_and_float32_uses_the_same_vectors(tmp_path):
    T, pt = _target(tmp_path)
    path = vectors_path(tmp_path, "PhiBT")
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    _, fixed = _target(tmp_path)
    assert path.stat().st_size == len(data) and fixed.norm == pt.norm
    _, p32 = _target(tmp_path, dtype=torch.float32)  # the vectors are float64 whatever the dtype
    E = _rand(37, 5, seed=4)
    mem32 = prepare_target("PhiBT", T, dtype=torch.float32, chunk=5)
    assert cosine(tall(E, torch.float32), p32, 5) == pytest.approx(
        cosine(tall(E, torch.float32), mem32, 5), rel=1e-6)
    assert cosine(tall(E, torch.float32), p32) == pytest.approx(cosine(tall(E), pt), rel=1e-5)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="must be square"):
        prepare_target("PhiBT", _rand(5, 4))
    _, pt = _target(tmp_path)
    with pytest.raises(ValueError, match="d_vocab=37"):
        cosine(tall(_rand(40, 3)), pt)


def test_flipped_bytes_of_the_same_size_are_caught_by_the_digest_and_rebuilt(tmp_path, caplog):
    """Same size, same header, other bytes (a damaged disk, a stray write): the digest check
    refuses the file before use and it is rebuilt; the cosine is the right one."""
    T, pt = _target(tmp_path)
    path = vectors_path(tmp_path, "PhiBT")
    data = bytearray(path.read_bytes())
    data[-16:-8] = b"\x7f" * 8  # a huge float64 in the vectors
    path.write_bytes(bytes(data))
    assert "do not match their recorded sha256" in read_vectors(path, "PhiBT", "s0")[1]
    with caplog.at_level("WARNING"):
        _, fixed = _target(tmp_path)
    assert "rebuilding" in caplog.text and read_vectors(path, "PhiBT", "s0")[0] is not None
    E = _rand(37, 5, seed=4)
    assert cosine(tall(E), fixed) == pytest.approx(materialised_cosine(E, T), rel=TOL)
