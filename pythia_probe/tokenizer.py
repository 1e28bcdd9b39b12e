"""Tokenizers behind one interface: a Hugging Face `PreTrainedTokenizerFast`.

Two kinds:
- the leading-terms paper's word-level rule (`build_word_tokenizer`), stored as a standard
  tokenizer.json (normalizer + pre-tokenizer + WordLevel model) that `PreTrainedTokenizerFast`
  and `AutoTokenizer` load without this package;
- any hub tokenizer (e.g. the Pythia BPE, "EleutherAI/pythia-1.4b") through `AutoTokenizer`.

The word rule (spec leading-terms section 4), exactly as implemented:
1. Unicode NFC, then lower-case character by character (so "É" -> "é", a decomposed "e"+U+0301
   becomes one letter "é"; Greek final sigma is not special-cased).
2. Split on Unicode White_Space (spaces, tabs, newlines, no-break spaces): whitespace is dropped.
3. A "letter" is any code point of Unicode general category L (Lu, Ll, Lt, Lm, Lo), per the
   Unicode tables of the tokenizers library (which may be newer than Python's unicodedata):
   "é", "ß", "ж", "中" are letters. A maximal run of letters is one token. Every other
   character is its own token: digits one by one ("2023" -> 2 0 2 3), punctuation one by one
   ("..." -> . . .), the apostrophe too ("don't" -> don ' t; the curly ’ likewise), as are "_"
   and combining marks that NFC cannot compose.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from huggingface_hub import hf_hub_download
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pythia_probe.errors import BadInputError, HubError, MissingFileError
from pythia_probe.fileio import atomic_write
from pythia_probe.hub import io as hubio

UNK = "[UNK]"
WORD_PATTERN = r"\p{L}+|."


def word_normalizer() -> normalizers.Normalizer:
    """NFC then per-character lower-case (step 1 of the word rule)."""
    return normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])


def word_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Drop whitespace, keep letter runs whole, every other character alone (steps 2-3)."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
    ])


def word_tokens(text: str) -> list[str]:
    """The word rule applied to one string: the list of token strings."""
    norm = word_normalizer().normalize_str(text)
    return [piece for piece, _ in word_pre_tokenizer().pre_tokenize_str(norm)]


# ASCII fast path: NFC is a no-op, the letters are a-z after lower-casing, and the ASCII
# White_Space characters are exactly these six (\x1c-\x1f are not White_Space).
_ASCII_RULE = re.compile(r"[a-z]+|[^ \t\n\v\f\r]")


def _count_words(docs: Iterable[str]) -> tuple[Counter, int]:
    norm, pre = word_normalizer(), word_pre_tokenizer()
    counts: Counter = Counter()
    n_docs = 0
    for doc in docs:
        if doc.isascii():
            counts.update(_ASCII_RULE.findall(doc.lower()))
        else:
            counts.update(piece for piece, _ in pre.pre_tokenize_str(norm.normalize_str(doc)))
        n_docs += 1
    return counts, n_docs


def word_tokenizer_from_vocab(words: list[str], name: str = "word-level") -> \
        PreTrainedTokenizerFast:
    """Word-rule tokenizer whose ids are words[0..k-1] in order, then "[UNK]" = k."""
    if len(set(words)) != len(words) or UNK in words:
        raise BadInputError(f"vocabulary words must be distinct and must not contain {UNK!r}")
    vocab = {w: i for i, w in enumerate(words)} | {UNK: len(words)}
    backend = Tokenizer(WordLevel(vocab, unk_token=UNK))
    backend.normalizer = word_normalizer()
    backend.pre_tokenizer = word_pre_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=UNK)
    tok.name_or_path = name
    return tok


WORD_TIES = ("string", "first_seen")


def build_word_tokenizer(docs: Iterable[str], vocab_size: int,
                         ties: str = "string") -> PreTrainedTokenizerFast:
    """The paper's word-level tokenizer built from `docs` with a top-k vocabulary.

    The k = min(vocab_size, number of distinct tokens) most frequent tokens get ids 0..k-1 in
    descending frequency, and "[UNK]" gets id k. Ties: ``"string"`` (by the token string, the
    default) or ``"first_seen"`` (in the order the tokens first appear in `docs`, as the
    authors' tiny-tokenize-natural.py ranks them with Counter.most_common).
    """
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise BadInputError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    if ties not in WORD_TIES:
        raise BadInputError(f"word tokenizer ties {ties!r}; valid: {', '.join(WORD_TIES)}")
    counts, n_docs = _count_words(docs)
    if not counts:
        raise BadInputError(f"cannot build a vocabulary from an empty corpus ({n_docs} documents, "
                            "0 tokens): give at least one non-blank document")
    ranked = (counts.most_common() if ties == "first_seen" else  # a stable sort by count
              sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    words = [w for w, _ in ranked[:vocab_size] if w != UNK]
    return word_tokenizer_from_vocab(words, name=f"word-level-top{len(words)}")


def _rule_json() -> tuple[str, str]:
    t = Tokenizer(WordLevel({UNK: 0}, unk_token=UNK))
    t.normalizer, t.pre_tokenizer = word_normalizer(), word_pre_tokenizer()
    spec = json.loads(t.to_str())
    return json.dumps(spec["normalizer"]), json.dumps(spec["pre_tokenizer"])


def is_word_tokenizer(tok: PreTrainedTokenizerFast) -> bool:
    """True for a word-rule tokenizer: the word rule's normalizer and pre-tokenizer, and a
    WordLevel model whose last id is "[UNK]"."""
    backend = tok.backend_tokenizer
    model = backend.model
    if not isinstance(model, WordLevel) or model.unk_token != UNK:
        return False
    if model.token_to_id(UNK) != backend.get_vocab_size(False) - 1:
        return False
    spec = json.loads(backend.to_str())
    return (json.dumps(spec["normalizer"]), json.dumps(spec["pre_tokenizer"])) == _rule_json()


def d_vocab(tok: PreTrainedTokenizerFast) -> int:
    """Number of ids a statistic indexes: k for a word tokenizer ("[UNK]" = k is outside),
    len(tok) for a hub tokenizer (50277 for Pythia; the model's padded rows are excluded)."""
    if is_word_tokenizer(tok):
        return tok.backend_tokenizer.model.token_to_id(UNK)
    return len(tok)


def encode_documents(tok: PreTrainedTokenizerFast, docs: Iterable[str], drop_oov: bool = False,
                     batch_size: int = 512) -> Iterator[list[int]]:
    """Token ids of each document, in order, without special tokens (no BOS/EOS added).

    drop_oov: skip documents containing an out-of-vocabulary token (for a word tokenizer, the
    "[UNK]" id k = d_vocab(tok)); as in the paper, which keeps only in-vocabulary stories.
    With drop_oov=False, OOV tokens are kept as id k, one past the statistics' range.
    A hub BPE tokenizer has no OOV tokens, so drop_oov changes nothing for it.
    Word tokenizers encode ASCII documents with an equivalent regex fast path (tested equal).
    """
    if is_word_tokenizer(tok):
        yield from _encode_words(tok, docs, drop_oov)
        return
    backend = tok.backend_tokenizer
    it = iter(docs)
    while batch := list(islice(it, batch_size)):
        for enc in backend.encode_batch_fast(batch, add_special_tokens=False):
            yield enc.ids


def _encode_words(tok: PreTrainedTokenizerFast, docs: Iterable[str],
                  drop_oov: bool) -> Iterator[list[int]]:
    backend = tok.backend_tokenizer
    vocab, unk = backend.get_vocab(with_added_tokens=False), d_vocab(tok)
    for doc in docs:
        if doc.isascii() and UNK not in doc:  # a literal "[UNK]" is the special token
            ids = [vocab.get(w, unk) for w in _ASCII_RULE.findall(doc.lower())]
        else:
            ids = backend.encode(doc, add_special_tokens=False).ids
        if not (drop_oov and unk in ids):
            yield ids


FINGERPRINT_SCHEME = "ids/1"


def canonical_form(tok: PreTrainedTokenizerFast) -> dict:
    """Everything that decides the ids a text gets (special tokens never added): the model
    (vocabulary, merges, unknown token, subword affixes), normalizer, pre-tokenizer and added
    tokens with their matching flags. Post-processor, decoder, padding, truncation and the
    "special" flag are left out, as are spellings of the same setting (None vs "" affixes,
    merges as "a b" or ["a", "b"]) that transformers changes when it re-saves a tokenizer."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    model = dict(spec["model"])
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if key in model:
            model[key] = model[key] or ""
    if "merges" in model:
        model["merges"] = [m.split(" ", 1) if isinstance(m, str) else list(m)
                           for m in model["merges"]]
    added = sorted([t["id"], t["content"], t.get("single_word"), t.get("lstrip"),
                    t.get("rstrip"), t.get("normalized")] for t in spec.get("added_tokens") or [])
    return {"model": model, "normalizer": spec.get("normalizer"),
            "pre_tokenizer": spec.get("pre_tokenizer"), "added_tokens": added}


def tokenizer_fingerprint(tok: PreTrainedTokenizerFast) -> dict:
    """{"name", "sha256" (of :func:`canonical_form`), "d_vocab", "scheme"}: identifies
    statistics. The same for a tokenizer.json, the model folder holding it and its hub id."""
    canonical = json.dumps(canonical_form(tok), sort_keys=True, ensure_ascii=False)
    return {"name": tok.name_or_path or "unnamed",
            "sha256": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
            "d_vocab": d_vocab(tok), "scheme": FINGERPRINT_SCHEME}


def model_vocab_size(name_or_path: str | Path) -> tuple[int | None, str | None]:
    """(vocab_size, where it was read) of the model config.json beside a tokenizer: in its
    folder (a tokenizer.json file's folder), or its hub repository; (None, None) when there is
    none. This is the model's embedding rows (Pythia: 50,304), which may exceed the
    tokenizer's ids (50,277)."""
    path = Path(name_or_path)
    if path.exists():
        found = (path.parent if path.is_file() else path) / "config.json"
        if not found.is_file():
            return None, None
        return _vocab_size(found.read_text(), str(found)), str(found)
    name = str(name_or_path)
    try:
        local = hubio.call(lambda: hf_hub_download(name, "config.json"),
                           f"config.json of {name}",
                           hint="give --d-vocab (the model's embedding rows) instead")
    except MissingFileError:
        return None, None
    return _vocab_size(Path(local).read_text(), f"{name}/config.json"), f"{name}/config.json"


def _vocab_size(text: str, where: str) -> int:
    try:
        value = json.loads(text).get("vocab_size")
    except (json.JSONDecodeError, AttributeError) as e:
        raise BadInputError(f"{where} is not a JSON object ({e}); give --d-vocab instead") from e
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadInputError(f"{where} has no integer vocab_size >= 1 (got {value!r}); give "
                            "--d-vocab (the model's embedding rows) instead")
    return value


def save_tokenizer(tok: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """Save as a standard tokenizer: `path` ending in .json -> that tokenizer.json file;
    otherwise a folder (save_pretrained: tokenizer.json + tokenizer_config.json). Every file
    goes through the one atomic writer (the user's umask, never through a symlink)."""
    path = Path(path)
    if path.suffix == ".json":
        data = tok.backend_tokenizer.to_str(pretty=True).encode("utf-8")
        atomic_write(path, lambda tmp: tmp.write_bytes(data), len(data))
        return path
    with tempfile.TemporaryDirectory() as staged:
        tok.save_pretrained(staged)
        for f in sorted(Path(staged).iterdir()):
            atomic_write(path / f.name, lambda tmp, f=f: shutil.copyfile(f, tmp))
    return path


def _from_json_file(path: Path) -> PreTrainedTokenizerFast:
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise BadInputError(f"{path} is not a valid tokenizer.json ({e}); expected a file written "
                            "by tokenizers/transformers, e.g. by save_tokenizer") from e
    unk = getattr(backend.model, "unk_token", None)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unk)
    tok.name_or_path = str(path)
    return tok


def load_tokenizer(name_or_path: str | Path, revision: str | None = None) -> \
        PreTrainedTokenizerFast:
    """A tokenizer from a tokenizer.json file, a saved folder, or a hub id (AutoTokenizer).

    Hub ids are loaded with trust_remote_code=False; `revision` picks a branch (e.g. "step1000").
    """
    path = Path(name_or_path)
    if path.is_file():
        return _from_json_file(path)
    if path.is_dir():
        if (path / "tokenizer_config.json").is_file():
            return _check_fast(AutoTokenizer.from_pretrained(str(path)), str(path))
        if (path / "tokenizer.json").is_file():
            return _from_json_file(path / "tokenizer.json")
        raise MissingFileError(f"folder {path} has no tokenizer.json or tokenizer_config.json")
    name = str(name_or_path)
    if name.endswith(".json") or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise MissingFileError(f"tokenizer file or folder {name!r} does not exist; expected a "
                               "tokenizer.json, a saved folder, or a hub id like "
                               "'EleutherAI/pythia-1.4b'")
    try:
        tok = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=False)
    except OSError as e:
        raise HubError(f"could not load tokenizer {name!r} from the hub or its cache ({e}); "
                       "give a hub id, a tokenizer.json path or a saved folder") from e
    return _check_fast(tok, name)


def _check_fast(tok, name: str) -> PreTrainedTokenizerFast:
    if not isinstance(tok, PreTrainedTokenizerFast):
        raise BadInputError(f"{name!r} loaded as {type(tok).__name__}, not a tokenizers-backed "
                            "(fast) tokenizer; only tokenizer.json-backed tokenizers are supported")
    return tok
