"""Start-up time of the command line, next to the cost of importing numpy alone.

    python benchmarks/startup.py [--repeats 5]     # a few seconds
    python benchmarks/startup.py --check           # exit 1 when a floor is not met

Runs each command in a fresh process ``--repeats`` times and prints, as a Markdown table, the
median wall time and its ratio to ``python -c "import numpy"`` measured in the same run. Floor:
``hubless --help`` and ``hubless --version`` in <= 0.6 s (medians); a floor not met is said in
the table (an exit status of 1 only with ``--check``, so benchmarks/report.py keeps the
measurement). ``import hubless`` imports nothing heavy: corrections, FAISS and the rest load on
first use.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

FLOOR_SECONDS = 0.6


def median_seconds(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 when a floor is not met")
    args = parser.parse_args()
    exe = shutil.which("hubless") or str(__import__("pathlib").Path(sys.executable).with_name("hubless"))
    rows = [
        ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"], None),
        ("python -c 'import hubless'", [sys.executable, "-c", "import hubless"], None),
        ("hubless --version", [exe, "--version"], FLOOR_SECONDS),
        ("hubless --help", [exe, "--help"], FLOOR_SECONDS),
        ("hubless eval --help", [exe, "eval", "--help"], None),
    ]
    base = None
    print(f"| {'command':<30} | {'median s':>9} | {'x numpy':>8} | floor |")
    print(f"|{'-' * 32}|{'-' * 10}:|{'-' * 9}:|---|")
    failed = False
    for name, command, floor in rows:
        seconds = median_seconds(command, args.repeats)
        base = base or seconds
        verdict = ""
        if floor is not None:
            ok = seconds <= floor
            failed |= not ok
            verdict = f"<= {floor} s: {'met' if ok else 'NOT met'}"
        print(f"| {name:<30} | {seconds:>9.3f} | {seconds / base:>8.2f} | {verdict} |")
    sys.exit(1 if failed and args.check else 0)


if __name__ == "__main__":
    main()
