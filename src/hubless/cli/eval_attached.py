"""``hubless eval --attached SIDECAR --queries q.npy``: the attached search of a collection you
already have measured against exact corrected search (a full scan with the sidecar's biases):
recall@k, the shares of queries certified and exact, the answers claimed exact that were not (0
when the promise holds) and the mean k' per cut-off. A thin layer over
:meth:`hubless.attached.AttachedCollection.evaluate_at`; one mode of ``hubless eval``
(:mod:`hubless.cli.modes`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import typer
from rich.table import Table

from hubless.cli._common import check_outputs, generator_mark, parse_ints, wide_console
from hubless.cli.modes import Mode


@dataclass(frozen=True)
class AttachedEval(Mode):
    """Open the collection the sidecar names (found from the sidecar's folder), evaluate at each
    cut-off of ``ks``, print a table and write ``out`` (JSON) when given."""

    what: ClassVar[str] = "an attached collection"
    selector: ClassVar[str] = "--attached"
    needs: ClassVar[tuple[str, ...]] = ("attached", "queries")

    attached: Path
    queries: Path
    ks: str
    candidates: int | None
    max_candidates: int | None
    nprobe: int | None
    ef_search: int | None
    weight: float | None
    out: Path | None
    progress: bool | None
    overwrite: bool

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        return values["attached"] is not None

    def run(self) -> None:
        from hubless._atomic import write_json
        from hubless.attached import AttachedCollection
        from hubless.inputs import load_array

        check_outputs({"--out": self.out}, {"--attached": self.attached, "--queries": self.queries}, overwrite=self.overwrite)
        attached = AttachedCollection.from_sidecar(self.attached)
        knobs = (("nprobe", self.nprobe), ("ef_search", self.ef_search), ("weight", self.weight))
        options: dict[str, float | int] = {k: v for k, v in knobs if v is not None}
        rows = attached.evaluate_at(
            load_array(self.queries),
            parse_ints(self.ks, "--ks"),
            candidates=self.candidates,
            max_candidates=self.max_candidates,
            **options,
        )
        title = f"{attached.spec} attached to {attached.source.kind} ({attached.ntotal} items): against exact corrected search"
        table = Table(title=title)
        for column in ("k", "recall@k", "certified", "exact", "wrong exact", "mean k'", "queries"):
            table.add_column(column, justify="right")
        for row in rows:
            shares = (f"{row['recall']:.4f}", f"{row['certified']:.1%}", f"{row['exact']:.1%}", str(row["wrong_exact"]))
            table.add_row(str(row["top_k"]), *shares, f"{row['candidates']:.0f}", str(row["queries"]))
        wide_console().print(table)
        if self.out is not None:
            info = {"sidecar": str(self.attached), "method": attached.spec, "source": attached.source.kind, "n_items": attached.ntotal}
            write_json(self.out, {**generator_mark(), "attached": info, "results": rows})
            typer.echo(f"results: {self.out}")
