"""Issue 16 on the statistics side: every bad input or failing resource is one line up front
(exit 2, naming what was wrong and what is valid), nothing unbounded, nothing large left behind,
files written the one way (umask, no symlink followed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from safetensors import SafetensorError

from pythia_probe import fileio
from pythia_probe.cli import run_main
from pythia_probe.errors import BadInputError, DiskFullError, ResourceError
from pythia_probe.planner import statistics as plan
from pythia_probe.stats import CorpusStats
from pythia_probe.stats.__main__ import main
from pythia_probe.stats.job import StatsConfig
from pythia_probe.tokenizer import d_vocab, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = ("The cat sat on the mat. The dog ran to the cat.\n\n"
        "A red ball and a red car were on the mat.\n\n"
        "The happy dog and the sad cat sat by the pond.\n")


def cli(argv: list[str]) -> int:
    """The command as a user runs it: a user error is one line on stderr and exit code 2."""
    return run_main(lambda: main(argv), "stats")


def error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]


def compute(tmp: Path, *args: str) -> list[str]:
    return ["compute", "--out", str(tmp / "s.safetensors"), "--no-progress", *args]


def stories(tmp: Path, n: int = 30) -> Path:
    from pythia_probe.corpus.__main__ import GenerateConfig, generate

    generate(GenerateConfig(out=str(tmp / "stories.txt"), stories=n))
    return tmp / "stories.txt"


def test_a_window_longer_than_the_corpus_is_refused_before_any_work(tmp_path, capsys):
    """--seq-len 5000000 --batch-size 1 --keep-short on 30 stories: no window can reach T+1
    tokens; refused before the tokenizer is built, nothing written (it wrote hundreds of MB)."""
    corpus = stories(tmp_path)
    rc = cli(compute(tmp_path, "--dataset", str(corpus), "--seq-len", "5000000",
                     "--batch-size", "1", "--keep-short"))
    err = error_lines(capsys)
    assert rc == 2 and len(err) == 1
    assert "--seq-len 5000000: a window holds T+1 = 5,000,001 tokens, but the whole corpus " \
           "is" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stories.txt"]


def test_keep_short_token_cache_holds_tokens_not_padding(tmp_path):
    corpus = stories(tmp_path, 20)
    assert main(compute(tmp_path, "--dataset", str(corpus), "--seq-len", "2000",
                        "--keep-short", "--keep-work", "--tokenizer", "word:3000",
                        "--batch-size", "16")) == 0
    stats = CorpusStats.load(tmp_path / "s.safetensors")
    tokens = stats.meta["counts"]["tokens"]
    cache = sum(p.stat().st_size for p in (tmp_path / "s.safetensors.work" / "cache").iterdir())
    assert cache < 4 * tokens + 8 * 20 + 4096 < 20 * 2001 * 4  # padded it was 160 kB
    assert stats.T == 2000 and stats.meta["counts"]["sequences"] == 20


def test_huge_t_is_refused_by_every_plan_that_pads():
    """Per-batch padding, the torch kernels' pair workspace and the sparse pair buffer and
    pass-2 windows all grow with T: each plan says so with the numbers."""
    with pytest.raises(ResourceError, match=r"torch kernels' workspace for 1 x 12,500,002,500,000"):
        plan.check_batches(5_000_000, 1, None, "first", ".", (19e9, "test"),
                           torch_kernels=True)
    assert plan.batch_needs(5_000_000, 1, None, "first")["kernel_bytes"] == 0  # C kernels
    choice = plan.choose_engine("sparse", plan.StatsShape(50277, 5_000_000, 5000),
                                budget=(19e9, "test"))
    assert choice.plan["sparse"]["pair_buffer_bytes"] > 16 * 12_500_002_500_000
    with pytest.raises(ResourceError, match="sparse engine need"):
        plan.check_sparse_fits(choice, 50277, 5000)
    small = plan.choose_engine("sparse", plan.StatsShape(50277, 20000, 5000), budget=(19e9, "test"))
    with pytest.raises(ResourceError, match=r"--keep-short pads short documents"):
        plan.check_pass2_windows(small, 20000, 100_000, "keep")


def test_engine_dense_past_its_plan_is_refused_before_allocating(tmp_path, monkeypatch):
    from pythia_probe.stats.dense.count import CountAccumulator

    allocated = []
    monkeypatch.setattr(CountAccumulator, "__init__",
                        lambda self, *a, **k: allocated.append(a))
    monkeypatch.setattr(plan, "memory_budget", lambda device: (2e6, "a 2 MB test budget"))
    with pytest.raises(ResourceError, match=r"--engine dense at d_vocab [\d,]+ needs [\d.]+ GB .*"
                                            r"more than the budget 0\.0 GB \(a 2 MB test budget"
                                            r"\); use --engine sparse or auto"):
        main(compute(tmp_path, "--stories", "300", "--engine", "dense"))
    assert allocated == []


def test_engine_dense_on_a_gpu_that_offloads_to_a_small_host_is_refused_up_front(monkeypatch):
    """A CUDA device that holds the dense peak but not six V x V matrices keeps its V x V
    results in host memory: the plan checks the host too (it was an allocator traceback after
    pass 1), and auto goes sparse."""
    V = 20_000
    VV = 8 * V * V
    device = (16e9, "16 GB free on cuda:0 x 0.9")  # > dense peak 4 VV + 1 GiB, < 6 VV
    monkeypatch.setattr(plan, "memory_budget", lambda dev: (2e9, "a 2 GB test host"))
    host = plan.dense_peak(V, None, "cpu")
    assert plan.dense_peak(V, None, "cuda:0") < device[0] < 6 * VV and host > 2e9
    with pytest.raises(ResourceError, match=rf"needs {host / 1e9:.1f} GB .* more than the budget "
                                            r"2\.0 GB \(host memory of a CUDA run: a 2 GB"):
        plan.choose_engine("dense", plan.StatsShape(V, 128, None), "cuda:0", device)
    assert plan.choose_engine("auto", plan.StatsShape(V, 128, None),
                              "cuda:0", device).resolved == "sparse"
    monkeypatch.setattr(plan, "memory_budget", lambda dev: (1e12, "a 1 TB test host"))
    assert plan.choose_engine("dense", plan.StatsShape(V, 128, None),
                              "cuda:0", device).resolved == "dense"


def test_engine_auto_follows_the_plan():
    """word:20000 on a 24 GB machine: the sparse engine (its fixed need is below the dense
    engine's 17 GB); a small vocabulary stays dense."""
    big = plan.choose_engine("auto", plan.StatsShape(20000, 128, None), budget=(19.2e9, "24 GB"))
    assert big.resolved == "sparse" and "is above the sparse engine's" in big.reason
    small = plan.choose_engine("auto", plan.StatsShape(488, 128, None), budget=(19.2e9, "24 GB"))
    assert small.resolved == "dense"


def test_budget_gb_must_be_positive():
    for bad in (-1.0, 0.0):
        with pytest.raises(BadInputError, match=r"--budget-gb must be > 0"):
            StatsConfig(budget_gb=bad)


def test_tokenizer_mismatch_hint_names_the_compute_command():
    from pythia_probe.stats.result import check_tokenizer

    with pytest.raises(BadInputError, match=r"`python -m pythia_probe\.stats compute "
                                            r"--tokenizer \.\.\.`"):
        check_tokenizer({"tokenizer": {"sha256": "a", "d_vocab": 3, "scheme": "ids/1"}},
                        {"sha256": "b", "d_vocab": 3, "scheme": "ids/1"})


def test_files_beside_the_statistics_follow_no_symlink_and_honour_the_umask(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("precious")
    (tmp_path / "s.safetensors.tokenizer.json").symlink_to(outside)
    old = os.umask(0o027)
    try:
        assert main(compute(tmp_path, "--stories", "100", "--seq-len", "16")) == 0
    finally:
        os.umask(old)
    tok = tmp_path / "s.safetensors.tokenizer.json"
    assert outside.read_text() == "precious" and not tok.is_symlink()
    assert d_vocab(load_tokenizer(tok)) == CorpusStats.load(tmp_path / "s.safetensors").d_vocab
    for f in (tmp_path / "s.safetensors", tok):
        assert f.stat().st_mode & 0o777 == 0o640, f


@pytest.mark.parametrize("which", ["s.safetensors", "pass1-rank0-of1.safetensors"])
def test_disk_full_while_safetensors_serialises_is_one_line(which, tmp_path, monkeypatch,
                                                             capsys):
    """safetensors reports a full disk as its own error and deletes its partial file, so the
    free-space check alone saw a healthy disk; the message names the file."""
    from pythia_probe.stats import checkpoint

    real = checkpoint.save_file

    def full(tensors, path, metadata=None):
        if Path(path).name.startswith(f".{which}."):
            raise SafetensorError("Error while serializing: I/O error: No space left on device "
                                  "(os error 28)")
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoint, "save_file", full)
    rc = cli(compute(tmp_path, "--stories", "100", "--seq-len", "16"))
    err = error_lines(capsys)
    assert rc == 2 and len(err) == 1
    assert f"disk full writing {tmp_path}" in err[0] and which in err[0]
    assert not list(tmp_path.rglob(f".{which}.*"))  # no temp file left
    assert isinstance(fileio.disk_full_error(tmp_path / which, 10), DiskFullError)


def test_word_statistics_on_ordinary_text(tmp_path, capsys):
    """A .txt without <|endoftext|> lines is cut at blank lines; documents with a word outside
    the top K are dropped (the paper's rule) and the line says so; nothing is left behind;
    --oov unk keeps them with the [UNK] id as the last statistic id."""
    corpus = tmp_path / "plain.txt"
    corpus.write_text(TEXT)
    args = compute(tmp_path, "--dataset", str(corpus), "--seq-len", "4", "--tokenizer",
                   "word:5")
    rc = cli(args)
    err = error_lines(capsys)[0]
    assert rc == 2 and "no positions were counted: 3 documents read; 3 dropped for a token " \
                       "outside the vocabulary (with word:K" in err
    assert "--oov unk" in err and not (tmp_path / "s.safetensors.work").exists()
    assert main([*args, "--oov", "unk"]) == 0
    stats = CorpusStats.load(tmp_path / "s.safetensors")
    assert stats.d_vocab == 6 and stats.meta["counts"]["docs"] == 3
    assert stats.meta["policy"]["oov"] == "unk" and stats.token_counts[5] > 0  # [UNK] counted
    assert main([*args, "--oov", "unk", "--doc-split", "line"]) == 0
    assert CorpusStats.load(tmp_path / "s.safetensors").meta["counts"]["docs"] == 3
    assert main([*args, "--oov", "unk", "--doc-split", "whole"]) == 0
    assert CorpusStats.load(tmp_path / "s.safetensors").meta["counts"]["docs"] == 1


def test_top_shows_space_prefixed_tokens_apart_and_finds_them_by_text(tmp_path, capsys):
    from pythia_probe.stats.top import SPACE, token_names
    from pythia_probe.testing.tokenizers import pythia_like_backend

    tok_file = tmp_path / "bpe.json"
    pythia_like_backend(d_vocab=400, merges_vocab=400, n_stories=60).save(str(tok_file))
    tok = load_tokenizer(tok_file)
    the, space_the = tok.convert_tokens_to_ids("The"), tok.convert_tokens_to_ids("\u0120The")
    assert None not in (the, space_the) and tok.decode([space_the]) == " The"
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n<|endoftext|>\n".join(["The cat sat. The dog ran. The end."] * 20))
    assert main(compute(tmp_path, "--dataset", str(corpus), "--seq-len", "8", "--tokenizer",
                        str(tok_file))) == 0
    stats = CorpusStats.load(tmp_path / "s.safetensors")
    names = [n for n, _, _ in token_names(stats, str(tmp_path / "s.safetensors"), str(tok_file))]
    assert names[space_the] == f"{SPACE}The" and names[the] == "The"
    assert len(set(names)) == len(names)  # no two tokens print alike
    for row in (f"{SPACE}The", "\u0120The", str(space_the)):
        assert main(["top", "--stats", str(tmp_path / "s.safetensors"), "--tokenizer",
                     str(tok_file), "--rows", row, "--k", "2"]) == 0
        line = capsys.readouterr().out.splitlines()[-3]  # the Bbar row (then SigmaB, Phibar)
        assert line.split()[:2] == ["Bbar", f"{SPACE}The"], line
