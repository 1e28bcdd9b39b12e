"""Built-in corpus and word tokenizer throughput, each against a baseline measured in this run.

    python benchmarks/bench_corpus.py                  # 20,000 stories (~4.8 M word tokens)
    python benchmarks/bench_corpus.py --stories 5000

1. generation: `generate_stories` (stories/s, word tokens/s) vs reading the same stories back
   from a TinyStories-format .txt file with `iter_documents` (the cost of any real corpus).
2. encoding: `encode_documents` (word tokenizer: ASCII regex fast path) vs the tokenizers
   backend (`encode_batch_fast`, the generic path); the ids are checked equal.
3. vocabulary: `build_word_tokenizer` (count + rank) vs counting with the tokenizers
   normalizer + pre-tokenizer per document; the counts are checked equal.
One thread each; all numbers are measured here, none typed in.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

from pythia_probe.builtin_corpus import count_tokens, generate_stories
from pythia_probe.cli import parse_configs, run_main
from pythia_probe.corpus import SEPARATOR, iter_documents
from pythia_probe.errors import BadInputError
from pythia_probe.tokenizer import (
    _count_words,
    build_word_tokenizer,
    encode_documents,
    word_normalizer,
    word_pre_tokenizer,
)

PROG = "python benchmarks/bench_corpus.py"


@dataclass(frozen=True)
class BenchConfig:
    """Built-in corpus and word tokenizer throughput against baselines measured in this run."""

    stories: int = 20000
    """Stories generated (about 240 word tokens each)."""

    def __post_init__(self):
        if self.stories < 1:
            raise BadInputError(f"--stories must be >= 1, got {self.stories}")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench(args: BenchConfig) -> int:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    docs, t_gen = timed(lambda: generate_stories(args.stories, seed=0))
    n_tok = sum(count_tokens(d) for d in docs)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stories.txt")
        with open(path, "w", encoding="utf-8") as f:  # the baseline: a plain file, not the tool's
            f.writelines(f"{d}\n{SEPARATOR}\n" for d in docs)
        back, t_read = timed(lambda: list(iter_documents(path)))
    assert back == docs
    print(f"stories {len(docs)}, word tokens {n_tok} ({n_tok / len(docs):.1f}/story)")
    print(f"generate: {t_gen:.2f} s = {len(docs) / t_gen:,.0f} stories/s, "
          f"{n_tok / t_gen / 1e6:.2f} M tokens/s")
    print(f"read back from .txt (baseline): {t_read:.2f} s = {n_tok / t_read / 1e6:.2f} M "
          f"tokens/s; generate/read time ratio {t_gen / t_read:.2f}")
    tok, t_vocab = timed(lambda: build_word_tokenizer(docs, 3000))
    norm, pre = word_normalizer(), word_pre_tokenizer()
    slow, t_count = timed(lambda: Counter(p for d in docs for p, _ in
                                          pre.pre_tokenize_str(norm.normalize_str(d))))
    assert _count_words(docs)[0] == slow
    print(f"build_word_tokenizer: {n_tok / t_vocab / 1e6:.2f} M tokens/s; tokenizers counting "
          f"(baseline): {n_tok / t_count / 1e6:.2f} M tokens/s; speed-up {t_count / t_vocab:.1f}x")
    ids, t_enc = timed(lambda: list(encode_documents(tok, docs)))
    ref, t_ref = timed(lambda: [e.ids for e in tok.backend_tokenizer.encode_batch_fast(
        docs, add_special_tokens=False)])
    assert ref == ids
    print(f"encode_documents: {n_tok / t_enc / 1e6:.2f} M tokens/s; tokenizers backend "
          f"(baseline): {n_tok / t_ref / 1e6:.2f} M tokens/s; speed-up {t_ref / t_enc:.1f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BenchConfig], argv, PROG, __doc__)
    return bench(BenchConfig(**fields))


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
