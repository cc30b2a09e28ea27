"""``hubless methods``: every correction with its defaults, what it is and its tuning grid."""

from __future__ import annotations


def methods_command() -> None:
    """List every correction: its spec at the defaults, what it is, and its tuning grid."""
    from rich.table import Table

    from hubless.cli._common import wide_console
    from hubless.corrections import METHODS

    table = Table(title="corrections (spec at the defaults; `hubless tune` searches the grid)")
    for col in ("spec", "what it is", "tuning grid"):
        table.add_column(col, overflow="fold")
    for cls in METHODS.values():
        grid = "; ".join(f"{k} in {{{', '.join(str(v) for v in vals)}}}" for k, vals in cls.default_grid.items())
        table.add_row(cls().spec, cls.summary, grid or "-")
    wide_console().print(table)
