"""Built-in corpus (determinism, promised rates, planted structure) and the corpus readers."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pythia_probe import builtin_corpus as bc
from pythia_probe import corpus
from pythia_probe.corpus import __main__ as corpus_cli
from pythia_probe.corpus import corpus_shards, iter_documents
from pythia_probe.errors import BadInputError, UnsafeFileError, UserError
from pythia_probe.stats import batch_stats
from pythia_probe.stats.reference import reference_stats
from pythia_probe.tokenizer import build_word_tokenizer, d_vocab, encode_documents, word_tokens


def sha(stories: list[str]) -> str:
    return hashlib.sha256("\x00".join(stories).encode()).hexdigest()


# ---------------------------------------------------------------- determinism
def test_same_seed_same_bytes_across_processes():
    here = sha(bc.generate_stories(300, seed=7))
    code = ("import hashlib; from pythia_probe.builtin_corpus import generate_stories as g; "
            "print(hashlib.sha256('\\x00'.join(g(300, seed=7)).encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "123"}, check=True).stdout.strip()
    assert out == here == sha(bc.generate_stories(300, seed=7))
    assert sha(bc.generate_stories(300, seed=8)) != here


def test_stories_depend_on_seed_and_index_only():
    whole = bc.generate_stories(25, seed=3)
    assert bc.generate_stories(10, seed=3) + bc.generate_stories(15, seed=3, start=10) == whole
    shards = corpus_shards("builtin", n_stories=25, seed=3, stories_per_shard=7)
    assert [len(list(s.documents())) for s in shards] == [7, 7, 7, 4]
    assert [d for s in shards for d in s.documents()] == whole
    assert len({s.name for s in shards}) == 4
    again = corpus_shards("builtin", n_stories=25, seed=3, stories_per_shard=7)
    assert [s.name for s in again] == [s.name for s in shards]
    clone = pickle.loads(pickle.dumps(shards[1]))  # shards can go to worker processes
    assert clone.name == shards[1].name and list(clone.documents()) == whole[7:14]


def test_min_tokens_and_length():
    stories = bc.generate_stories(200, seed=1, min_tokens=201)
    lengths = [len(word_tokens(s)) for s in stories]
    assert min(lengths) >= 201
    assert [bc.count_tokens(s) for s in stories] == lengths
    short = [len(word_tokens(s)) for s in bc.generate_stories(200, seed=1, length=4)]
    assert np.mean(short) < np.mean(lengths) / 2


def test_ground_truth_is_consistent():
    topic_words = [w for t in bc.TOPICS.values() for w in t.words]
    assert len(topic_words) == len(set(topic_words)), "topics must not share words"
    for name, g in bc.PLANTED.items():
        for w in g.words + g.partners:
            assert word_tokens(w) == [w], f"{name}: {w!r} is not one lower-case token"
        if g.kind == "topical":
            assert len(g.words) + len(g.partners) >= 11
    assert not set(topic_words) & bc.FUNCTION_WORDS
    assert not set(bc.EMOTIONS + bc.COLOURS + bc.TOYS + bc.VEHICLES) & bc.FUNCTION_WORDS
    assert len(bc.PLANTED["emotion"].words) >= 11
    assert bc.topic_of("fish") == bc.topic_of("pond") == "pond" and bc.topic_of("red") is None


# ---------------------------------------------------------------- promised rates
@pytest.fixture(scope="module")
def tokenised():
    return [word_tokens(s) for s in bc.generate_stories(1500, seed=11, p_topic=0.8)]


def test_bigram_rates_as_promised(tokenised):
    rates = bc.promised_rates(0.8)
    for name, g in bc.PLANTED.items():
        if g.kind != "bigram":
            continue
        follows = [t[i + 1] for t in tokenised for i in range(len(t) - 1) if t[i] in g.words]
        assert len(follows) > 1000
        hit = np.mean([w in g.partners for w in follows])
        assert hit == rates[name], name
        seen = Counter(follows)
        assert len(set(seen) & set(g.partners)) == len(g.partners), f"{name}: partner unused"


def test_interchangeable_words_follow_only_their_leads(tokenised):
    for g in (bc.PLANTED["emotion"], bc.PLANTED["pronoun"]):
        before = {t[i - 1] for t in tokenised for i in range(1, len(t)) if t[i] in g.words}
        assert before == set(g.partners)


def test_topic_rate_as_promised(tokenised):
    p = bc.promised_rates(0.8)["topic"]
    context = {w: name for name, t in bc.TOPICS.items() for w in t.context}
    animals = {w: name for name, t in bc.TOPICS.items() for w in t.animals}
    same = total = 0
    for t in tokenised:
        topic = next(animals[w] for w in t if w in animals)
        assert {animals[w] for w in t if w in animals} == {topic}, "one animal topic per story"
        hits = [context[w] == topic for w in t if w in context]
        same, total = same + sum(hits), total + len(hits)
    sigma = np.sqrt(p * (1 - p) / total)
    assert abs(same / total - p) < 5 * sigma, (same / total, p, total)


# ---------------------------------------------------------------- planted structure
def test_engine_matches_reference_on_random_tokens():
    """The engine the planted-structure tests use agrees with the one-hot oracle."""
    tokens = torch.randint(0, 7, (5, 9), generator=torch.Generator().manual_seed(0))
    ref, got = reference_stats(tokens, 7), batch_stats(tokens, 7)
    for name in ("Bbar", "Phibar"):
        assert getattr(got, name).dtype == torch.float64
        torch.testing.assert_close(getattr(got, name), ref[name], rtol=0, atol=1e-14)


@pytest.fixture(scope="module")
def planted_stats():
    docs = bc.generate_stories(3000, seed=0, min_tokens=201)
    tok = build_word_tokenizer(docs, 3000)
    V = d_vocab(tok)
    tokens = torch.tensor([ids[:201] for ids in encode_documents(tok, docs, drop_oov=True)])
    stats = batch_stats(tokens, V)
    Bbar, Phibar = stats.Bbar.numpy(), stats.Phibar.numpy()
    vocab = tok.convert_ids_to_tokens(list(range(V)))
    return vocab, Bbar, Bbar.T @ Bbar, Phibar


def _precisions(vocab, M, rows, relevant, exclude=frozenset()):
    idx = {w: i for i, w in enumerate(vocab)}
    return [bc.precision_at_k(M[idx[w]], vocab, relevant, 10, set(exclude) | {w}) for w in rows]


def test_planted_groups_recovered(planted_stats):
    """Bbar rows, SigmaB rows and Phibar rows find their planted partners (precision@10)."""
    vocab, Bbar, SigmaB, Phibar = planted_stats
    assert len(vocab) >= 500
    for name, g in bc.PLANTED.items():
        if g.kind == "bigram":
            p = _precisions(vocab, Bbar, g.words, g.partners)
        elif g.kind == "interchangeable":
            p = _precisions(vocab, SigmaB, g.words, g.words)
        else:
            p = _precisions(vocab, Phibar, g.words, g.partners, bc.FUNCTION_WORDS)
        assert min(p) >= 0.8, (name, p)


def test_topical_context_is_not_only_adjacent(planted_stats):
    """Context words never adjacent to the animal still rank high in its Phibar row."""
    vocab, _, _, Phibar = planted_stats
    idx = {w: i for i, w in enumerate(vocab)}
    row = Phibar[idx["fish"]]
    ranked = [vocab[i] for i in np.argsort(-row) if vocab[i] not in bc.FUNCTION_WORDS]
    assert {"water", "bubbles", "splash"} <= set(ranked[:15])


def test_precision_at_k():
    vocab = ["a", "b", "c", "d"]
    assert bc.precision_at_k([4, 3, 2, 1], vocab, {"a", "c"}, k=2) == 0.5
    assert bc.precision_at_k([4, 3, 2, 1], vocab, {"b", "c"}, k=10, exclude={"a"}) == 1.0
    with pytest.raises(ValueError, match="no relevant"):
        bc.precision_at_k([1, 2, 3, 4], vocab, {"a"}, exclude={"a"})


# ---------------------------------------------------------------- readers
def write_parquet(path, **cols):
    pq.write_table(pa.table(cols), path)
    return path


def test_txt_reader_tinystories_format(tmp_path):
    text = ("One.\nTwo lines.\n<|endoftext|>\n\n<|endoftext|>\nThree<|endoftext|>Four\n"
            "<|endoftext|>\nLast story without separator\n")
    (tmp_path / "s.txt").write_text(text, encoding="utf-8")
    docs = list(iter_documents(str(tmp_path / "s.txt")))
    assert docs == ["One.\nTwo lines.", "Three", "Four", "Last story without separator"]


def test_jsonl_and_parquet_readers(tmp_path):
    rows = ["first doc", "second, longer document", "é ü"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": r, "id": i}) + "\n\n"
                                              for i, r in enumerate(rows)), encoding="utf-8")
    write_parquet(tmp_path / "d.parquet", body=rows, id=[1, 2, 3])
    assert list(iter_documents(str(tmp_path / "d.jsonl"))) == rows
    assert list(iter_documents(str(tmp_path / "d.parquet"), text_field="body")) == rows
    assert list(iter_documents(str(tmp_path / "d.jsonl"), min_chars=10)) == rows[1:2]
    assert list(iter_documents(str(tmp_path / "d.jsonl"), max_docs=2)) == rows[:2]


def test_directory_and_glob_in_sorted_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("b1\n<|endoftext|>\nb2", encoding="utf-8")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "a1"}), encoding="utf-8")
    write_parquet(tmp_path / "sub" / "c.parquet", text=["c1"])
    (tmp_path / "notes.md").write_text("ignored", encoding="utf-8")
    shards = corpus_shards(str(tmp_path))
    assert [s.name for s in shards] == [str(tmp_path / n) for n in
                                        ("a.jsonl", "b.txt", "sub/c.parquet")]
    assert list(iter_documents(str(tmp_path))) == ["a1", "b1", "b2", "c1"]
    assert list(iter_documents(str(tmp_path / "*.txt"))) == ["b1", "b2"]


def test_min_chars_and_max_docs_on_builtin():
    docs = list(iter_documents("builtin", n_stories=50, min_chars=1000, max_docs=5))
    ref = [d for d in bc.generate_stories(50) if len(d) >= 1000][:5]
    assert docs == ref and len(docs) == 5


def test_local_parquet_goes_through_datasets_parquet_builder(tmp_path, monkeypatch):
    import datasets
    calls = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    path = str(write_parquet(tmp_path / "x.parquet", text=["p", "q"]))
    assert list(iter_documents(path)) == ["p", "q"]
    assert calls == [(("parquet",), {"data_files": [path], "split": "train", "streaming": True})]


def test_hub_id_lists_parquet_files_per_split(monkeypatch):
    from types import SimpleNamespace as NS

    files = ["README.md", "openwebtext.py", "plain_text/train-00000-of-00002.parquet",
             "plain_text/train-00001-of-00002.parquet", "plain_text/test-00000-of-00001.parquet",
             "other/train-00000.parquet"]
    entries = [NS(path=f, size=10, lfs=NS(sha256="a" * 64), blob_id="b" * 40) for f in files]
    seen = {}

    def fake_list(repo_id, revision):
        seen.update(repo_id=repo_id, revision=revision)
        return "c" * 40, entries

    monkeypatch.setattr(corpus.sources, "_list_dataset", fake_list)
    shards = corpus_shards("org/owt", data_dir="plain_text", revision="refs/convert/parquet")
    assert seen == {"repo_id": "org/owt", "revision": "refs/convert/parquet"}
    at = "hf://datasets/org/owt@refs%2Fconvert%2Fparquet/plain_text/"
    assert [s.name for s in shards] == [at + "train-00000-of-00002.parquet",
                                        at + "train-00001-of-00002.parquet"]
    assert all(s.reader.func is corpus.sources._hub_parquet_docs for s in shards)
    ref = shards[0].reader.args[0]  # pinned to the listed commit, hashes from the listing
    assert (ref.commit, ref.sha256, ref.size) == ("c" * 40, "a" * 64, 10)
    test = corpus_shards("org/owt", split="test")
    assert [s.name for s in test] == ["hf://datasets/org/owt/plain_text/test-00000-of-00001"
                                      ".parquet"]
    with pytest.raises(ValueError, match="no .parquet files for split 'validation'"):
        corpus_shards("org/owt", split="validation")
    entries[2] = NS(path=entries[2].path, size=10, lfs=NS(sha256="../../x"), blob_id="b" * 40)
    with pytest.raises(UnsafeFileError, match="not a sha256"):  # a path where a hash should be
        corpus_shards("org/owt", data_dir="plain_text")


def test_split_conventions():
    assert corpus.file_split("data/train-00000-of-00080.parquet") == "train"
    assert corpus.file_split("default/validation/0000.parquet") == "validation"
    assert corpus.file_split("data/part-0.parquet") is None
    assert corpus.select_split(["a.parquet", "b.parquet"], "train") == ["a.parquet", "b.parquet"]
    assert corpus.select_split(["a.parquet"], "test") == []
    files = ["x/train/0.parquet", "x/valid/0.parquet"]
    assert corpus.select_split(files, "validation") == ["x/valid/0.parquet"]


def test_hf_glob_lists_files(monkeypatch):

    class FakeFS:
        def glob(self, pattern):
            assert pattern == "hf://datasets/org/owt/data/train-*.parquet"
            return [f"datasets/org/owt/data/train-{i}.parquet" for i in (1, 0)]

    monkeypatch.setattr(corpus.sources, "HfFileSystem", FakeFS)
    shards = corpus_shards("hf://datasets/org/owt/data/train-*.parquet")
    assert [s.name for s in shards] == ["hf://datasets/org/owt/data/train-0.parquet",
                                        "hf://datasets/org/owt/data/train-1.parquet"]


def test_hf_path_without_glob_is_one_shard():
    src = "hf://datasets/Skylion007/openwebtext/plain_text/train-00000-of-00080.parquet"
    (shard,) = corpus_shards(src)
    assert shard.name == src and shard.reader.func is corpus.sources._hub_parquet_docs
    ref = shard.reader.args[0]
    assert (ref.repo_id, ref.revision, ref.path) == (
        "Skylion007/openwebtext", None, "plain_text/train-00000-of-00080.parquet")
    assert corpus.parse_hf_path("hf://datasets/a/b@refs%2Fconvert%2Fparquet/x.parquet"
                                ).revision == "refs/convert/parquet"
    for bad in ("hf://datasets/a/b/../../x.parquet", "hf://datasets/a/b"):
        with pytest.raises(ValueError, match="not a plain file name|not an hf://"):
            corpus.parse_hf_path(bad)


# ---------------------------------------------------------------- bad input
def test_missing_file_and_unknown_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.txt does not exist; valid sources"):
        list(iter_documents(str(tmp_path / "nope.txt")))
    with pytest.raises(FileNotFoundError, match="not found; valid sources: 'builtin'"):
        corpus_shards("no_such_thing")
    (tmp_path / "x.csv").write_text("a,b", encoding="utf-8")
    with pytest.raises(ValueError, match=r"suffix must be one of \.txt, \.jsonl, \.parquet"):
        corpus_shards(str(tmp_path / "x.csv"))
    with pytest.raises(ValueError, match="no .txt/.jsonl/.parquet files in directory"):
        corpus_shards(str(tmp_path))


def test_unreachable_hub_id(monkeypatch):
    from huggingface_hub import HfApi

    from pythia_probe.hub import io as hubio

    calls = []

    def offline(*args, **kwargs):
        calls.append(1)
        raise ConnectionError("network is down")

    monkeypatch.setattr(HfApi, "dataset_info", offline)
    monkeypatch.setattr(hubio, "DEFAULT_RETRY", hubio.RetryPolicy(3, 0.0, 0.0))
    with pytest.raises(OSError, match=r"'org/none' is no local path, and listing it as a hub "
                                      r"dataset failed \(ConnectionError: network is down\)"):
        corpus_shards("org/none")
    assert len(calls) == 3  # the listing went through the retry policy


def test_empty_corpus(tmp_path):
    (tmp_path / "e.txt").write_text("\n<|endoftext|>\n  \n<|endoftext|>\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty corpus: .* holds no documents"):
        list(iter_documents(str(tmp_path / "e.txt")))
    (tmp_path / "e.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty corpus"):
        list(iter_documents(str(tmp_path / "e.jsonl")))
    with pytest.raises(ValueError, match=r"no document .* has >= 99999 characters"):
        list(iter_documents("builtin", n_stories=3, min_chars=99999))


def test_missing_text_field(tmp_path):
    """Wrong or non-text fields are user errors (one line, exit 2)."""
    (tmp_path / "d.jsonl").write_text(json.dumps({"body": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(BadInputError, match=r"line 1 has no text field 'text'; fields present: "
                                        r"\['body'\]") as e1:
        list(iter_documents(str(tmp_path / "d.jsonl")))
    write_parquet(tmp_path / "d.parquet", body=["x"], id=[1])
    with pytest.raises(BadInputError, match=r"no text field 'content'; columns present: "
                                        r"\['body', 'id'\]") as e2:
        list(iter_documents(str(tmp_path / "d.parquet"), text_field="content"))
    (tmp_path / "n.jsonl").write_text(json.dumps({"text": 3}) + "\n", encoding="utf-8")
    with pytest.raises(BadInputError, match="field 'text' is int, not a string") as e3:
        list(iter_documents(str(tmp_path / "n.jsonl")))
    write_parquet(tmp_path / "i.parquet", text=[1, 2])
    with pytest.raises(BadInputError, match=r"i\.parquet: field 'text' is int") as e4:
        list(iter_documents(str(tmp_path / "i.parquet")))
    for e in (e1, e2, e3, e4):
        assert isinstance(e.value, UserError) and "\n" not in str(e.value)
        assert not str(e.value).startswith("\"")  # not KeyError's quoted form


def test_corrupt_inputs(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not a parquet file" * 20)
    with pytest.raises(ValueError, match=r"cannot read .*bad\.parquet as parquet") as e1:
        list(iter_documents(str(tmp_path / "bad.parquet")))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not valid JSON") as e2:
        list(iter_documents(str(tmp_path / "bad.jsonl")))
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 latin-1\n")
    with pytest.raises(ValueError, match="is not valid UTF-8") as e3:
        list(iter_documents(str(tmp_path / "bad.txt")))
    assert all(isinstance(e.value, UserError) for e in (e1, e2, e3))


def test_bad_options(tmp_path):
    (tmp_path / "s.txt").write_text("story", encoding="utf-8")
    with pytest.raises(BadInputError, match="apply to source='builtin' only"):
        corpus_shards(str(tmp_path / "s.txt"), n_stories=3)
    with pytest.raises(ValueError, match="p_topic must be in"):
        corpus_shards("builtin", p_topic=1.5)
    with pytest.raises(ValueError, match="n_stories must be an integer >= 0"):
        bc.generate_stories(-1)
    with pytest.raises(ValueError, match="one stream"):
        corpus_shards("builtin", split="test")
    with pytest.raises(ValueError, match="max_docs must be None or an integer >= 1"):
        next(iter_documents("builtin", max_docs=0))


# ---------------------------------------------------------------- command line
def test_cli_generate_then_read_back(tmp_path, capsys):
    out = tmp_path / "stories.txt"
    assert corpus_cli.main(["generate", "--out", str(out), "--stories", "40", "--seed", "5",
                        "--min-tokens", "201"]) == 0
    expected = bc.generate_stories(40, seed=5, min_tokens=201)
    assert list(iter_documents(str(out))) == expected
    assert out.read_text(encoding="utf-8").count("\n<|endoftext|>\n") == 40
    n_tokens = sum(len(word_tokens(s)) for s in expected)
    assert f"wrote 40 stories, {n_tokens} word-level tokens" in capsys.readouterr().out


def test_cli_inspect(tmp_path, capsys):
    assert corpus_cli.main(["inspect", "--docs", "30", "--top", "5"]) == 0
    text = capsys.readouterr().out
    assert "documents read: 30" in text and "planted groups" in text
    assert "topic:pond (topical): fish frog duck turtle -> pond" in text
    assert bc.generate_stories(1)[0] in text
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "A b, a!"}), encoding="utf-8")
    assert corpus_cli.main(["inspect", "--dataset", str(tmp_path / "d.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "tokens: 5, distinct: 4" in text and "top words: a 2, !" in text
    assert "planted" not in text


def test_cli_help_and_config_validation(capsys):
    with pytest.raises(SystemExit) as e:
        corpus_cli.main(["--help"])
    assert e.value.code == 0
    assert "generate" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--out must name a .txt"):
        corpus_cli.GenerateConfig(out="x.csv")
    with pytest.raises(ValueError, match="--docs >= 1"):
        corpus_cli.InspectConfig(docs=0)


def test_jsonl_bad_bytes_and_deep_nesting_are_one_line_naming_the_line(tmp_path, capsys):
    """Invalid UTF-8 and a line nested 100,000 deep: one line naming file and line, in the
    readers, in `corpus inspect` and in `stats compute` (was a traceback)."""
    from pythia_probe.cli import run_main
    from pythia_probe.errors import CorruptFileError
    from pythia_probe.stats.__main__ import main as stats_main

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    for path, what in ((bad, "line 2 is not valid UTF-8"), (deep, "line 2 is JSON nested too "
                                                                   "deeply")):
        with pytest.raises(CorruptFileError, match=rf"{path.name} {what}"):
            list(iter_documents(str(path)))
        for run in (lambda p=str(path): corpus_cli.main(["inspect", "--dataset", p]),
                    lambda p=str(path): stats_main(["compute", "--dataset", p, "--out",
                                                    p + ".safetensors", "--seq-len", "2",
                                                    "--no-progress"])):
            capsys.readouterr()
            assert run_main(run, "prog") == 2
            err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
            assert len(err) == 1 and what in err[0] and str(path) in err[0]


def test_inspect_cuts_a_long_sample_document_with_a_note(tmp_path):
    (tmp_path / "long.txt").write_text("word " * 300_000)  # 1.5 MB, one document
    out = corpus_cli.summarise(corpus_cli.InspectConfig(dataset=str(tmp_path / "long.txt")))
    assert len(out) < 5000 and "more characters not shown; --sample-chars]" in out
    assert "1,497,999 more characters" in out  # the document is stripped: 1,499,999


def test_generate_writes_through_the_one_writer(tmp_path):
    import os

    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (tmp_path / "stories.txt").symlink_to(outside)
    old = os.umask(0o027)
    try:
        corpus_cli.main(["generate", "--stories", "5", "--out", str(tmp_path / "stories.txt")])
    finally:
        os.umask(old)
    out = tmp_path / "stories.txt"
    assert outside.read_text() == "precious" and not out.is_symlink()
    assert out.stat().st_mode & 0o777 == 0o640 and len(list(iter_documents(str(out)))) == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_txt_document_splitting_rules(tmp_path):
    """auto: <|endoftext|> lines when the file holds any, else blank-line paragraphs."""
    from pythia_probe.corpus import DOC_SPLITS

    plain = tmp_path / "plain.txt"
    plain.write_text("one a\none b\n\n\ntwo\n  \nthree\n")
    sep = tmp_path / "sep.txt"
    sep.write_text("a b\n\nc\n<|endoftext|>\nd\n")
    docs = {rule: list(iter_documents(str(plain), doc_split=rule)) for rule in DOC_SPLITS}
    assert docs["auto"] == docs["blank-line"] == ["one a\none b", "two", "three"]
    assert docs["line"] == ["one a", "one b", "two", "three"]
    assert docs["whole"] == ["one a\none b\n\n\ntwo\n  \nthree"]
    assert docs["endoftext"] == docs["whole"]
    assert list(iter_documents(str(sep))) == ["a b\n\nc", "d"]
    assert list(iter_documents(str(sep), doc_split="blank-line")) == ["a b", "c\n<|endoftext|>\nd"]
    a, b = (corpus_shards(str(plain), doc_split=r)[0].fingerprint() for r in ("line", "auto"))
    assert a["sha256"] == b["sha256"] and a != b  # the rule is part of the shard's content
    with pytest.raises(ValueError, match="doc_split 'para'; valid: auto, endoftext"):
        corpus_shards(str(plain), doc_split="para")
