"""``hubless methods``: every correction with its defaults, what it is and its tuning grid."""

from __future__ import annotations

from typing import Any

from hubless.cli._common import friendly_errors

#: Room a table leaves the two wrapped columns beside the widest spec; a narrower console gets
#: the list form, where each spec has a line of its own.
_TEXT_COLUMNS = 2 * 30 + 10


def render_methods(console: Any) -> None:
    """Print every correction on ``console`` (a rich Console). A spec is never wrapped inside (it
    is copied whole into ``--method``): a table where the widest spec fits beside the other
    columns, otherwise one entry per method, the spec alone on its line."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    from hubless.corrections import METHODS

    rows = []
    for cls in METHODS.values():
        grid = "; ".join(f"{k} in {{{', '.join(str(v) for v in vals)}}}" for k, vals in cls.default_grid.items())
        rows.append((cls().spec, cls.summary, grid or "-"))
    title = "corrections (spec at the defaults; `hubless tune` searches the grid)"
    if console.width >= max(len(spec) for spec, _, _ in rows) + _TEXT_COLUMNS:
        table = Table(title=title)
        table.add_column("spec", no_wrap=True)
        for col in ("what it is", "tuning grid"):
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    console.print(Text(title, style="bold"), soft_wrap=False)
    for spec, summary, grid in rows:
        console.print()
        console.print(Text(spec, style="bold", no_wrap=True, overflow="ignore"), crop=False)
        for value in (summary, f"tuning grid: {grid}"):
            console.print(Padding(Text(value), (0, 0, 0, 4)))


@friendly_errors
def methods_command() -> None:
    """List every correction: its spec at the defaults, what it is, and its tuning grid."""
    from hubless.cli._common import wide_console

    render_methods(wide_console())
