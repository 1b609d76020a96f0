"""Exact and near-duplicate detection, and the keep rule applied in input order."""
