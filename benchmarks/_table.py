"""The results table every benchmark prints: measure | value | floor.

A floor is the size-specific target an issue set (e.g. ">= 10x" at gallery 100k x bank 1M);
at any other size it does not apply, so the column says so instead of suggesting a verdict.
"""

from __future__ import annotations


def table_lines(rows: list[tuple[str, str, str]], *, full_size: bool, size: str) -> list[str]:
    """``(measure, value, floor)`` rows as the lines of a Markdown table; floors only at ``full_size``."""
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'measure'.ljust(width)} | value | floor |", f"|{'-' * (width + 2)}|---|---|"]
    for label, value, floor in rows:
        shown = floor if full_size or not floor else "n/a at this size"
        lines.append(f"| {label.ljust(width)} | {value} | {shown} |")
    if not full_size and any(r[2] for r in rows):
        lines.append(f"(floors are set at the default size, {size}; run at that size to check them)")
    return lines


def print_table(rows: list[tuple[str, str, str]], *, full_size: bool, size: str) -> None:
    """Print ``(measure, value, floor)`` rows as a Markdown table; floors only at ``full_size``."""
    print("\n" + "\n".join(table_lines(rows, full_size=full_size, size=size)))
