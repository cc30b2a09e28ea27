"""``hubless demo``: every correction on the built-in synthetic benchmark."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table


def demo(
    seed: int = typer.Option(0, help="Seed of the synthetic benchmark."),
    n_items: int = typer.Option(1000, help="Gallery items (images); each has 5 captions as queries."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
) -> None:
    """Run every correction on a synthetic benchmark and print R@1 and the largest hub, before/after."""
    from hubless.data import make_retrieval_data
    from hubless.demo import run_demo

    data = make_retrieval_data(n_items=n_items, seed=seed)
    rows = run_demo(data, progress=progress)
    base = rows[0]
    table = Table(title=f"text->image, synthetic: {n_items} images, {len(data.queries)} captions, seed {seed}")
    table.add_column("method")
    table.add_column("params", overflow="fold")
    table.add_column("R@1 before -> after", justify="right")
    table.add_column("change", justify="right")
    table.add_column("largest hub before -> after", justify="right")
    for row in rows:
        table.add_row(
            row.method,
            row.spec.partition(":")[2],
            f"{base.r_at_1:.2f} -> {row.r_at_1:.2f}",
            f"{row.r_at_1 - base.r_at_1:+.2f}",
            f"{base.largest_hub} -> {row.largest_hub}",
        )
    Console().print(table)
