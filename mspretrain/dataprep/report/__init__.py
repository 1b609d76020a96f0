"""report.json / report.md, their plots, per-file counts, and the report of a failed build."""
