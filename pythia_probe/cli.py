"""The one command idiom: a frozen config dataclass whose documented fields are the flags, and
one handler that turns user errors into a single line.

- :func:`config_parser` builds an ``argparse`` parser from a dataclass: ``--field-name`` per
  field, its help from the attribute docstring under the field, its type from the annotation
  (``int``, ``float``, ``str``, ``X | None``, ``bool`` as ``--flag`` or ``--no-flag``,
  ``Literal`` as choices, ``tuple[T, ...]`` as a comma-separated list). A project helper rather than
  transformers' HfArgumentParser (underscored flags, no tuples, ``--flag [FLAG]`` booleans) or
  tyro (a new dependency for ~60 lines).
- :func:`parse_config` parses ``argv`` into the dataclass; ``__post_init__`` validates and
  raises :class:`~pythia_probe.errors.BadInputError` naming the flag and what is valid.
- :func:`run_main`: a :class:`~pythia_probe.errors.UserError` (bad input, corrupt or missing
  file, full disk, unreachable hub, missing device) and an operating-system error about a named
  file print as ``prog: error: ...`` with exit code 2; anything else is a bug and keeps its
  traceback (exit 1). PYTHIA_PROBE_TRACEBACK=1 shows the traceback of user errors as well.
  SIGINT and SIGTERM stop the command with ``prog: interrupted, rerun to resume`` and the
  conventional exit code 128 + signal (130, 143); what was written stays.
- Every parser shows each flag's default in ``--help``, has ``--version`` and ``--log-level``,
  and names itself as it was invoked (:func:`invoked_as`: ``pythia-probe sweep`` or ``python -m
  pythia_probe.sweep``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import contextvars
import dataclasses
import inspect
import os
import signal
import sys
import textwrap
import threading
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from pythia_probe import __version__, logs
from pythia_probe.errors import BadInputError, Interrupted, user_message

_PROG: contextvars.ContextVar[str | None] = contextvars.ContextVar("pythia_probe_prog",
                                                                   default=None)


@contextlib.contextmanager
def invoked_as(prog: str) -> Iterator[None]:
    """Parsers built inside name themselves ``prog`` (the console script's ``pythia-probe X``)."""
    token = _PROG.set(prog)
    try:
        yield
    finally:
        _PROG.reset(token)


def prog_name(default: str) -> str:
    """The name the running command was invoked by (:func:`invoked_as`), else ``default``."""
    return _PROG.get() or default


#: ``ast.parse`` is not safe to call from two threads at once on CPython 3.11 (``SystemError: AST
#: constructor recursion depth mismatch``): two sweeps in one process parse their configs here
_PARSE_LOCK = threading.Lock()
_FIELD_DOCS: dict[type, dict[str, str]] = {}


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string right under each field), base classes
    first; parsed once per class, under a lock."""
    with _PARSE_LOCK:
        if cls not in _FIELD_DOCS:
            _FIELD_DOCS[cls] = _parse_field_docs(cls)
        return dict(_FIELD_DOCS[cls])


def _parse_field_docs(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:], strict=False):
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and \
                    isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                out[a.target.id] = " ".join(str(b.value.value).split())
    return out


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def dest(f: dataclasses.Field) -> str:
    """A field's name on the command line (``metadata={"flag": ...}`` renames it, e.g. the
    ``seed`` of one of several configs parsed together)."""
    return f.metadata.get("flag", f.name)


def _csv(kind: type):
    def parse(text: str) -> tuple:
        return tuple(kind(p.strip()) for p in text.split(",") if p.strip())
    parse.__name__ = f"comma-separated {kind.__name__}"  # argparse names it in errors
    return parse


def _shown(default: Any) -> str:
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def _with_default(help: str | None, default: Any) -> str:
    """The field's doc (escaped for argparse) with its default, unless the doc says it."""
    text = (help or "").replace("%", "%%")
    if "default" in text:
        return text
    return f"{text} (default: {_shown(default).replace('%', '%%')})".strip()


