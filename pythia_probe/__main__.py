"""``pythia-probe COMMAND ...`` (or ``python -m pythia_probe COMMAND ...``): every command of the
toolkit under one name, each the same as ``python -m pythia_probe.<module>``."""

from __future__ import annotations

import importlib
import sys

from pythia_probe import __version__
from pythia_probe.cli import invoked_as, run_main

#: command -> module whose main(argv) runs it
COMMANDS = {
    "sweep": "pythia_probe.sweep.__main__",
    "stats": "pythia_probe.stats.__main__",
    "corpus": "pythia_probe.corpus.__main__",
    "toy": "pythia_probe.toy.train",
    "icrecall": "pythia_probe.toy.icrecall.__main__",
    "plots": "pythia_probe.plots.__main__",
    "summary": "pythia_probe.summary",
    "revisions": "pythia_probe.hub.revisions",
}
USAGE = ("usage: pythia-probe {" + ",".join(COMMANDS) + "} [--help] [--version] ...\n"
         "  sweep     score every checkpoint of a model against corpus statistics (the main job)\n"
         "  stats     corpus statistics (compute) and their top lists (top)\n"
         "  corpus    generate the built-in stories, inspect a corpus\n"
         "  toy       train the attention-only model of the leading-terms paper\n"
         "  icrecall  the in-context factual recall experiment\n"
         "  plots     heat maps and curves of a results folder\n"
         "  summary   per layer, the step where agreement peaks and the step it leaves\n"
         "  revisions which checkpoint branches hold duplicate or final weights (no download)\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:
        print(f"pythia-probe {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command = importlib.import_module(COMMANDS[argv[0]])
    prog = f"pythia-probe {argv[0]}"
    with invoked_as(prog):  # every parser (and --help) names the command as it was typed
        return run_main(lambda: command.main(argv[1:]), prog)


if __name__ == "__main__":
    raise SystemExit(main())
