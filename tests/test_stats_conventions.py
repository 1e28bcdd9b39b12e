"""``--conventions authors`` against a plain float64 rendering of the authors' formulas.

The rendering below is ours, transcribed from their published scripts (never imported, never
run): TransformerLens' ``to_tokens(text, truncate=True)`` (the BOS token's string prepended to
the text, tokenised, cut at n_ctx = 2,048), pythia.py's ``find_top_tokens`` (a dict counting
every token of each tokenised document, sorted by count, stable) and
``compute_theoretical_matrices`` (one-hot rows over the kept ids, targets shifted with the last
set to 0, r = y - 1/d_vocab, B_bar += r^T x, Phi_bar += r^T A x, the derived matrices with both
G_bar assignments, the Jacobian einsum, Q_bar += x^T (.)^T x), and pythia-per-head.py's
Q_bar (G_bar = B_bar_Phi_bar^T B_bar^T). On 40 built-in stories with the Pythia-format test
tokenizer (d_vocab 300; the model config's vocab_size 320), T = 16: B_bar == Bbar^T,
Phi_bar == Phibar, B_bar_Phi_bar == PhiBT, G_bar == Gbar^T, Q_bar == NT Qbar^T, per-head
Q_bar == NT QbarHead^T to float64 rounding (:data:`TOL`), and the top-K ids exactly; at the full
vocabulary and at top-K, both engines, with document groups (a subset against the rendering over its
documents). Then: the paper default is unchanged, the two conventions never share an identity,
bad input is one line, and the word ranking's ties follow Counter.most_common.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from pythia_probe import corpus, tokenizer
from pythia_probe.errors import BadInputError, MismatchError
from pythia_probe.stats import CorpusStats
from pythia_probe.stats.conventions import Rules
from pythia_probe.stats.job import StatsConfig, compute
from pythia_probe.stats.recipe import FORMAT, Recipe, cache_path, recipe_key
from pythia_probe.stats.result import stats_id
from pythia_probe.testing.tokenizers import pythia_like_backend, write_pythia_tokenizer

TOKENIZER_IDS, MODEL_IDS, T, K, STORIES, PER_SHARD, G = 300, 320, 16, 40, 40, 15, 4
N_CTX = 2048
TOL = 1e-11
"""Relative to the largest entry of the rendering: float64 rounding and Phibar's 1/t weights,
which this toolkit sums exactly in fixed point (2^-42 a unit: ~2e-13 of Phibar here)."""


# -- the authors' formulas, rendered in float64 ------------------------------------------------
def to_tokens(tok, text: str) -> list[int]:
    """TransformerLens' to_tokens(text, truncate=True) of one string: the BOS token's string
    prepended to the text, tokenised (no padding for one string), cut at n_ctx."""
    return tok(tok.bos_token + text, truncation=True, max_length=N_CTX)["input_ids"]


def find_top_tokens(docs_tokens: list[list[int]], top_k: int) -> list[int]:
    token_counts: dict[int, int] = {}
    for tokens in docs_tokens:
        for token_id in tokens:
            token_counts[token_id] = token_counts.get(token_id, 0) + 1
    ranked = sorted(token_counts.items(), key=lambda x: x[1], reverse=True)
    return [token_id for token_id, count in ranked[:top_k]]


def jacobian(T_: int) -> torch.Tensor:
    t = torch.arange(T_, dtype=torch.float64).view(-1, 1, 1)
    i, j = torch.arange(T_).view(1, -1, 1), torch.arange(T_).view(1, 1, -1)
    diag, off = (i == j).double(), (i != j).double()
    valid = ((i <= t) & (j <= t)).double()
    return (diag * (1.0 / (t + 1)) * (1.0 - 1.0 / (t + 1)) - off / ((t + 1) * (t + 1))) * valid


def one_hots(tokens: list[int], token_indices: torch.Tensor, vocab_size: int):
    """x, r of one example: the first max_seq_len tokens zero-padded, targets shifted by one
    with the last 0 (torch.zeros_like), one-hot over the kept ids, r = y - 1/vocab_size."""
    truncated = torch.zeros(T, dtype=torch.long)
    n = min(len(tokens), T)
    truncated[:n] = torch.tensor(tokens[:n])
    x = (truncated[:, None] == token_indices[None, :]).double()
    y_tokens = torch.zeros_like(truncated)
    y_tokens[:-1] = truncated[1:]
    y = (y_tokens[:, None] == token_indices[None, :]).double()
    return x, y - 1.0 / vocab_size


def q_bar(docs_tokens, token_indices, vocab_size: int, G_bar: torch.Tensor) -> torch.Tensor:
    """The Q_bar loop of pythia.py (and pythia-per-head.py) with a given G_bar."""
    J = jacobian(T)
    out = torch.zeros(len(token_indices), len(token_indices), dtype=torch.float64)
    for tokens in docs_tokens:
        x, r = one_hots(tokens, token_indices, vocab_size)
        intermediate = (x @ G_bar) @ r.T
        applied = torch.einsum("tjk,tk->tj", J, intermediate.T).T
        out += (x.T @ applied) @ x
    return out


def authors(docs_tokens, token_indices: list[int], vocab_size: int,
            head_of: dict | None = None) -> dict[str, torch.Tensor]:
    """compute_theoretical_matrices of pythia.py in float64, and pythia-per-head.py's Q_bar;
    ``head_of``: the G_bars of another corpus for the Q_bar loops (a part of the corpus)."""
    idx = torch.tensor(token_indices)
    A = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        A[i, :i + 1] = 1.0 / (i + 1)
    B_bar = torch.zeros(len(idx), len(idx), dtype=torch.float64)
    Phi_bar = torch.zeros_like(B_bar)
    total_tokens = 0
    for tokens in docs_tokens:
        x, r = one_hots(tokens, idx, vocab_size)
        B_bar += r.T @ x
        Phi_bar += r.T @ (A @ x)
        total_tokens += T
    B_bar, Phi_bar = B_bar / total_tokens, Phi_bar / total_tokens
    B_bar_Phi_bar = (B_bar.T @ Phi_bar).T
    G_bar_first = B_bar_Phi_bar.T @ B_bar.T  # overwritten in pythia.py; pythia-per-head.py's
    G_bar = (B_bar.T @ Phi_bar).T @ B_bar.T  # pythia.py's second assignment wins
    G = head_of or {"G_bar": G_bar, "G_bar_head": G_bar_first}
    return {"B_bar": B_bar, "Phi_bar": Phi_bar, "B_bar_Phi_bar": B_bar_Phi_bar, "G_bar": G_bar,
            "G_bar_head": G_bar_first, "total_tokens": total_tokens,
            "Q_bar": q_bar(docs_tokens, idx, vocab_size, G["G_bar"]),
            "Q_bar_head": q_bar(docs_tokens, idx, vocab_size, G["G_bar_head"])}


def pairs(st: CorpusStats, NT: int) -> dict[str, torch.Tensor]:
    """Ours, in the authors' orientation and scale."""
    return {"B_bar": st.Bbar.T, "Phi_bar": st.Phibar, "B_bar_Phi_bar": st.PhiBT,
            "G_bar": st.Gbar.T, "G_bar_head": st.GbarHead.T, "Q_bar": NT * st.Qbar.T,
            "Q_bar_head": NT * st.QbarHead.T}


