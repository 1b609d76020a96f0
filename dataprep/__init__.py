"""dataprep: raw corpus files -> a contract-1 dataset (see build.py)."""
import os

# pyarrow's own allocator (jemalloc/mimalloc) keeps the memory of freed chunk tables: on a 250 MB
# build ~100 MB more peak RSS across the main process and a worker, for no speed gain here. The
# variable is read when pyarrow's default pool is first made, so it is set before any import of
# pyarrow from this package, and spawned workers inherit it. An explicit setting wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
