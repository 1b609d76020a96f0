"""Model families, one folder each (`llama/`), each registered as a ModelSpec (`spec.py`)."""
