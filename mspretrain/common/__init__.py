"""Infrastructure shared by `dataprep` and `train`: the config layer and atomic file writes."""