def _add(p: argparse.ArgumentParser, f: dataclasses.Field, hint: Any, help: str | None) -> None:
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    default = None if required else (
        f.default if f.default is not dataclasses.MISSING else f.default_factory())
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    kw: dict[str, Any] = {"default": default, "help": _with_default(help, default)}
    if hint is bool:  # --flag for a default-off switch, --flag/--no-flag for a default-on one
        kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
    elif typing.get_origin(hint) is Literal:
        kw.update(choices=list(args), type=type(args[0]))
    elif typing.get_origin(hint) is tuple:
        kw.update(type=_csv(args[0]), metavar="A,B,...")
    else:
        kw["type"] = hint
    if required:
        kw.pop("default")
        kw["required"] = True
        kw["help"] = (help or "").replace("%", "%%")
    p.add_argument(flag(dest(f)), dest=dest(f), **kw)


def config_parser(cls: type, prog: str, description: str | None = None,
                  parser: argparse.ArgumentParser | None = None,
                  group: bool = False) -> argparse.ArgumentParser:
    """An argparse parser with one flag per field of the dataclass ``cls`` (fields whose
    metadata has ``cli=False`` are left out); ``group``: under a heading with the class doc."""
    p = parser or argparse.ArgumentParser(
        prog=prog_name(prog), description=description or inspect.getdoc(cls),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_argument_group(cls.__name__, inspect.getdoc(cls)) if group else p
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli", True):
            _add(target, f, hints[f.name], docs.get(f.name))
    return p


def _with_log_level(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags every command has: --log-level and --version."""
    p.add_argument("--log-level", default="info", choices=logs.LEVELS,
                   help="messages shown: debug, info (default), warning, error")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


class _Refusing(argparse.ArgumentParser):
    """The parser of keyword values (the Python API): a problem raises the line the command
    prints, as a :class:`~pythia_probe.errors.BadInputError`, instead of exiting."""

    def error(self, message: str):
        raise BadInputError(message)


def _parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> dict[str, Any]:
    """Parse ``argv`` (``sys.argv[1:]`` when None) and set up logging from --log-level (the
    command's; keyword values leave the caller's logging alone)."""
    ns = vars(_with_log_level(p).parse_args(sys.argv[1:] if argv is None else list(argv)))
    level = ns.pop("log_level")
    if not isinstance(p, _Refusing):
        logs.setup(level)
    return ns


def parse_config(cls: type, argv: Sequence[str] | None, prog: str, **fixed: Any):
    """``cls`` built from ``argv`` (``sys.argv[1:]`` when None); ``fixed`` fields are set by the
    caller (e.g. ``rank``), not by flags."""
    return cls(**_parse(config_parser(cls, prog), argv), **fixed)


def parse_configs(classes: Sequence[type], argv: Sequence[str] | None, prog: str,
                  description: str | None = None, *, keywords: bool = False
                  ) -> list[dict[str, Any]]:
    """The flags of several dataclasses on one command line; one dict of field values per class
    (the caller builds each, e.g. after resolving ranks). ``keywords``: ``argv`` is
    :func:`keywords_argv`'s, and a problem raises its line instead of exiting."""
    kind = _Refusing if keywords else argparse.ArgumentParser
    p = kind(prog=prog_name(prog), description=description or inspect.getdoc(classes[0]),
             formatter_class=argparse.RawDescriptionHelpFormatter)
    for cls in classes:
        config_parser(cls, prog, parser=p, group=len(classes) > 2)
    ns = _parse(p, argv)
    return [{f.name: ns[dest(f)] for f in dataclasses.fields(cls) if dest(f) in ns}
            for cls in classes]


def keywords_argv(cls: type, values: dict[str, Any], who: str) -> list[str]:
    """The command line keyword ``values`` stand for (the Python API), each checked against
    its field's type: a switch takes True or False (a string such as "false" is refused), a
    number a number, a list flag (a tuple field, or ``metadata={"list": True}`` such as
    --model) a comma-separated string or a list of items; None leaves an optional flag at its
    default. A keyword that is no field, or of another type, is one BadInputError naming it."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise BadInputError(f"{who} got unknown flags {unknown}; valid: the fields of "
                            f"`{prog_name(who)} --help` with _ for -")
    hints, argv = typing.get_type_hints(cls), []
    for name, value in values.items():
        argv += _tokens(fields[name], hints[name], value, who)
    return argv


def _tokens(f: dataclasses.Field, hint: Any, value: Any, who: str) -> list[str]:
    optional = type(None) in typing.get_args(hint)
    hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint) \
        if optional else hint
    listed = typing.get_origin(hint) is tuple or f.metadata.get("list", False)
    kind = {bool: "True or False", int: "an integer", float: "a number"}.get(
        hint, "a comma-separated string or a list" if listed else "a string")
    bad = BadInputError(f"{who}({f.name}={value!r}): {flag(dest(f))} takes {kind}, not "
                        f"{type(value).__name__}" + (" (None keeps the default)" * optional))
    if value is None:
        if not optional:
            raise bad
        return []
    if hint is bool:
        if not isinstance(value, bool):
            raise bad
        default = f.default if f.default is not dataclasses.MISSING else False
        return [] if value == default else [flag(dest(f)) if value else
                                            "--no-" + flag(dest(f))[2:]]
    if isinstance(value, bool) or (hint is int and not isinstance(value, int)) or (
            hint is float and not isinstance(value, (int, float))):
        raise bad
    if listed and isinstance(value, (list, tuple)):
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            raise bad
        value = ",".join(map(str, value))
    elif hint not in (int, float) and not isinstance(value, (str, int)):
        raise bad
    return [f"{flag(dest(f))}={value}"]  # one token: a value may start with "-"


def parse_subcommand(commands: dict[str, type], argv: Sequence[str] | None, prog: str,
                     description: str | None = None) -> tuple[str, Any]:
    """``(name, config)`` for ``prog NAME --flags...``, each subcommand a config dataclass;
    a missing or unknown NAME is refused naming the subcommands."""
    prog = prog_name(prog)
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    names = "{" + ",".join(commands) + "}"
    sub = p.add_subparsers(dest="_command", required=True, metavar=names)
    for name, cls in commands.items():
        doc = inspect.getdoc(cls)
        _with_log_level(config_parser(cls, f"{prog} {name}", parser=sub.add_parser(
            name, help=(doc or "").split("\n")[0], description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter)))
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or (args[0] not in commands and not args[0].startswith("-")):
        got = f"; got {args[0]!r}" if args else ""
        p.error(f"name a command: {', '.join(commands)}{got} (`{prog} NAME --help` for its "
                "flags)")
    ns = vars(p.parse_args(args))
    logs.setup(ns.pop("log_level"))
    name = ns.pop("_command")
    return name, commands[name](**ns)


def run_main(main: Callable[[], int], prog: str) -> int:
    """Call ``main()``; on a user error print ``prog: error: ...`` to stderr and return 2; on
    SIGINT or SIGTERM print ``prog: interrupted, rerun to resume`` and return 128 + signal."""
    with _signals_interrupt():
        try:
            return main()
        except KeyboardInterrupt as err:
            if os.environ.get("PYTHIA_PROBE_TRACEBACK"):
                raise
            print(f"{prog}: interrupted, rerun to resume", file=sys.stderr)
            return 128 + getattr(err, "signum", signal.SIGINT)
        except Exception as err:
            msg = user_message(err)
            if msg is None or os.environ.get("PYTHIA_PROBE_TRACEBACK"):
                raise
            print(f"{prog}: error: {msg}", file=sys.stderr)
            return 2


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGINT) raise :class:`~pythia_probe.errors.Interrupted` in the main thread
    while the command runs, so it unwinds like Ctrl-C: ``finally`` blocks run and the run's
    manifest records "interrupted". Off the main thread (signals cannot be set) nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
