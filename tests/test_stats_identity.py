"""What names statistics is their content (issue 16): the recipe cache key, stats_id and the
pass-2 token caches follow the bytes that decide the numbers, never a path, a modification
time or where the tokenizer was loaded from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pythia_probe.errors import MismatchError
from pythia_probe.stats import CorpusStats
from pythia_probe.stats import driver as run
from pythia_probe.stats.dense.engine import DenseEngine
from pythia_probe.stats.pass1 import cache_path
from pythia_probe.stats.recipe import Recipe, ensure
from pythia_probe.stats.recipe import cache_path as recipe_path
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse.engine import SparseEngine
from pythia_probe.testing.shards import IdShard, encode_ids
from pythia_probe.tokenizer import (
    build_word_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_fingerprint,
)

pytestmark = pytest.mark.usefixtures("one_thread")
STORIES = ["the cat sat on the mat and the dog ran to the cat",
           "a dog sat on a log and the cat ran to the mat",
           "the mat was red and the log was big and the dog was happy"]


def write_corpus(path: Path, stories: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n<|endoftext|>\n".join(stories) + "\n")
    return path


def tokenizer_in(folder: Path):
    """The same word tokenizer saved in ``folder`` and loaded from there (as a model's
    tokenizer is loaded from its snapshot inside one HF_HOME or another)."""
    save_tokenizer(build_word_tokenizer(STORIES, 50), folder / "tokenizer.json")
    return load_tokenizer(folder / "tokenizer.json")


def build(recipe: Recipe, tok, root: Path) -> Path:
    return ensure(recipe, tok, tokenizer_fingerprint(tok), "cpu", root=root)


def test_recipe_cache_follows_the_corpus_content(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", STORIES)
    tok = tokenizer_in(tmp_path / "tok")
    recipe = Recipe(str(corpus), None, 0, 6)
    first = build(recipe, tok, tmp_path / "cache")
    mtime = first.stat().st_mtime_ns
    assert build(recipe, tok, tmp_path / "cache") == first  # reused: not rebuilt
    assert first.stat().st_mtime_ns == mtime
    corpus.touch()  # a new modification time is no new content
    assert recipe_path(recipe, tokenizer_fingerprint(tok), tmp_path / "cache") == first
    write_corpus(corpus, [s.replace("cat", "dog") for s in STORIES])  # same size, new bytes
    second = build(recipe, tok, tmp_path / "cache")
    assert second != first and second.is_file() and first.is_file()
    old, new = CorpusStats.load(first), CorpusStats.load(second)
    assert old.stats_id != new.stats_id and not torch.equal(old.Bbar, new.Bbar)


def test_same_recipe_in_two_hf_homes_has_one_key_and_one_stats_id(tmp_path):
    """Tokenizer and corpus copies in two folders, two caches: one file name, one stats_id."""
    paths, ids = [], []
    for home in ("home1", "home2"):
        root = tmp_path / home
        corpus = write_corpus(root / "data" / "c.txt", STORIES)
        tok = tokenizer_in(root / "snapshots" / "abc")
        assert tok.name_or_path.startswith(str(root))
        path = build(Recipe(str(corpus), None, 0, 6), tok, root / "pythia_probe" / "stats")
        paths.append(path.name)
        ids.append(CorpusStats.load(path).stats_id)
    assert paths[0] == paths[1] and ids[0] == ids[1]


def shards(n: int = 4, seed: int = 0) -> list[IdShard]:
    g = torch.Generator().manual_seed(seed)
    return [IdShard(f"s{i}", tuple(" ".join(map(str, torch.randint(0, 13, (9,), generator=g)
                                                 .tolist())) for _ in range(5)))
            for i in range(n)]


def spec(work: Path, engine: str) -> run.RunSpec:
    return run.RunSpec(13, SequencePolicy(6), encode_ids, {"case": 1}, work, batch_size=3,
                       progress=False, engine=engine)


def kill_between_passes(monkeypatch, engine: str) -> None:
    def killed(*a, **k):
        raise KeyboardInterrupt("killed between the passes")

    monkeypatch.setattr(DenseEngine if engine == "dense" else SparseEngine, "second_pass",
                        killed)


@pytest.mark.parametrize("engine", ["dense", "sparse"])
def test_token_cache_of_another_shard_is_never_used(engine, tmp_path, monkeypatch, caplog):
    clean = run.compute_stats(shards(), spec(tmp_path / "clean", engine), {})
    work = tmp_path / "work"
    with monkeypatch.context() as m:
        kill_between_passes(m, engine)
        with pytest.raises(KeyboardInterrupt):
            run.compute_stats(shards(), spec(work, engine), {})
    one, two = cache_path(spec(work, engine), "s1"), cache_path(spec(work, engine), "s2")
    shutil.copyfile(one, two)  # a valid cache, of the wrong shard
    with caplog.at_level("WARNING"):
        resumed = run.compute_stats(shards(), spec(work, engine), {})
    assert any("holds other windows than pass 1 counted" in r.getMessage()
               for r in caplog.records)
    assert resumed.stats_id == clean.stats_id
    for n in ("Qbar", "Delta", "Bbar", "Phibar", "Gbar"):
        assert torch.equal(resumed[n], clean[n]), n


def test_a_shard_changed_between_the_passes_is_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    with monkeypatch.context() as m:
        kill_between_passes(m, "dense")
        with pytest.raises(KeyboardInterrupt):
            run.compute_stats(shards(), spec(work, "dense"), {})
    cache_path(spec(work, "dense"), "s2").unlink()
    changed = shards()
    changed[2] = IdShard("s2", shards(seed=1)[2].texts)
    with pytest.raises(MismatchError, match="shard s2 changed since pass 1 counted it"):
        run.compute_stats(changed, spec(work, "dense"), {})
