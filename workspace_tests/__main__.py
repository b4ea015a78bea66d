"""Run every worked example in this folder, each in its own process: ``python -m workspace_tests``.

``--quick`` is passed on to each script (CI runs the quick mode). A script asserts its own
outcome and exits non-zero when it fails; this runner fails if any script does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    scripts = sorted(p for p in here.glob("*.py") if not p.name.startswith("_"))
    only = [a for a in argv if not a.startswith("-")]
    if only:
        scripts = [p for p in scripts if p.stem in only]
    flags = [a for a in argv if a.startswith("-")]
    failed = []
    for script in scripts:
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), *flags])
        status = "ok" if rc == 0 else f"FAILED (exit {rc})"
        print(f"workspace_tests: {script.name}: {status} in {time.perf_counter() - t0:.1f} s")
        if rc:
            failed.append(script.name)
    if failed:
        print(f"workspace_tests: {len(failed)} failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
