"""Tokenizer identity: one fingerprint however a tokenizer was loaded (its tokenizer.json, the
model folder, the hub id), and a different one for any tokenizer that maps text differently."""

import json
import shutil

import pytest

from pythia_probe.stats.result import check_tokenizer
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import HubServer
from pythia_probe.testing.tokenizers import pythia_like_backend, write_pythia_tokenizer
from pythia_probe.tokenizer import load_tokenizer, tokenizer_fingerprint

TEXTS = ["Once upon a time, the red ball rolled  into the pond.", " leading space",
         "<|endoftext|>The end.\n\nA new story: Tom's dog ran 42 miles!"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_pythia_tokenizer(tmp_path_factory.mktemp("tok") / "model",
                                  pythia_like_backend(d_vocab=3000))


def _fp(tok):
    return tokenizer_fingerprint(tok)["sha256"]


def test_file_folder_and_hub_id_give_one_fingerprint(folder, tmp_path):
    from_file = load_tokenizer(folder / "tokenizer.json")
    from_folder = load_tokenizer(folder)  # transformers' GPTNeoXTokenizer re-saves the JSON
    assert json.loads(from_file.backend_tokenizer.to_str()) != json.loads(
        from_folder.backend_tokenizer.to_str())  # the case that used to be refused
    hub = tmp_path / "hub" / "EleutherAI" / "tok-test" / "main"
    shutil.copytree(folder, hub)
    with HubServer(tmp_path / "hub") as server, use_endpoint(server.endpoint):
        from_hub = load_tokenizer("EleutherAI/tok-test")
    assert _fp(from_file) == _fp(from_folder) == _fp(from_hub)
    for text in TEXTS:
        ids = from_file(text, add_special_tokens=False)["input_ids"]
        assert ids == from_folder(text, add_special_tokens=False)["input_ids"]
        assert ids == from_hub(text, add_special_tokens=False)["input_ids"]
    check_tokenizer({"tokenizer": tokenizer_fingerprint(from_file)},
                    tokenizer_fingerprint(from_folder))


def _edited(folder, tmp_path, edit):
    spec = json.loads((folder / "tokenizer.json").read_text())
    edit(spec)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(spec))
    return load_tokenizer(path)


def _drop_a_used_merge(spec):
    spec["model"]["merges"] = spec["model"]["merges"][1:]


def _prefix_space(spec):
    spec["pre_tokenizer"]["add_prefix_space"] = True


def _swap_two_ids(spec):
    vocab = spec["model"]["vocab"]
    a, b = "Ġthe", "Ġa"
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _lowercase(spec):
    spec["normalizer"] = {"type": "Sequence", "normalizers": [spec["normalizer"],
                                                             {"type": "Lowercase"}]}


def _added_token_not_special_matched(spec):
    spec["added_tokens"][0]["content"] = "<|end|>"


@pytest.mark.parametrize("edit", [_drop_a_used_merge, _prefix_space, _swap_two_ids, _lowercase,
                                  _added_token_not_special_matched])
def test_a_tokenizer_that_maps_text_differently_is_refused(folder, tmp_path, edit):
    from pythia_probe.errors import MismatchError

    base = load_tokenizer(folder / "tokenizer.json")
    other = _edited(folder, tmp_path, edit)
    assert any(base(t, add_special_tokens=False)["input_ids"] != other(
        t, add_special_tokens=False)["input_ids"] for t in TEXTS)  # really maps text otherwise
    assert _fp(other) != _fp(base)
    with pytest.raises(MismatchError, match="sha256"):
        check_tokenizer({"tokenizer": tokenizer_fingerprint(base)}, tokenizer_fingerprint(other))


def _decoder_and_post_processor(spec):
    spec["post_processor"] = None
    spec["decoder"] = None


def _merges_as_strings(spec):
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                               for m in spec["model"]["merges"]]


@pytest.mark.parametrize("edit", [_decoder_and_post_processor, _merges_as_strings])
def test_settings_that_do_not_change_ids_keep_the_fingerprint(folder, tmp_path, edit):
    base = load_tokenizer(folder / "tokenizer.json")
    other = _edited(folder, tmp_path, edit)
    assert _fp(other) == _fp(base)


def test_statistics_from_an_older_fingerprint_scheme_are_refused(folder):
    from pythia_probe.errors import MismatchError

    fp = tokenizer_fingerprint(load_tokenizer(folder))
    old = {k: v for k, v in fp.items() if k != "scheme"}
    with pytest.raises(MismatchError, match="older form"):
        check_tokenizer({"tokenizer": old}, fp)
