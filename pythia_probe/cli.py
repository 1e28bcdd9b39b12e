"""One place that turns a user-facing error into a one-line message and exit code 2.

A :class:`~pythia_probe.errors.UserError` (bad input, corrupt or missing file, full disk,
unreachable hub, missing device) and an operating-system error about a named file (permission
denied, not found, no space left) are printed as ``prog: error: ...`` on stderr with exit
code 2. Anything else is a bug: its traceback is shown (exit 1). Set PYTHIA_PROBE_TRACEBACK=1
to see the traceback of user errors as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from pythia_probe.errors import user_message


def run_main(main: Callable[[], int], prog: str) -> int:
    """Call ``main()``; on a user error print ``prog: error: ...`` to stderr and return 2."""
    try:
        return main()
    except Exception as err:
        msg = user_message(err)
        if msg is None or os.environ.get("PYTHIA_PROBE_TRACEBACK"):
            raise
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
