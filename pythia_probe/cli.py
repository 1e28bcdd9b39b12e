"""One place that turns a user-facing error into a one-line message and exit code 2.

Bad input (a missing file, a step the model lacks, an unreachable hub, a wrong device) raises
ValueError, OSError or ConnectionError with a message that says what was wrong; command-line
entry points print that message instead of a traceback. Set PYTHIA_PROBE_TRACEBACK=1 to see
the traceback as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

USER_ERRORS = (ValueError, OSError, ConnectionError)


def run_main(main: Callable[[], int], prog: str) -> int:
    """Call ``main()``; on a user error print ``prog: error: ...`` to stderr and return 2."""
    try:
        return main()
    except USER_ERRORS as e:
        if os.environ.get("PYTHIA_PROBE_TRACEBACK"):
            raise
        print(f"{prog}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