def assert_authors(st: CorpusStats, ref: dict) -> None:
    ours = pairs(st, ref["total_tokens"])
    assert st.meta["counts"]["positions"] == ref["total_tokens"]
    for name, mine in ours.items():
        scale = float(ref[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(mine, ref[name], rtol=0, atol=TOL * scale, msg=name)


# -- the corpus, the tokenizer, the builds ------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The Pythia-format test tokenizer (300 ids) with a model config.json (320 rows)."""
    out = tmp_path_factory.mktemp("tok")
    write_pythia_tokenizer(out, pythia_like_backend(TOKENIZER_IDS, TOKENIZER_IDS, n_stories=60))
    (out / "config.json").write_text(json.dumps({"vocab_size": MODEL_IDS}))
    return out


@pytest.fixture(scope="module")
def docs_tokens(folder) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(str(folder))
    shards = corpus.corpus_shards("builtin", n_stories=STORIES, stories_per_shard=PER_SHARD)
    return [to_tokens(tok, d) for s in shards for d in s.documents()]


def build(folder: Path, out: Path, **kw) -> CorpusStats:
    cfg = dict(dataset="builtin", stories=STORIES, stories_per_shard=PER_SHARD, seq_len=T,
               tokenizer=str(folder), conventions="authors", groups=G, progress=False,
               out=str(out))
    return compute(StatsConfig(**{**cfg, **kw}))


@pytest.fixture(scope="module")
def built(folder, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("built")
    return {(engine, k): build(folder, tmp / f"{engine}-{k}.safetensors", engine=engine,
                               top_k=k)
            for engine in ("dense", "sparse") for k in (None, K)}


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_full_vocabulary_equals_the_authors_formulas(built, docs_tokens, engine):
    st = built[(engine, None)]
    assert st.d_vocab == MODEL_IDS and not st.restricted  # range(d_vocab): no restriction
    assert st.meta["conventions"] == "authors"
    assert st.meta["vocab"]["compose"] == "full_then_slice"
    assert_authors(st, authors(docs_tokens, list(range(MODEL_IDS)), MODEL_IDS))


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_top_k_equals_the_authors_formulas_and_their_ids(built, docs_tokens, engine):
    st = built[(engine, K)]
    top = find_top_tokens(docs_tokens, K)
    assert st.token_ids.tolist() == top
    assert st.meta["vocab"]["compose"] == "kept" and st.meta["full_d_vocab"] == MODEL_IDS
    counts = Counter(t for d in docs_tokens for t in d)
    assert len({counts[i] for i in top}) < K  # ties that first-seen order decides
    assert_authors(st, authors(docs_tokens, top, MODEL_IDS))


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_a_group_subset_equals_the_formulas_over_its_documents(built, docs_tokens, engine):
    """A subset's pass-1 statistics are the formulas over its documents; its Q_bars use the
    full corpus's G_bars (as every subset's Qbar does)."""
    st = built[(engine, K)]
    top = st.token_ids.tolist()
    full = authors(docs_tokens, top, MODEL_IDS)
    which = [1, 2]
    mine = [d for i, d in enumerate(docs_tokens) if i % G in which]
    ref = authors(mine, top, MODEL_IDS, head_of={k: full[k] for k in ("G_bar", "G_bar_head")})
    sub = st.subset(which)
    ours = pairs(sub, ref["total_tokens"])
    for name in ("B_bar", "Phi_bar", "Q_bar", "Q_bar_head"):
        scale = float(ref[name].abs().max())
        torch.testing.assert_close(ours[name], ref[name], rtol=0, atol=TOL * scale, msg=name)
    assert sub.meta["counts"]["positions"] == T * len(mine)


def test_engines_and_the_file_agree(built, tmp_path):
    for k in (None, K):
        a, b = built[("dense", k)], built[("sparse", k)]
        assert a.stats_id == b.stats_id
        loaded = CorpusStats.load(b.save(tmp_path / "b.safetensors"))
        assert loaded.meta["vocab"]["compose"] == b.meta["vocab"]["compose"]
        for name in ("Bbar", "Phibar", "SigmaB", "Gbar", "GbarHead", "Qbar", "QbarHead"):
            assert torch.equal(loaded[name], b[name]), name
            scale = float(a[name].abs().max())
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-12 * scale)


# -- the paper default, identity, bad input --------------------------------------------------------
def test_paper_is_the_default_and_keeps_its_identity(folder, tmp_path):
    assert StatsConfig().conventions == "paper" and Recipe().conventions == "paper"
    st = build(folder, tmp_path / "p.safetensors", conventions="paper", top_k=K, groups=0)
    assert st.meta["conventions"] == "paper" and st.d_vocab == K
    assert st.meta["full_d_vocab"] == TOKENIZER_IDS and st.meta["vocab"]["compose"] == \
        "full_then_slice"
    assert st.meta["policy"]["mode"] == "first" and st.meta["policy"]["bos"] is None
    before = {k: v for k, v in st.meta.items() if k != "conventions"}  # as written before
    assert stats_id(before, [0]) == stats_id(st.meta, [0])  # a paper file keeps its id
    assert stats_id(dict(before, conventions="authors"), [0]) != stats_id(before, [0])
    old_key = {"format": FORMAT, "docs": 100_000, "min_chars": 512, "seq_len": 128,
               "top_k": None, "split": "train", "text_field": "text", "groups": 10,
               "tokenizer": {"sha256": "s", "d_vocab": 1, "scheme": "x"}, "shards": []}
    expected = hashlib.sha256(json.dumps(old_key, sort_keys=True).encode()).hexdigest()[:16]
    assert recipe_key(Recipe(), {"sha256": "s", "d_vocab": 1, "scheme": "x"}, []) == expected


def test_the_conventions_never_share_an_identity(folder, tmp_path, built):
    fp = {"sha256": "s", "d_vocab": 1, "scheme": "x"}
    paper, ours = Recipe(), Recipe(conventions="authors", d_vocab=50304)
    assert recipe_key(paper, fp, []) != recipe_key(ours, fp, [])
    a, b = cache_path(paper, fp, tmp_path, []), cache_path(ours, fp, tmp_path, [])
    assert a != b and "-authors-" in b.name
    assert recipe_key(Recipe(conventions="authors"), fp, []) != recipe_key(ours, fp, [])
    st = build(folder, tmp_path / "p.safetensors", conventions="paper", keep_work=True)
    assert st.stats_id != built[("dense", None)].stats_id
    with pytest.raises(MismatchError, match="conventions was None, now authors") as e:
        build(folder, tmp_path / "p.safetensors", conventions="authors")  # its work folder
    assert "\n" not in str(e.value)


def test_bad_input_is_one_line(folder, tmp_path, capsys):
    from pythia_probe.stats.__main__ import main

    cases = [(lambda: StatsConfig(conventions="autors"), "--conventions 'autors'; valid: "
              "paper, authors"),
             (lambda: Recipe(conventions="x"), "valid: paper, authors"),
             (lambda: StatsConfig(d_vocab=0), "--d-vocab must be an integer >= 1"),
             (lambda: build(folder, tmp_path / "a.safetensors", d_vocab=TOKENIZER_IDS - 1),
              "below the tokenizer's 300 ids; valid: >= 300"),
             (lambda: build(folder, tmp_path / "b.safetensors", mode="packed"),
              "valid with it: --mode first"),
             (lambda: build(folder / "tokenizer.json", tmp_path / "c.safetensors"),
              "has none; valid: a tokenizer with a bos_token")]
    for make, says in cases:
        with pytest.raises(BadInputError) as e:
            make()
        assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit):
        main(["compute", "--conventions", "authorz"])
    assert "invalid choice: 'authorz' (choose from 'paper', 'authors')" in capsys.readouterr().err


def test_d_vocab_rule_and_flag(folder, tmp_path):
    """No model config.json: the tokenizer's ids (logged); K >= the model's rows keeps every id
    (pythia.py's clamp); --d-vocab under either convention."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / f).write_bytes((folder / f).read_bytes())
    assert build(bare, tmp_path / "a.safetensors", groups=0).d_vocab == TOKENIZER_IDS
    every = build(folder, tmp_path / "k.safetensors", groups=0, top_k=MODEL_IDS)
    assert every.d_vocab == MODEL_IDS and not every.restricted  # K >= d_vocab: every id
    st = build(folder, tmp_path / "b.safetensors", conventions="paper", d_vocab=333, groups=0)
    assert st.d_vocab == 333 and int(st.token_counts[TOKENIZER_IDS:].sum()) == 0
    B, n, P = st.Bbar, st.parts()["n"], st.meta["counts"]["positions"]
    assert float(B[TOKENIZER_IDS:].abs().max()) == 0  # ids never seen: empty rows
    torch.testing.assert_close(B[:, 320], torch.from_numpy(-n / (P * 333)))  # centred by 1/333


def test_word_ties_follow_first_seen_order(tmp_path):
    docs = list(corpus.iter_documents("builtin", n_stories=STORIES))
    words = [w for d in docs for w in tokenizer.word_tokens(d)]
    theirs = [w for w, _ in Counter(words).most_common(60)]  # tiny-tokenize-natural.py
    ours = tokenizer.build_word_tokenizer(docs, 60, ties="first_seen")
    paper = tokenizer.build_word_tokenizer(docs, 60)
    order = lambda t: [t.convert_ids_to_tokens(i) for i in range(60)]  # noqa: E731
    assert order(ours) == theirs and order(paper) != theirs  # ties that the rule decides
    st = compute(StatsConfig(dataset="builtin", stories=STORIES, seq_len=T, tokenizer="word:60",
                             conventions="authors", groups=0, progress=False, oov="unk",
                             out=str(tmp_path / "w.safetensors")))
    assert st.meta["conventions"] == "authors" and st.meta["policy"]["mode"] == "first"
    saved = tokenizer.load_tokenizer(str(tmp_path / "w.safetensors.tokenizer.json"))
    assert order(saved) == theirs and st.d_vocab == 61  # [UNK] = 60
    with pytest.raises(BadInputError, match="ties 'x'; valid: string, first_seen"):
        tokenizer.build_word_tokenizer(docs, 5, ties="x")


def test_rules_name_each_difference():
    assert Rules.named("paper").name == "paper" and Rules.named("authors").name == "authors"
    assert Rules(windows=True, compose=True).name == "paper+windows+compose"
    assert Rules.named("authors").for_tokenizer(word=True) == Rules(word_ties=True)


def test_the_top_k_rule_merges_across_shards_and_a_resume(tmp_path):
    """The authors' ranking from each shard's cached document counts: the same ids as one
    stream (find_top_tokens over every document, BOS first), with 1 shard or 4, and after a
    run killed in pass 1 and resumed."""
    from pythia_probe.stats import driver as run
    from pythia_probe.stats.sequences import AUTHORS, SequencePolicy
    from pythia_probe.testing.shards import IdShard, encode_ids

    g = torch.Generator().manual_seed(3)
    docs = [" ".join(map(str, (torch.randint(1, 9, (int(n),), generator=g) ** 2 % 23).tolist()))
            for n in torch.randint(2, 30, (24,), generator=g)]
    docs[13:13] = ["21 20 21 20"]  # a tie (20 and 21 occur nowhere else) seen in shard 2
    streams = [[0] + [int(w) for w in d.split()] for d in docs]
    theirs = find_top_tokens(streams, 11)
    counts = Counter(t for s in streams for t in s)
    assert theirs != sorted(theirs, key=lambda t: (-counts[t], t))  # ties not by id

    def ids(n: int, work: Path, fail: int | None = None) -> list[int]:
        step = -(-len(docs) // n)
        shards = [IdShard(f"s{i}", tuple(docs[i * step:(i + 1) * step]), fail=i == fail)
                  for i in range(n)]
        spec = run.RunSpec(23, SequencePolicy(5, AUTHORS, bos=0), encode_ids, {"t": 1}, work,
                           progress=False, top_k=11, top_rule="documents", doc_bos=0,
                           compose="kept", engine="sparse")
        return run.compute_stats(shards, spec, {}).token_ids.tolist()

    assert ids(1, tmp_path / "one") == theirs == ids(4, tmp_path / "four")
    with pytest.raises(KeyboardInterrupt):
        ids(4, tmp_path / "r", fail=2)
    assert ids(4, tmp_path / "r") == theirs
