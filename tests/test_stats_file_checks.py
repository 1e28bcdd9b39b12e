"""Issue 28 item 6: a factored statistics file is checked against its header before any use
(its counts and shapes from the header alone: read_meta, what the sweep reads before it decides
on intervals), and the compiled kernels are loaded only after a check of the file.

Each fault is planted in a copy of a good file with the digests updated (so only the
consistency check can catch it); loading it, and the real command reading it, give one
"corrupt ... recompute" line (exit 2), never an IndexError or ValueError, and never statistics
that silently lost their groups. The good file still loads to the same numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pythia_probe.cli import run_main
from pythia_probe.errors import CorruptFileError, KernelError
from pythia_probe.stats import CorpusStats, batch_stats, native, read_meta
from pythia_probe.stats.__main__ import main
from pythia_probe.stats.native import fastcount, sparsecount
from pythia_probe.stats.result import _sha

pytestmark = pytest.mark.usefixtures("one_thread")
V, G = 12, 10


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    st = batch_stats(torch.randint(0, V, (30, 7)), V, engine="sparse", groups=G)
    return st.save(tmp_path_factory.mktemp("good") / "s.safetensors")


def planted(good: Path, tmp: Path, edit) -> Path:
    """A copy of ``good`` with ``edit(tensors, meta)`` applied and every digest updated."""
    with safe_open(str(good), framework="pt") as f:
        meta = json.loads(f.metadata()["pythia_probe"])
        t = {k: f.get_tensor(k) for k in f.keys()}
    edit(t, meta)
    meta["sha256"] = {k: _sha(v.contiguous()) for k, v in t.items()}
    out = tmp / "bad.safetensors"
    save_file({k: v.contiguous() for k, v in t.items()}, str(out),
              {"pythia_probe": json.dumps(meta)})
    return out


def _set_g(t, meta):
    meta["groups"]["G"] = 1


def _drop_counts(t, meta):
    meta["groups"]["counts"] = meta["groups"]["counts"][:3]


def _vocab(t, meta):
    meta["layout"]["d_vocab"] = meta["full_d_vocab"] = meta["d_vocab"] = V + 5


def _header_vocab(t, meta):
    meta["d_vocab"] = V - 1


def _indptr(t, meta):
    t["qbar_indptr"][-1] += 7


def _group_indptr(t, meta):
    t["group.3.qbar_indptr"][-2:] += 4


def _short_counts(t, meta):
    t["token_counts"] = t["token_counts"][:-1]


FAULTS = {  # name: (edit, what the line says)
    "header G=1, 10 groups stored": (_set_g, r"header says G=1, .* 10 groups stored"),
    "3 group counts for 10 groups": (_drop_counts, r"3 group counts, 10 groups stored"),
    "d_vocab of the layout": (_vocab, r"tensor token_counts has shape \(12,\), the header "
                                      r"implies \(17,\)"),
    "d_vocab of the header": (_header_vocab, r"header says 11, the layout 12"),
    "indptr claims more entries": (_indptr, r"qbar_indptr claims \d+ entries .* \d+ stored"),
    "a group's indptr": (_group_indptr, r"group\.3\.qbar_indptr claims"),
    "token counts cut": (_short_counts, r"tensor token_counts has shape \(11,\)"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_header_that_disagrees_with_its_tensors_is_one_line(fault, good, tmp_path, capsys):
    edit, said = FAULTS[fault]
    bad = planted(good, tmp_path, edit)
    with pytest.raises(CorruptFileError, match=said) as e:
        CorpusStats.load(bad)
    line = str(e.value)
    assert "\n" not in line and str(bad) in line and "corrupt" in line
    assert "recompute it with `python -m pythia_probe.stats compute" in line
    if "indptr" not in fault:  # counts and shapes: caught from the header alone
        with pytest.raises(CorruptFileError, match=said):
            read_meta(bad)
    code = run_main(lambda: main(["top", "--stats", str(bad), "--rows", "0"]), "stats")
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "corrupt" in err[0], err


def test_the_good_file_and_an_untouched_copy_load_to_the_same_numbers(good, tmp_path):
    same = CorpusStats.load(planted(good, tmp_path, lambda t, meta: None))
    st = CorpusStats.load(good)
    assert same.groups == st.groups == G
    for name in ("Bbar", "Phibar", "Qbar", "Delta"):
        assert torch.equal(same[name], st[name])
        assert torch.equal(same.leave_out(3)[name], st.leave_out(3)[name])


# -- the compiled kernels ------------------------------------------------------------------------
def _truncate(src: Path, dst: Path) -> None:
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])


def _swap(src: Path, dst: Path) -> None:
    other = {"_fastcount": "_sparsecount", "_sparsecount": "_fastcount"}[src.name.split(".")[0]]
    dst.write_bytes(native.library_path(other).read_bytes())


def _fresh_kernels() -> None:
    for lib in (fastcount._lib, sparsecount._lib, native.log_fallback):
        lib.cache_clear()
    native.REFUSED.clear()


@pytest.fixture
def kernels_at(monkeypatch):
    """Point the loader at a folder of planted copies; the real kernels again afterwards."""
    def plant(folder: Path, fault) -> None:
        for stem in (fastcount.STEM, sparsecount.STEM):
            src = native.library_path(stem)
            fault(src, folder / src.name)
        monkeypatch.setattr(native, "DIR", folder)
        _fresh_kernels()
    yield plant
    monkeypatch.undo()
    _fresh_kernels()


@pytest.mark.parametrize(("fault", "said"), [(_truncate, r"is truncated \(\d+ bytes, its "
                                                         r"headers need \d+\)"),
                                             (_swap, r"has no (fc|sc)_abi_version")])
def test_a_broken_kernel_library_falls_back_with_one_warning(fault, said, kernels_at, tmp_path,
                                                             capsys):
    """A truncated .so (SIGBUS once mapped) or the two libraries swapped (undefined symbol):
    never loaded; the statistics command runs on the torch kernels with one warning per
    library and gives the clean run's numbers."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"the cat {w} on the mat by the {v} dog" for w, v in
                                  zip("abcdefgh", "ijklmnop", strict=True)))
    args = ["compute", "--dataset", str(corpus), "--tokenizer", "word:20", "--seq-len", "6",
            "--groups", "0", "--no-progress", "--engine", "auto"]
    assert main([*args, "--out", str(tmp_path / "clean.safetensors")]) == 0
    (tmp_path / "lib").mkdir()
    kernels_at(tmp_path / "lib", fault)
    capsys.readouterr()
    code = run_main(lambda: main([*args, "--out", str(tmp_path / "s.safetensors")]), "stats")
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [ln for ln in err.splitlines() if "WARNING" in ln]
    assert len(warned) == 1 and "the C kernel _fastcount at" in warned[0], warned
    assert all(re.search(said, w) and str(tmp_path / "lib") in w for w in warned), warned
    assert fastcount.info()["backend"] == "torch" and not sparsecount.available()
    clean, got = (CorpusStats.load(tmp_path / n) for n in ("clean.safetensors", "s.safetensors"))
    assert got.meta["kernel"]["backend"] == "torch"
    for name in ("Bbar", "Phibar", "Qbar", "Delta"):
        assert torch.equal(got[name], clean[name]), name
    with pytest.raises(KernelError, match=said.replace("(fc|sc)", "sc")
                       if fault is _swap else said):
        sparsecount.require()
