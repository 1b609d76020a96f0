"""Infrastructure shared by `dataprep` and `train`: the config layer, atomic file writes, locks, and the
console commands' outermost layer (console.py)."""

