"""The flags of ``python -m pythia_probe.stats compute|top`` (:class:`StatsFlags`,
:class:`TopFlags`): names, types, defaults and help, and nothing else, so that ``--help``
imports no torch. The validated configurations: :class:`.settings.StatsConfig` and
:class:`.top.TopConfig` (the same fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_GROUPS = 10


@dataclass(frozen=True)
class StatsFlags:
    """Compute Bbar, Phibar, SigmaB, PhiBT, Gbar, Qbar, Delta over a corpus."""

    dataset: str = "builtin"
    """Corpus: 'builtin', a .txt/.jsonl/.parquet path or folder, a hub dataset id, hf:// glob."""
    out: str = "stats.safetensors"
    """Output stats file (safetensors + JSON metadata)."""
    tokenizer: str = "word:3000"
    """Hub id, tokenizer.json / folder, or 'word:K' (paper word rule, top-K words of the data)."""
    seq_len: int = 128
    """T: predicted positions per sequence (windows of T+1 tokens)."""
    docs: int | None = None
    """Use the first N documents with >= min_chars characters (None: all)."""
    min_chars: int = 0
    """Minimum document length in characters (paper, OpenWebText: 512)."""
    mode: Literal["first", "packed"] = "first"
    """'first' (first T+1 tokens per document, the paper) or 'packed' windows."""
    keep_short: bool = False
    """Keep sequences shorter than T+1 tokens (masked) instead of skipping them."""
    oov: Literal["skip", "unk"] = "skip"
    """A document with a token outside the vocabulary (word:K: a word outside the top K):
    'skip' drops it (the paper's rule), 'unk' maps such words to the [UNK] id, which becomes
    the last statistic id (d_vocab K+1). Hub BPE tokenizers have no such tokens."""
    doc_split: Literal["auto", "endoftext", "blank-line", "line", "whole"] = "auto"
    """How a .txt file is cut into documents: 'auto' (<|endoftext|> lines when the file has
    any, else blank lines), 'endoftext', 'blank-line', 'line' (each non-empty line), 'whole'."""
    bos: str | None = None
    """Token prepended to every document (None: nothing; Pythia adds none)."""
    eos: str | None = None
    """Token appended to every document (e.g. '<|endoftext|>' for packed windows)."""
    groups: int = DEFAULT_GROUPS
    """G: documents in G groups (document ordinal mod G), each group's statistics kept for
    CorpusStats.subset / leave_out / halves (jackknife intervals, a ceiling from two halves:
    groups 0..G/2-1 and G/2..G-1); default 10; 0: none."""
    top_k: str | int | None = None
    """'full' (the default: every id of the tokenizer) or K: restrict to the K most frequent
    tokens (composed at full vocabulary, then sliced; --conventions authors: ranked and
    composed as pythia.py does)."""
    conventions: Literal["paper", "authors"] = "paper"
    """'paper' (the spec's definitions, as always) or 'authors' (exactly what the authors'
    pythia.py computes: BOS first and the documents' first T tokens zero-padded with the last
    target 0, the model's d_vocab, their top-K rule, compositions over the kept ids; with
    word:K only their word ranking, ties in first-seen order). See stats/conventions.py."""
    d_vocab: int | None = None
    """Statistics' vocabulary side and centring 1/V (default: the tokenizer's ids; with
    --conventions authors the vocab_size of the tokenizer's model config.json, e.g. Pythia's
    50,304 embedding rows, when there is one). Ids beyond the tokenizer's have empty rows."""
    device: str = "cpu"
    """torch device for counting and compositions ('cuda' uses this rank's GPU)."""
    batch_size: int = 256
    """Sequences per update."""
    checkpoint_every: int = 1
    """Save the accumulators every N shards (resume skips finished shards)."""
    work_dir: str | None = None
    """Checkpoints and token caches (default: <out>.work)."""
    text_field: str = "text"
    """Text column of jsonl/parquet/hub corpora."""
    split: str = "train"
    """Hub dataset split."""
    stories: int = 20000
    """Builtin corpus: number of stories."""
    stories_per_shard: int = 1000
    """Builtin corpus: stories per shard."""
    budget_gb: float | None = None
    """Memory budget for matmul tiles (GiB; default: 1 on CPU, a quarter of free GPU memory)."""
    engine: Literal["auto", "dense", "sparse"] = "auto"
    """'dense' (V x V counts), 'sparse' (counts where the corpus has them, out-of-core Gbar
    tiles, CPU) or 'auto': dense when its memory plan fits the device, else sparse."""
    progress: bool = True
    """Show progress bars (tokens/s)."""
    keep_work: bool = False
    """Keep the work folder (checkpoints, token caches) after a successful run."""


@dataclass(frozen=True)
class TopFlags:
    """List the top associated tokens of each row of Bbar, SigmaB and Phibar (Figure 5)."""

    stats: str
    """Path of a stats .safetensors file."""
    matrices: tuple[str, ...] = ("Bbar", "SigmaB", "Phibar")
    """Matrices to list (Figure 5: Bbar, SigmaB, Phibar)."""
    rows: tuple[str, ...] = ()
    """Row tokens: as shown in the table (a leading space shown as ␣: ␣the is " the"), the
    token's text itself (" the"), the tokenizer's own string (Ġthe), or an integer id;
    default: the most frequent."""
    n_rows: int = 10
    """Rows listed when --rows is not given (the most frequent tokens)."""
    k: int = 5
    """Entries per row."""
    tokenizer: str | None = None
    """Tokenizer to name tokens (default: the one saved next to / recorded in the stats)."""
    keep_self: bool = False
    """Keep the row's own token among its top entries (default: excluded)."""
