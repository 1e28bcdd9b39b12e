"""A tokenizer in the format of Pythia's (GPT-NeoX) tokenizer, built offline for tests.

The real one cannot be downloaded here. This one has its structure: a byte-level BPE model
(no unknown token, merges), NFC normalizer, ByteLevel pre-tokenizer without a prefix space,
ByteLevel post-processor and decoder, ``<|endoftext|>`` (id 0) and ``<|padding|>`` (id 1) as
added special tokens, and the same three files on every step branch (tokenizer.json,
tokenizer_config.json with ``GPTNeoXTokenizer``, special_tokens_map.json). Merges are learnt
from the built-in corpus; ``d_vocab`` (50,277 like Pythia's) is reached with vocabulary entries
no merge produces, so encoding is cheap and the id range is Pythia's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

from pythia_probe import builtin_corpus

PYTHIA_D_VOCAB = 50_277
SPECIAL = ("<|endoftext|>", "<|padding|>")
CONFIG = {"add_prefix_space": False, "bos_token": SPECIAL[0], "eos_token": SPECIAL[0],
          "unk_token": SPECIAL[0], "tokenizer_class": "GPTNeoXTokenizer",
          "model_max_length": 2048, "clean_up_tokenization_spaces": True}
SPECIAL_MAP = {"bos_token": SPECIAL[0], "eos_token": SPECIAL[0], "unk_token": SPECIAL[0]}


def pythia_like_backend(d_vocab: int = PYTHIA_D_VOCAB, merges_vocab: int = 2000,
                        n_stories: int = 400) -> Tokenizer:
    """A byte-level BPE with Pythia's pipeline and exactly ``d_vocab`` ids."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=min(merges_vocab, d_vocab), special_tokens=list(SPECIAL),
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=False)
    tok.train_from_iterator((builtin_corpus.story(i, 0) for i in range(n_stories)), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), d_vocab):  # unreachable fillers: no merge builds them
        vocab[f"\u0100fill{i}"] = i
    return Tokenizer.from_str(json.dumps(spec))


def write_pythia_tokenizer(folder: str | Path, backend: Tokenizer | None = None) -> Path:
    """The three tokenizer files of a Pythia step branch, written into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (backend or pythia_like_backend()).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(CONFIG, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIAL_MAP, indent=2))
    return folder
