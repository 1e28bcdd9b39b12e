"""Every file the tool writes goes through pythia_probe/fileio.py (issue 17 item 2).

The one writer, :func:`pythia_probe.fileio.atomic_write`, hands its ``write`` callback a temporary
path named ``tmp`` beside the destination (renamed when complete: atomic, umask honoured, no
symlink followed). So the rule a scan can check: every call that writes a file (``open`` in a
write mode, ``Path.write_text/write_bytes``, ``torch.save``, ``save_file``, ``to_parquet``,
``to_csv``, ``savefig``, ``np.save``) writes to the name ``tmp`` (or ``str(tmp)``), and only
fileio.py itself touches a real destination. pythia_probe/testing/ builds loopback-hub fixtures
for the tests and is not used by the tool (test_imports keeps it out of the tool's layers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pythia_probe"
EXEMPT = {PKG / "fileio.py"}
EXEMPT_DIRS = {PKG / "testing"}
# method or function names that write their first argument (or the object they are called on)
WRITERS_FIRST_ARG = {"save", "save_file", "to_parquet", "to_csv", "savefig", "write_table"}
WRITERS_ON_SELF = {"write_text", "write_bytes"}
WRITE_MODES = set("wax+")


def _is_tmp(node: ast.AST) -> bool:
    """``tmp``, ``str(tmp)``, ``os.fspath(tmp)``, ``tmp / "x"`` are all the writer's temp path."""
    if isinstance(node, ast.Name):
        return node.id in {"tmp", "buf"}  # buf: an in-memory io.StringIO/BytesIO
    if isinstance(node, ast.Call) and len(node.args) == 1:
        return _is_tmp(node.args[0])
    if isinstance(node, ast.BinOp):
        return _is_tmp(node.left)
    return False


def _open_mode(call: ast.Call) -> str | None:
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else None


def bypasses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) for each file write not aimed at the atomic writer's ``tmp``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) \
            else None
        if name == "open" and isinstance(fn, ast.Name):
            mode = _open_mode(node)
            if mode and WRITE_MODES & set(mode) and not _is_tmp(node.args[0]):
                found.append((node.lineno, f"open(..., {mode!r})"))
        elif name in WRITERS_FIRST_ARG and isinstance(fn, ast.Attribute | ast.Name):
            target = node.args[1] if name == "save" and len(node.args) > 1 else \
                node.args[0] if node.args else None
            if name == "save" and not (isinstance(fn, ast.Attribute)
                                       and isinstance(fn.value, ast.Name)
                                       and fn.value.id in {"torch", "np", "numpy"}):
                continue
            if name in {"save_file", "write_table"} and len(node.args) > 1:
                target = node.args[1]
            if target is not None and not _is_tmp(target):
                found.append((node.lineno, name))
        elif name in WRITERS_ON_SELF and isinstance(fn, ast.Attribute):
            if not _is_tmp(fn.value):
                found.append((node.lineno, name))
    return found


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        if path in EXEMPT or any(d in path.parents for d in EXEMPT_DIRS):
            continue
        yield path


def test_every_write_goes_through_fileio():
    bad = [f"{p.relative_to(PKG.parent)}:{line}: {call}"
           for p in _modules() for line, call in bypasses(ast.parse(p.read_text()))]
    assert not bad, "writes that bypass pythia_probe.fileio:\n" + "\n".join(bad)


@pytest.mark.parametrize("src, n", [
    ("open(path, 'w')", 1),
    ("open(tmp, 'wb')", 0),
    ("open(path)", 0),
    ("open(path, mode='a')", 1),
    ("Path(out).write_text('x')", 1),
    ("tmp.write_bytes(b'')", 0),
    ("torch.save(sd, path)", 1),
    ("torch.save(sd, tmp)", 0),
    ("save_file(t, str(path))", 1),
    ("save_file(t, str(tmp), metadata=m)", 0),
    ("df.to_parquet(out / 'r.parquet')", 1),
    ("df.to_parquet(tmp, index=False)", 0),
    ("fig.savefig(path, dpi=110)", 1),
    ("fig.savefig(tmp, format='png')", 0),
    ("model.save(x)", 0),
    ("pq.write_table(table, path)", 1),
    ("pq.write_table(table, tmp)", 0),
    ("table.to_csv(buf, index=False)", 0),
])
def test_the_scan_sees_a_bypass(src, n):
    """The scan itself: each kind of write is caught unless it targets ``tmp``."""
    assert len(bypasses(ast.parse(src))) == n


DELETERS = {"unlink", "rmdir", "rmtree", "removedirs"}  # and os.remove


def deletes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) for each delete of a file or folder (``TemporaryDirectory.cleanup`` of a
    scratch folder the tool made is not one of these)."""
    found = []
    for node in ast.walk(tree):
        fn = node.func if isinstance(node, ast.Call) else None
        if isinstance(fn, ast.Attribute) and (fn.attr in DELETERS or (
                fn.attr == "remove" and isinstance(fn.value, ast.Name) and fn.value.id == "os")):
            found.append((node.lineno, fn.attr))
    return found


def test_every_delete_goes_through_fileio_remove():
    """The one deleting function (issue 29): :func:`pythia_probe.fileio.remove`, which refuses
    paths outside the caller's folders and, given a proof, files the tool did not write."""
    bad = [f"{p.relative_to(PKG.parent)}:{line}: {call}"
           for p in _modules() for line, call in deletes(ast.parse(p.read_text()))]
    assert not bad, "deletes that bypass pythia_probe.fileio.remove:\n" + "\n".join(bad)
    assert deletes(ast.parse("p.unlink(); os.remove(x); shutil.rmtree(d); d.rmdir(); "
                             "x.remove(1); fileio.remove(p, [o])")) == [
        (1, "unlink"), (1, "remove"), (1, "rmtree"), (1, "rmdir")]
