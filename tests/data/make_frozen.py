"""Freeze the sweep's outputs on fixed inputs (issue 27, before the consolidation).

    python tests/data/make_frozen.py

writes tests/data/frozen/<case>.csv for every case of frozen_inputs.CASES, with the code of the
commit that ran it (named in tests/data/frozen/README.md). tests/test_frozen.py reruns every
case with today's code and compares."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from frozen_inputs import CASES, build_hub, run_case  # noqa: E402

OUT = Path(__file__).with_name("frozen")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        hub = build_hub(Path(tmp) / "hub")
        for name in CASES:
            df = run_case(name, hub, Path(tmp) / name)
            df.to_csv(OUT / f"{name}.csv", index=False, float_format="%.17g")
            print(name, len(df), "rows")


if __name__ == "__main__":
    main()
