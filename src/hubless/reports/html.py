"""Building blocks of a self-contained HTML report: sections, tables and inline PNG figures.

A report is one file with every image inlined as a base64 data URI, so it can be mailed or
attached to a CI run. Writes are atomic (temporary file + rename).
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from hubless._atomic import write_text

__all__ = ["Report", "figure_to_data_uri", "html_table", "require_matplotlib"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
td:first-child { max-width: 22rem; } .table-wrap { overflow-x: auto; }
figure { margin: 1rem 0; } figcaption { font-size: 0.85rem; color: #555; }
img { max-width: 100%; } .note { color: #555; font-size: 0.9rem; }
"""


def require_matplotlib():
    """Import matplotlib with the Agg backend, or explain which extra to install."""
    from hubless.errors import optional_import

    matplotlib = optional_import("matplotlib", "HTML reports", "report")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_to_data_uri(fig, *, dpi: int = 110) -> str:
    """Render a matplotlib figure to a PNG data URI and close it."""
    plt = require_matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def html_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> str:
    """An HTML table of ``rows`` (dicts); floats are shown with 2 decimals."""
    if not rows:
        return "<p class='note'>(no rows)</p>"
    columns = list(columns or rows[0].keys())

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return html.escape(str(value)).replace(",", ",<wbr>")  # long method specs wrap at commas

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<div class='table-wrap'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


class Report:
    """An HTML report assembled section by section::

    report = Report("hubless evaluation")
    report.section("Results", html_table(rows))
    report.figure("Hubness", fig, caption="N_1 before and after")
    report.write("report.html")
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = []

    def section(self, heading: str, body_html: str = "", *, section_id: str | None = None) -> Report:
        """Add a heading and raw HTML body (escape user text with ``html.escape``)."""
        anchor = f" id='{html.escape(section_id)}'" if section_id else ""
        self._parts.append(f"<h2{anchor}>{html.escape(heading)}</h2>\n{body_html}")
        return self

    def paragraph(self, text: str) -> Report:
        self._parts.append(f"<p>{html.escape(text)}</p>")
        return self

    def figure(self, fig, *, caption: str = "", alt: str = "") -> Report:
        """Add a matplotlib figure, inlined as PNG (the figure is closed)."""
        uri = figure_to_data_uri(fig)
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._parts.append(f"<figure><img src='{uri}' alt='{html.escape(alt or caption)}'>{cap}</figure>")
        return self

    def to_html(self) -> str:
        body = "\n".join(self._parts)
        return (
            "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n<meta name='generator' content='hubless'>\n"
            f"<title>{html.escape(self.title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
            f"<body>\n<h1>{html.escape(self.title)}</h1>\n{body}\n</body>\n</html>\n"
        )

    def write(self, path: str | os.PathLike) -> Path:
        """Write the report atomically; returns the path."""
        return write_text(path, self.to_html())
