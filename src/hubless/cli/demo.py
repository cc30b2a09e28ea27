"""``hubless demo``: every correction on the built-in synthetic benchmark."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import check_outputs, friendly_errors, print_note, wide_console


@friendly_errors
def demo(
    seed: int = typer.Option(0, help="Seed of the synthetic benchmark."),
    n_items: int = typer.Option(1000, help="Gallery items (images); each has 5 captions as queries."),
    report: Path = typer.Option(Path("demo-report.html"), help="Where to write the HTML report ('' to skip)."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    serve: bool = typer.Option(
        False, "--serve", help="Then serve the demo's NNN index and its web page on 127.0.0.1 (needs the serve extra)."
    ),
    port: int = typer.Option(8000, help="With --serve: the port."),
    data_out: Path = typer.Option(
        None,
        "--data",
        help="Also write the demo's embeddings into this folder under the names the docs use (images.npy, captions.npy, ...).",
    ),
) -> None:
    """Evaluate every correction on a synthetic benchmark: R@1 and the largest hub, before/after."""
    from hubless.data import make_retrieval_data
    from hubless.demo import run_demo
    from hubless.errors import MissingDependency, check_available
    from hubless.progress import stage

    if serve:
        check_available("fastapi", "demo --serve", "serve")
        check_available("uvicorn", "demo --serve", "serve")
    if str(report) not in ("", "."):
        check_outputs({"--report": report}, {}, overwrite=False)  # its own earlier report is replaced
        try:
            check_available("matplotlib", "the HTML report", "report")
        except MissingDependency as exc:
            print_note(f"{exc}; the report is skipped")
            report = Path("")
    if data_out is not None:
        from hubless.data.synthetic import write_example_files

        written = write_example_files(data_out, n_items=n_items, seed=seed)
        typer.echo(f"wrote the demo's data: {len(written)} files in {data_out} (images.npy, captions.npy, bank_captions.npy, ...)")
    with stage("making the synthetic benchmark", progress):
        data = make_retrieval_data(n_items=n_items, seed=seed)
    ev = run_demo(data, progress=progress)
    base = ev.results[0]
    table = Table(title=f"text->image, synthetic: {n_items} images, {len(data.queries)} captions, seed {seed}")
    table.add_column("method")
    table.add_column("params", overflow="fold")
    table.add_column("R@1 before -> after", justify="right")
    table.add_column("change [95% CI]", justify="right")
    table.add_column("largest hub before -> after", justify="right")
    for r in ev.results:
        ci = r.delta_ci95.get("R@1")
        change = f"{r.delta['R@1']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if r.delta and ci else ""
        table.add_row(
            r.method,
            r.spec.partition(":")[2],
            f"{base.metrics['R@1']:.2f} -> {r.metrics['R@1']:.2f}",
            change,
            f"{int(base.hubness['N1_max'])} -> {int(r.hubness['N1_max'])}",
        )
    wide_console().print(table)
    if str(report) not in ("", "."):
        from hubless.reports.evaluation import evaluation_report

        with stage(f"writing the report {report}", progress):
            evaluation_report(ev, report, title="hubless demo: every correction on synthetic data")
        typer.echo(f"report: {report}")
    if serve:
        _serve(data, port)


def _serve(data, port: int) -> None:
    """The demo's gallery behind the web page: an NNN index with a caption per item."""
    import uvicorn

    from hubless.index import Index
    from hubless.service import create_app

    meta = [{"caption": f"synthetic image {i} (its captions are queries {5 * i}-{5 * i + 4})"} for i in range(data.gallery.shape[0])]
    index = Index.build(data.gallery, data.query_bank, "nnn:alpha=0.75,k=16", "Flat", metadata=meta)
    typer.echo(
        f"serving the demo index on http://127.0.0.1:{port}/ (search an item id, e.g. 7: the synthetic index has no model for text; Ctrl-C stops)"
    )
    uvicorn.run(
        create_app({"demo": index}),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        http="hubless.service.protocol:ServeProtocol",
        server_header=False,
    )
