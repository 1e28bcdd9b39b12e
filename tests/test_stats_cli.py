"""CLI end to end on the built-in corpus: planted relations recovered, `top`, bad input."""

from __future__ import annotations

import pytest
import torch

from pythia_probe import builtin_corpus as bc
from pythia_probe.errors import MismatchError
from pythia_probe.stats import CorpusStats
from pythia_probe.stats.__main__ import main
from pythia_probe.stats.job import StatsConfig
from pythia_probe.stats.top import load_names

MATRIX_OF = {"bigram": "Bbar", "interchangeable": "SigmaB", "topical": "Phibar"}


@pytest.fixture(scope="module")
def builtin_stats(tmp_path_factory):
    out = tmp_path_factory.mktemp("stats") / "builtin.safetensors"
    rc = main(["compute", "--dataset", "builtin", "--stories", "3000", "--stories-per-shard",
               "1000",
               "--seq-len", "128", "--mode", "packed", "--tokenizer", "word:3000",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def planted_precision(stats: CorpusStats, names: list[str]) -> dict[str, float]:
    """Mean precision@10 over each planted group's words (row of the group's matrix)."""
    idx = {n: i for i, n in enumerate(names)}
    out = {}
    for group, pg in bc.PLANTED.items():
        M = stats[MATRIX_OF[pg.kind]]
        relevant = pg.words if pg.kind == "interchangeable" else pg.partners
        relevant = [w.lower() for w in relevant]
        scores = []
        for w in (w.lower() for w in pg.words):
            exclude = {w} | (set(bc.FUNCTION_WORDS) if pg.kind == "topical" else set())
            scores.append(bc.precision_at_k(M[idx[w]].tolist(), names, relevant, 10, exclude))
        out[group] = sum(scores) / len(scores)
    return out


def test_planted_relations_recovered(builtin_stats):
    stats = CorpusStats.load(builtin_stats)
    names = load_names(stats, str(builtin_stats), None)
    prec = planted_precision(stats, names)
    assert set(prec) == set(bc.PLANTED)
    low = {g: p for g, p in prec.items() if p < 0.8}
    assert not low, f"planted groups below precision@10 = 0.8: {low}"


def test_cli_file_records_policy_tokenizer_and_ledger(builtin_stats):
    from pythia_probe.tokenizer import load_tokenizer, tokenizer_fingerprint

    tok = load_tokenizer(str(builtin_stats) + ".tokenizer.json")
    stats = CorpusStats.load(builtin_stats, expect=tokenizer_fingerprint(tok))
    m = stats.meta
    assert m["policy"]["mode"] == "packed" and m["T"] == 128 and stats.T == 128
    assert [e["index"] for e in m["ledger"]] == [0, 1, 2] and m["counts"]["docs"] == 3000
    assert m["counts"]["positions"] == 128 * m["counts"]["sequences"]
    assert float(stats.Bbar.sum(1).abs().max()) < 1e-15
    with pytest.raises(MismatchError, match="recompute"):
        CorpusStats.load(builtin_stats, expect={"name": "pythia", "sha256": "0" * 64,
                                                "d_vocab": 50277})


def test_top_subcommand_prints_figure5_lists(builtin_stats, capsys):
    rc = main(["top", "--stats", str(builtin_stats), "--rows", "red,happy,fish", "--k", "4",
               "--matrices", "Bbar,SigmaB,Phibar"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("Bbar", "SigmaB"))]
    red = next(ln for ln in lines if ln.split()[:2] == ["Bbar", "red"])
    assert sum(w in red.split()[2:] for w in bc.TOYS + bc.VEHICLES) == 4
    happy = next(ln for ln in lines if ln.split()[:2] == ["SigmaB", "happy"])
    assert sum(w in happy.split()[2:] for w in bc.EMOTIONS) == 4
    with pytest.raises(ValueError, match="not in the statistics' vocabulary"):
        main(["top", "--stats", str(builtin_stats), "--rows", "zebra-not-a-word"])


def test_cli_top_k_and_bad_config(tmp_path):
    out = tmp_path / "k.safetensors"
    assert main(["compute", "--dataset", "builtin", "--stories", "200", "--stories-per-shard",
                 "100",
                 "--seq-len", "32", "--tokenizer", "word:3000", "--top-k", "50",
                 "--out", str(out), "--no-progress"]) == 0
    s = CorpusStats.load(out)
    assert s.d_vocab == 50 and s.restricted and s.Qbar.shape == (50, 50)
    counts = s.token_counts
    assert bool((counts[:-1] >= counts[1:]).all())  # most frequent first
    assert torch.isfinite(s.Gbar).all()
    assert StatsConfig(top_k="full").top_k is None and StatsConfig(top_k="50").top_k == 50
    with pytest.raises(ValueError, match="--top-k 'many': valid: full, or an integer K >= 1"):
        StatsConfig(top_k="many")
    with pytest.raises(ValueError, match="--seq-len must be >= 1"):
        StatsConfig(seq_len=0)
    with pytest.raises(ValueError, match="word:K needs an integer"):
        StatsConfig(tokenizer="word:many")
    with pytest.raises(ValueError, match="--mode must be one of"):
        StatsConfig(mode="sliding")
    if not torch.cuda.is_available():
        from pythia_probe.errors import DeviceError
        with pytest.raises(DeviceError, match="no CUDA device"):
            StatsConfig(device="cuda")
    with pytest.raises(FileNotFoundError):
        main(["compute", "--dataset", str(tmp_path / "missing.txt"), "--out", str(out),
              "--no-progress"])


def test_cli_text_file_with_short_and_empty_documents(tmp_path):
    corpus = tmp_path / "c.txt"
    docs = ["a b c d e f g h i j k l", "tiny", "b c d e f g h i j k l m n o"]
    corpus.write_text("\n<|endoftext|>\n".join(docs))
    out = tmp_path / "t.safetensors"
    assert main(["compute", "--dataset", str(corpus), "--seq-len", "8", "--tokenizer", "word:30",
                 "--out", str(out), "--no-progress"]) == 0
    s = CorpusStats.load(out)
    assert s.meta["counts"]["sequences"] == 2 and s.meta["counts"]["docs_short"] == 1


def test_bos_eos_may_be_the_unknown_token_as_in_pythia():
    """Pythia's <|endoftext|> is BOS, EOS and UNK at once (id 0): it must be accepted."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from pythia_probe.stats.settings import _token_id

    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>")),
        unk_token="<|endoftext|>", eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    assert tok.unk_token_id == 0
    assert _token_id(tok, "<|endoftext|>") == 0 and _token_id(tok, "b") == 2
    with pytest.raises(ValueError, match="not a token"):
        _token_id(tok, "<|pad|>")


def test_work_folder_removed_after_success_and_changed_corpus_is_never_reused(tmp_path):
    """Resume by content: an interrupted run's work is refused once a corpus file changed."""
    from pythia_probe.errors import MismatchError
    from pythia_probe.stats import driver as run

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n<|endoftext|>\n".join(["a b c d e f g h i j k l"] * 3))
    out = tmp_path / "t.safetensors"
    args = ["--dataset", str(corpus), "--seq-len", "8", "--tokenizer", "word:30",
            "--out", str(out), "--no-progress"]
    assert main(["compute", *args]) == 0
    assert not (tmp_path / "t.safetensors.work").exists()
    assert main(["compute", *args, "--keep-work"]) == 0  # as if killed after pass 1: work is kept
    work = tmp_path / "t.safetensors.work"
    assert any(work.glob("pass1-*.safetensors"))
    same_size = corpus.read_text().replace("a b c", "c b a")
    corpus.write_text(same_size)
    with pytest.raises(MismatchError, match=f"corpus shards changed.*{corpus.name}"):
        main(["compute", *args])
    run.remove_work(work)
    assert not work.exists()
    assert main(["compute", *args]) == 0
    changed = CorpusStats.load(out)
    names = load_names(changed, str(out), None)
    # "c b a" now occurs: counted from the new text, not reused from the old work
    assert changed.Bbar[names.index("c"), names.index("b")] > 0


def test_plan_refuses_what_cannot_fit_before_reading_any_document(tmp_path, monkeypatch):
    """--seq-len 100000000 --keep-short on a tiny corpus is refused with the numbers, and no
    file is written (it used to write 2.7 GB of padded windows)."""
    from pythia_probe import corpus
    from pythia_probe.errors import DiskFullError, ResourceError
    from pythia_probe.planner import statistics as plan

    (tmp_path / "c.txt").write_text("a b c d e f\n<|endoftext|>\nb c d e\n")
    read = []
    monkeypatch.setattr(corpus, "corpus_shards", lambda *a, **k: read.append(a) or [])
    args = ["compute", "--dataset", str(tmp_path / "c.txt"), "--tokenizer", "word:30",
            "--out", str(tmp_path / "s.safetensors"), "--no-progress"]
    with pytest.raises(ResourceError, match=r"--seq-len 100000000 with --batch-size 256 needs "
                                            r"822\.4 GB per batch"):
        main([*args, "--seq-len", "100000000", "--keep-short"])
    monkeypatch.setattr(plan.fileio, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskFullError, match=r"the token cache \(50 windows of 129 tokens\) needs"):
        main([*args, "--docs", "50"])
    assert read == [] and [p.name for p in tmp_path.iterdir()] == ["c.txt"]
