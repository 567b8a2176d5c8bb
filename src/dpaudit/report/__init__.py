"""Reports: JSON results written atomically, console tables, and plots saved next to them."""

from dpaudit.report.files import format_table, write_json, write_new
from dpaudit.report.plots import plot_roc, plot_score_histograms, plot_white_box

__all__ = [
    "format_table",
    "plot_roc",
    "plot_score_histograms",
    "plot_white_box",
    "write_json",
    "write_new",
]
