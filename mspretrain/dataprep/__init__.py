"""dataprep: raw corpus files -> a dataset directory (docs/contracts.md); see build.py."""
