"""Self-contained HTML reports with inline plots (matplotlib, Agg backend; ``report`` extra)."""

from hubless.reports.html import Report, figure_to_data_uri, html_table

__all__ = ["Report", "figure_to_data_uri", "html_table"]
