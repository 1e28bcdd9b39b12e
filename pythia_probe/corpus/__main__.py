"""``python -m pythia_probe.corpus generate|inspect``: write the built-in stories to a .txt
corpus, or summarise any corpus (counts, lengths, top words, a sample, planted groups)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from pythia_probe import builtin_corpus
from pythia_probe.cli import parse_subcommand, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import atomic_write, check_writable


@dataclass(frozen=True)
class GenerateConfig:
    """Write built-in stories to a TinyStories-format .txt file."""

    out: str
    """Output .txt file (TinyStories format: stories separated by <|endoftext|> lines)."""
    stories: int = 20000
    """Number of stories."""
    seed: int = 0
    """Seed of the story stream (the same seed always gives the same bytes)."""
    length: int = 24
    """Mean body sentences per story."""
    min_tokens: int = 0
    """Extend stories to at least this many word-level tokens (201 for T = 200)."""
    p_topic: float = 0.9
    """Probability that a habitat/action word comes from the story's own topic."""

    def __post_init__(self):
        if not self.out.endswith(".txt"):
            raise BadInputError(f"--out must name a .txt file, got {self.out!r}")
        builtin_corpus._check_args(self.stories, self.seed, self.length, self.min_tokens,
                                   self.p_topic)


@dataclass(frozen=True)
class InspectConfig:
    """Summarise a corpus: counts, lengths, top words, a sample, planted groups (builtin)."""

    dataset: str = "builtin"
    """Corpus: 'builtin', a .txt/.jsonl/.parquet path or folder, a hub dataset id, hf:// glob."""
    docs: int = 2000
    """Read at most this many documents."""
    min_chars: int = 0
    """Minimum document length in characters."""
    text_field: str = "text"
    """Text column of jsonl/parquet/hub corpora."""
    split: str = "train"
    """Hub dataset split."""
    top: int = 20
    """How many top words to list."""
    doc_split: str = "auto"
    """How a .txt file is cut into documents: auto (<|endoftext|> lines when the file has any,
    else blank lines), endoftext, blank-line, line, whole."""
    sample_chars: int = 2000
    """Characters of the sample document shown (the rest is cut, with a note)."""

    def __post_init__(self):
        if self.docs < 1 or self.top < 1 or self.min_chars < 0 or self.sample_chars < 1:
            raise BadInputError("need --docs >= 1, --top >= 1, --min-chars >= 0 and "
                                "--sample-chars >= 1")
        from pythia_probe.corpus.sources import DOC_SPLITS  # deferred: --help
        if self.doc_split not in DOC_SPLITS:
            raise BadInputError(f"--doc-split {self.doc_split!r}; valid: {', '.join(DOC_SPLITS)}")


def generate(cfg: GenerateConfig) -> int:
    """Write the stories, each followed by a "<|endoftext|>" line, through the one atomic
    writer (a temp file beside ``out``, renamed when complete); returns the token count."""
    from pythia_probe.corpus.sources import SEPARATOR  # deferred: --help
    n_tokens = 0

    def write(tmp: Path) -> None:
        nonlocal n_tokens
        with open(tmp, "w", encoding="utf-8") as f:
            for i in tqdm(range(cfg.stories), desc="stories", unit="story", mininterval=1):
                text = builtin_corpus.story(i, cfg.seed, length=cfg.length,
                                            min_tokens=cfg.min_tokens, p_topic=cfg.p_topic)
                n_tokens += builtin_corpus.count_tokens(text)
                f.write(f"{text}\n{SEPARATOR}\n")

    atomic_write(cfg.out, write)
    return n_tokens


def summarise(cfg: InspectConfig) -> str:
    """The report `inspect` prints (every number computed from the documents read)."""
    import numpy as np  # deferred: --help

    from pythia_probe.corpus.sources import iter_documents  # deferred: --help
    from pythia_probe.tokenizer import word_tokens  # deferred: --help
    docs = list(iter_documents(cfg.dataset, text_field=cfg.text_field, min_chars=cfg.min_chars,
                               max_docs=cfg.docs, split=cfg.split, doc_split=cfg.doc_split))
    toks = [word_tokens(d) for d in docs]
    chars, ntok = np.array([len(d) for d in docs]), np.array([len(t) for t in toks])
    counts: dict[str, int] = {}
    for t in toks:
        for w in t:
            counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.top]
    lines = [f"dataset: {cfg.dataset}", f"documents read: {len(docs)} (--docs {cfg.docs})",
             f"characters/doc: mean {chars.mean():.1f}, median {np.median(chars):.0f}, "
             f"min {chars.min()}, max {chars.max()}",
             f"word-level tokens/doc: mean {ntok.mean():.1f}, median {np.median(ntok):.0f}, "
             f"min {ntok.min()}, max {ntok.max()}; docs with >= 201 tokens: "
             f"{(ntok >= 201).mean():.1%}",
             f"tokens: {ntok.sum()}, distinct: {len(counts)}",
             "top words: " + ", ".join(f"{w} {c}" for w, c in top), "sample document:",
             sample(docs[0], cfg.sample_chars)]
    if cfg.dataset == "builtin":
        lines.append("planted groups (kind: words -> partners):")
        for name, g in builtin_corpus.PLANTED.items():
            lines.append(f"  {name} ({g.kind}): {' '.join(g.words[:8])}"
                         f"{' ...' if len(g.words) > 8 else ''} -> {' '.join(g.partners[:8])}"
                         f"{' ...' if len(g.partners) > 8 else ''}")
    return "\n".join(lines)


def sample(doc: str, limit: int) -> str:
    """The first ``limit`` characters of a document, and a note of what was cut."""
    if len(doc) <= limit:
        return doc
    return f"{doc[:limit]} [... {len(doc) - limit:,} more characters not shown; --sample-chars]"


COMMANDS = {"generate": GenerateConfig, "inspect": InspectConfig}


def main(argv: list[str] | None = None) -> int:
    """`generate` or `inspect` (see --help)."""
    command, cfg = parse_subcommand(COMMANDS, argv, "python -m pythia_probe.corpus",
                                    __doc__)
    if command == "generate":
        check_writable(cfg.out, is_file=True)
        n_tokens = generate(cfg)
        print(f"wrote {cfg.stories} stories, {n_tokens} word-level tokens to {cfg.out}")
    else:
        print(summarise(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.corpus"))
