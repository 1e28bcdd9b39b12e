"""Word-level rule, vocabulary selection, OOV filtering, save/load, hub-style loading."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pythia_probe import tokenizer as T
from pythia_probe.builtin_corpus import generate_stories

# Unicode White_Space (what the tokenizers library splits on); Python's str.isspace also counts
# U+001C..U+001F, which are not White_Space, so the oracle spells the set out.
WHITE_SPACE = set("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def oracle(text: str) -> list[str]:
    """The word rule written out character by character (slow, obviously correct)."""
    text = "".join(c.lower() for c in unicodedata.normalize("NFC", text))
    out, run = [], ""
    for c in text:
        if unicodedata.category(c).startswith("L"):
            run += c
            continue
        if run:
            out.append(run)
            run = ""
        if c not in WHITE_SPACE:
            out.append(c)
    return out + ([run] if run else [])


@pytest.mark.parametrize("text, expected", [
    ("Don't stop!", ["don", "'", "t", "stop", "!"]),
    ("It’s 2023, pi=3.14", ["it", "’", "s", "2", "0", "2", "3", ",", "pi", "=", "3", ".", "1",
                            "4"]),
    ("Wait...\n\n  OK\tthen", ["wait", ".", ".", ".", "ok", "then"]),
    ("Café NAÏVE É", ["café", "naïve", "é"]),
    ("cafe\u0301", ["café"]),  # decomposed e + combining acute composes (NFC) into one letter
    ("Straße ЖУК 日本語 x_y e-mail", ["straße", "жук", "日本語", "x", "_", "y", "e", "-", "mail"]),
    ("a🙂b (c) \"d\"", ["a", "🙂", "b", "(", "c", ")", '"', "d", '"']),
    ("٣ ½ x²", ["٣", "½", "x", "²"]),  # non-ASCII digits and numbers are not letters
    ("", []),
])
def test_word_rule_tricky_cases(text, expected):
    assert T.word_tokens(text) == expected
    assert oracle(text) == expected


ALPHABET = st.sampled_from(list("aZé日ж'’.,!?-_0159 \n\t\xa0\u3000🙂½²") + ["e\u0301"])


@settings(max_examples=200, deadline=None)
@given(st.lists(ALPHABET, max_size=40).map("".join))
def test_word_rule_matches_oracle(text):
    assert T.word_tokens(text) == oracle(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_ascii_counting_fast_path_matches_tokenizers(text):
    counts, n = T._count_words([text])
    assert n == 1 and counts == Counter(T.word_tokens(text)) == Counter(oracle(text))


# ---------------------------------------------------------------- vocabulary
DOCS = ["The cat sat. The cat ran!", "A dog sat; the dog barked 3 times.", "Zebra? Zebra!"]


def test_vocabulary_is_top_k_in_frequency_order():
    counts = Counter(w for d in DOCS for w in oracle(d))
    ranked = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    tok = T.build_word_tokenizer(DOCS, 6)
    assert tok.convert_ids_to_tokens(list(range(7))) == ranked[:6] + ["[UNK]"]
    assert T.d_vocab(tok) == 6 and len(tok) == 7 and tok.unk_token_id == 6
    assert T.is_word_tokenizer(tok)
    full = T.build_word_tokenizer(DOCS, 10_000)
    assert T.d_vocab(full) == len(counts)
    assert full.convert_ids_to_tokens(list(range(len(counts)))) == ranked


def test_vocabulary_on_builtin_stories_matches_counter():
    docs = generate_stories(60, seed=2)
    counts = Counter(w for d in docs for w in oracle(d))
    tok = T.build_word_tokenizer(docs, 50)
    expected = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50]]
    assert tok.convert_ids_to_tokens(list(range(50))) == expected


def test_encode_documents_against_oracle_and_oov_filter():
    docs = generate_stories(40, seed=4, length=2)
    tok = T.build_word_tokenizer(docs[:20], 150)
    vocab = tok.get_vocab()
    unk = T.d_vocab(tok)
    want = [[vocab.get(w, unk) for w in oracle(d)] for d in docs]
    assert list(T.encode_documents(tok, docs)) == want
    assert list(T.encode_documents(tok, docs, batch_size=3)) == want
    kept = list(T.encode_documents(tok, docs, drop_oov=True, batch_size=7))
    assert kept == [ids for ids in want if unk not in ids]
    assert 0 < len(kept) < len(docs)
    assert all(max(ids) < unk for ids in kept)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["the", "cat", "Dog", "zebra", "[UNK]", "[unk]", "x", "ü",
                                 "3", ".", " ", "\n", "\x1c", "\v", "'"]), max_size=30))
def test_word_fast_path_matches_backend(pieces):
    tok = T.word_tokenizer_from_vocab(["the", "cat", "dog", ".", "3"])
    text = "".join(pieces)
    backend_ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert list(T.encode_documents(tok, [text])) == [backend_ids]


def test_other_wordlevel_tokenizers_are_not_word_rule():
    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert not T.is_word_tokenizer(tok) and T.d_vocab(tok) == 2
    assert list(T.encode_documents(tok, ["a b"])) == [[0, 1]]


def test_build_errors():
    with pytest.raises(ValueError, match="empty corpus"):
        T.build_word_tokenizer(["", "  \n"], 10)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 1"):
        T.build_word_tokenizer(DOCS, 0)
    with pytest.raises(ValueError, match="must not contain"):
        T.word_tokenizer_from_vocab(["a", "[UNK]"])


# ---------------------------------------------------------------- save / load
def test_save_load_round_trip(tmp_path):
    docs = generate_stories(30, seed=1)
    tok = T.build_word_tokenizer(docs, 200)
    fp = T.tokenizer_fingerprint(tok)
    ids = list(T.encode_documents(tok, docs))
    file = T.save_tokenizer(tok, tmp_path / "tok" / "tokenizer.json")
    folder = T.save_tokenizer(tok, tmp_path / "saved")
    spec = json.loads(file.read_text(encoding="utf-8"))
    assert spec["model"]["type"] == "WordLevel" and spec["model"]["unk_token"] == "[UNK]"
    assert spec["normalizer"]["type"] == "Sequence" and spec["pre_tokenizer"]["type"] == "Sequence"
    loaded = [T.load_tokenizer(file), T.load_tokenizer(folder), T.load_tokenizer(tmp_path / "tok"),
              AutoTokenizer.from_pretrained(str(folder)),
              PreTrainedTokenizerFast(tokenizer_file=str(file), unk_token="[UNK]")]
    for other in loaded:
        assert list(T.encode_documents(other, docs)) == ids
        assert T.tokenizer_fingerprint(other)["sha256"] == fp["sha256"]
        assert T.d_vocab(other) == fp["d_vocab"] == 200
    assert T.tokenizer_fingerprint(loaded[3])["name"] == str(folder)


def test_fingerprint_distinguishes_vocabularies():
    a = T.tokenizer_fingerprint(T.build_word_tokenizer(DOCS, 5))
    b = T.tokenizer_fingerprint(T.build_word_tokenizer(DOCS, 6))
    c = T.tokenizer_fingerprint(T.build_word_tokenizer(DOCS, 5))
    assert a["sha256"] != b["sha256"] and a == c
    assert (a["name"], a["d_vocab"]) == ("word-level-top5", 5)


def tiny_bpe(folder) -> Tokenizer:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(generate_stories(50), trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(
        str(folder))
    return bpe


def test_bpe_folder_through_autotokenizer(tmp_path):
    bpe = tiny_bpe(tmp_path / "bpe")
    tok = T.load_tokenizer(tmp_path / "bpe")
    assert not T.is_word_tokenizer(tok)
    assert T.d_vocab(tok) == len(tok) == bpe.get_vocab_size()
    text = "Lily saw a red ball."
    (ids,) = T.encode_documents(tok, [text], drop_oov=True)
    assert ids == bpe.encode(text, add_special_tokens=False).ids


def test_hub_id_uses_autotokenizer_without_remote_code(monkeypatch, tmp_path):
    tiny_bpe(tmp_path / "bpe")
    calls = []
    real = AutoTokenizer.from_pretrained

    def fake(name, **kwargs):
        calls.append((name, kwargs))
        return real(str(tmp_path / "bpe"))

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fake)
    tok = T.load_tokenizer("EleutherAI/pythia-14m", revision="step1000")
    assert calls == [("EleutherAI/pythia-14m", {"revision": "step1000",
                                                "trust_remote_code": False})]
    assert T.d_vocab(tok) == len(tok)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected a tokenizer.json"):
        T.load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not a valid tokenizer.json"):
        T.load_tokenizer(tmp_path / "bad.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        T.load_tokenizer(tmp_path / "empty")


def test_word_rule_on_every_assigned_bmp_character():
    """Each assigned BMP code point between two letters: tokenizers == the Python oracle.

    (Code points unassigned in Python's Unicode tables may be letters in the newer tables of
    the tokenizers library; those are left out.)"""
    chars = [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF
             and unicodedata.category(chr(c)) != "Cn"]
    text = " ".join(f"q{c}z" for c in chars)
    assert T.word_tokens(text) == oracle(text)
