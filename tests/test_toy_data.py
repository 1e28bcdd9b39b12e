"""The paper's toy data pipeline against a plain-Python oracle; BPE variant; cache."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pythia_probe.builtin_corpus import generate_stories
from pythia_probe.tokenizer import word_tokens
from pythia_probe.toy import data as td


def write_tinystories_txt(path, stories):
    path.write_text("\n<|endoftext|>\n".join(stories) + "\n")
    return str(path)


def oracle(stories, k, T, n):
    counts = Counter(w for s in stories for w in word_tokens(s))
    vocab = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
    ids = {w: i for i, w in enumerate(vocab)}
    rows = []
    for s in stories:
        toks = word_tokens(s)
        if len(toks) > T and all(w in ids for w in toks):
            rows.append([ids[w] for w in toks[: T + 1]])
    return vocab, torch.tensor(rows[:n])


def test_word_pipeline_matches_oracle(tmp_path):
    stories = generate_stories(60, seed=5)
    counts = Counter(w for s in stories for w in word_tokens(s))
    k = sum(c >= 2 for c in counts.values())  # words seen once are out: their stories dropped
    src = write_tinystories_txt(tmp_path / "tiny.txt", stories)
    vocab, expected = oracle(stories, k, 40, 60)
    assert 0 < len(expected) < 60
    cfg = td.ToyDataConfig(source=src, d_vocab=k, seq_len=40, n_seqs=len(expected))
    got = td.load_toy_data(cfg)
    assert got.vocab == vocab and got.d_vocab == k
    assert torch.equal(got.tokens, expected)


def test_too_few_stories_is_a_clear_error(tmp_path):
    src = write_tinystories_txt(tmp_path / "t.txt", generate_stories(5))
    with pytest.raises(ValueError, match="only .* stories have >= 1001"):
        td.load_toy_data(td.ToyDataConfig(source=src, seq_len=1000, n_seqs=3))


def test_collect_sequences_filters_and_truncates():
    enc = [[1, 2], [1, 2, 3, 4], [5, 1, 1], [0, 1, 2, 3]]
    out = td.collect_sequences(enc, seq_len=2, n_seqs=2, d_vocab=5)
    assert out.tolist() == [[1, 2, 3], [0, 1, 2]]  # [5, 1, 1] has an id >= d_vocab


def test_bpe_variant_roundtrips(tmp_path):
    stories = generate_stories(60, seed=1)
    src = write_tinystories_txt(tmp_path / "b.txt", stories)
    got = td.load_toy_data(td.ToyDataConfig(source=src, tokenizer="bpe", d_vocab=400,
                                            seq_len=30, n_seqs=8))
    assert got.tokens.shape == (8, 31) and int(got.tokens.max()) < got.d_vocab <= 400
    tok = td.build_bpe_tokenizer(stories, 400)
    text = tok.decode(got.tokens[0].tolist())
    assert any(s.startswith(text) for s in stories)


def test_cache_is_reused_only_for_same_config(tmp_path, monkeypatch):
    cfg = td.ToyDataConfig(d_vocab=3000, seq_len=20, n_seqs=4, corpus_opts={"n_stories": 10})
    first = td.load_toy_data(cfg, cache_dir=tmp_path)
    monkeypatch.setattr(td, "word_data", lambda c: (_ for _ in ()).throw(AssertionError("rebuilt")))
    again = td.load_toy_data(cfg, cache_dir=tmp_path)
    assert torch.equal(first.tokens, again.tokens) and first.vocab == again.vocab
    with pytest.raises(AssertionError, match="rebuilt"):
        td.load_toy_data(td.ToyDataConfig(seq_len=21, n_seqs=4, corpus_opts={"n_stories": 10}),
                         cache_dir=tmp_path)


def test_config_errors():
    with pytest.raises(ValueError, match="tokenizer"):
        td.ToyDataConfig(tokenizer="sentencepiece")
    with pytest.raises(ValueError, match="seq_len"):
        td.ToyDataConfig(seq_len=0)


def test_hub_source_goes_through_corpus_iter_documents(monkeypatch):
    import pythia_probe.toy.data as corpus  # toy.data reads documents through iter_documents

    stories = generate_stories(20, seed=2)
    calls = []

    def fake_iter_documents(source, **kw):
        calls.append((source, kw))
        return iter(stories)

    monkeypatch.setattr(corpus, "iter_documents", fake_iter_documents)
    got = td.load_toy_data(td.ToyDataConfig(source="roneneldan/TinyStories", seq_len=30,
                                            n_seqs=3, max_docs=500))
    assert got.tokens.shape == (3, 31)
    assert calls == [("roneneldan/TinyStories", {"max_docs": 500})] * 2  # vocab pass, encode pass
