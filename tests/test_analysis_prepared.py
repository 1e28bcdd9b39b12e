"""The prepared-target cache: streamed cosines equal the in-memory and materialised ones; the
cache is a valid safetensors file, reused, and rebuilt when the statistics change or its bytes
do not match their digest."""

import pytest
import torch
from safetensors import safe_open

from pythia_probe.analysis.attention import attention_rows
from pythia_probe.analysis.cosine import (
    cosine,
    cosines,
    materialised_cosine,
    packed_cosines,
    prepare_target,
    product,
    row_normalise,
    tall,
)
from pythia_probe.analysis.embedding import embedding_rows
from pythia_probe.analysis.prepared import cache_path, cached_target, open_prepared

TOL = 1e-10


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _never():
    raise AssertionError("the cache should have been reused, not rebuilt")


def _target(tmp_path, seed=0, V=37, chunk=5, stats_id="s0", dtype=torch.float64):
    T = _rand(V, V, seed=seed)
    T[4] = 0  # a token the corpus never shows
    return T, cached_target("PhiBT", lambda: T, tmp_path, stats_id, dtype=dtype, chunk=chunk)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_streamed_equals_in_memory_and_materialised(tmp_path, chunk):
    T, pt = _target(tmp_path, chunk=chunk)
    mem = prepare_target("PhiBT", T, chunk=chunk)
    E, F, G = _rand(37, 6, seed=1), _rand(37, 4, seed=2), _rand(37, 4, seed=3)
    got = cosines([tall(E), product(F, G)], pt, chunk)
    want = cosines([tall(E), product(F, G)], mem, chunk)
    assert got == pytest.approx(want, rel=TOL)
    assert pt.norm == mem.norm
    assert got[0] == pytest.approx(materialised_cosine(E, T), rel=TOL)
    assert got[1] == pytest.approx(materialised_cosine(F @ G.T, T), rel=TOL)


def test_cache_is_safetensors_holding_the_centred_normalised_target_transposed(tmp_path):
    T, pt = _target(tmp_path)
    N = row_normalise(T)
    C = N - N.mean(1, keepdim=True)
    with safe_open(str(pt.path), framework="pt") as f:
        assert f.metadata()["stats_id"] == "s0"
        assert torch.allclose(f.get_tensor("CT_T"), C.T, rtol=0, atol=1e-14)
        assert torch.allclose(f.get_slice("CT_T")[3:9], C.T[3:9], rtol=0, atol=1e-14)
    assert pt.norm == pytest.approx(float(torch.linalg.matrix_norm(C @ C.T)), rel=TOL)


def test_analyses_streamed_equal_in_memory(tmp_path):
    V, d, L = 29, 8, 2
    res = {k: [_rand(32, d, seed=10 * i + j) for j in range(L)]
           for i, k in enumerate(("pre", "attn", "post"))}
    WQ = [_rand(2, d, 4, seed=50 + j) for j in range(L)]
    WK = [_rand(2, d, 4, seed=60 + j) for j in range(L)]
    T = _rand(V, V, seed=7)
    pt = cached_target("Qbar", lambda: T, tmp_path, "s", chunk=6)
    mem = prepare_target("Qbar", T, chunk=6)
    for fn in (lambda th, k: embedding_rows(res, th, chunk=6, max_rank=k),
               lambda th, k: attention_rows(res["pre"], WQ, WK, th, per_head=[1], chunk=6,
                                            max_rank=k)):
        b = fn(mem, 0)
        for a in (fn(pt, 0), fn(pt, 10**6), fn(mem, 20)):  # packed layers: same numbers
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
    stamp = pt.path.stat().st_mtime_ns
    again = cached_target("PhiBT", _never, tmp_path, "s0", chunk=5)
    assert again.path == pt.path and pt.path.stat().st_mtime_ns == stamp
    T2 = _rand(37, 37, seed=99)
    new = cached_target("PhiBT", lambda: T2, tmp_path, "s1", chunk=5)
    assert new.path == pt.path and open_prepared(new.path).stats_id == "s1"
    E = _rand(37, 5, seed=4)
    assert cosine(tall(E), new) == pytest.approx(materialised_cosine(E, T2), rel=TOL)
    assert cosine(tall(E), new) != pytest.approx(materialised_cosine(E, T), rel=1e-3)


def test_truncated_or_other_dtype_cache_is_rebuilt(tmp_path):
    T, pt = _target(tmp_path)
    data = pt.path.read_bytes()
    pt.path.write_bytes(data[:-8])
    fixed = cached_target("PhiBT", lambda: T, tmp_path, "s0", chunk=5)
    assert fixed.path.stat().st_size == len(data)
    p32 = cached_target("PhiBT", lambda: T, tmp_path, "s0", dtype=torch.float32, chunk=5)
    assert p32.path == cache_path(tmp_path, "PhiBT", torch.float32) != pt.path
    E = _rand(37, 5, seed=4)
    mem32 = prepare_target("PhiBT", T, dtype=torch.float32, chunk=5)
    assert cosine(tall(E, torch.float32), p32, 5) == pytest.approx(
        cosine(tall(E, torch.float32), mem32, 5), rel=1e-6)
    assert cosine(tall(E, torch.float32), p32) == pytest.approx(cosine(tall(E), pt), rel=1e-5)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not supported; valid"):
        cached_target("PhiBT", _never, tmp_path, "s", dtype=torch.int64)
    (tmp_path / "x.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="not a prepared-target file"):
        open_prepared(tmp_path / "x.safetensors")
    _, pt = _target(tmp_path)
    with pytest.raises(ValueError, match="d_vocab=37"):
        cosine(tall(_rand(40, 3)), pt)


def test_flipped_bytes_of_the_same_size_are_caught_by_the_digest_and_rebuilt(tmp_path, caplog):
    """Same size, same header, other bytes (a damaged disk, a stray write): the digest check
    refuses the file before use and it is rebuilt; the cosine is the right one."""
    from pythia_probe.analysis.prepared import check_cached, data_digest

    T, pt = _target(tmp_path)
    assert pt.sha256 == data_digest(pt)
    data = bytearray(pt.path.read_bytes())
    data[pt.data_offset + 100:pt.data_offset + 108] = b"\x7f" * 8  # a huge float64 in C_T
    pt.path.write_bytes(bytes(data))
    assert "do not match their recorded sha256" in check_cached(pt.path, "PhiBT", "s0",
                                                                torch.float64)
    E = _rand(37, 5, seed=4)
    assert abs(cosine(tall(E), open_prepared(pt.path))) > 1  # what using it would give
    with caplog.at_level("WARNING"):
        fixed = cached_target("PhiBT", lambda: T, tmp_path, "s0", chunk=5)
    assert "rebuilding" in caplog.text and check_cached(fixed.path, "PhiBT", "s0",
                                                        torch.float64) is None
    assert cosine(tall(E), fixed) == pytest.approx(materialised_cosine(E, T), rel=TOL)
