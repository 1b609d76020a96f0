"""The build report's pictures: document length and token frequency, PNGs next to report.md.

- report_doc_lengths.png: documents per token-length bin (powers of two), the report's histogram;
- report_tokens.png: how often each token id occurs, by rank (log-log), over the packed splits.
matplotlib with the Agg backend (no display), no timestamps in the files: the same data gives the same
bytes. Needs the `viz` extra; without matplotlib the report has no pictures and says why.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mspretrain.common.console import ctrl_c_deferred

FILES = {"doc_lengths": "report_doc_lengths.png", "tokens": "report_tokens.png"}
_POINTS = 200


def token_rank_frequency(work, vocab_size: int) -> list[int]:
    """Token counts sorted by rank, sampled at up to _POINTS log-spaced ranks: [[rank, count], ...].
    Every tokenized chunk counts, whatever its index (the Ray engine numbers chunks by unit)."""
    counts = np.zeros(vocab_size, np.int64)
    for path in sorted(work.tokens.glob("[0-9]*.npz")):
        with np.load(path) as z:
            for s in ("train", "valid"):
                counts += np.bincount(z[f"{s}_tokens"], minlength=vocab_size)[:vocab_size]
    ranked = np.sort(counts[counts > 0])[::-1]
    if ranked.size == 0:
        return []
    ranks = np.unique(np.geomspace(1, ranked.size, min(_POINTS, ranked.size)).astype(int))
    return [[int(r), int(ranked[r - 1])] for r in ranks]


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def write_plots(root: Path, report: dict) -> None:
    """Draw report["plots"] (from `FILES`) into `root`. A Ctrl-C while matplotlib imports or draws is
    acted on after it (`ctrl_c_deferred` says why)."""
    with ctrl_c_deferred():
        _write_plots(root, report)


def _write_plots(root: Path, report: dict) -> None:
    """Figures are made without pyplot and laid out with fixed margins: pyplot's import and
    tight_layout were most of a build's last second."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    meta = {"Software": None}
    hist = report["token_length_histogram"]
    fig = _figure(Figure, bottom=0.33)
    ax = fig.subplots()
    ax.bar(range(len(hist)), list(hist.values()), color="tab:blue")
    ax.set_xticks(range(len(hist)), list(hist.keys()), rotation=45, ha="right")
    ax.set_xlabel("document length (tokens, EOS included)")
    ax.set_ylabel("documents")
    ax.set_title("Document length", y=1.01)
    fig.savefig(root / FILES["doc_lengths"], metadata=meta)

    points = report["token_rank_frequency"]
    fig = _figure(Figure, bottom=0.13)
    ax = fig.subplots()
    if points:
        ranks, counts = zip(*points)
        ax.loglog(ranks, counts, marker=".", color="tab:orange")
    ax.set_xlabel("token rank")
    ax.set_ylabel("occurrences")
    ax.set_title(f"Token frequency (vocab {report['tokenizer']['vocab_size']})", y=1.01)
    ax.minorticks_off()     # minor ticks of log axes were most of the drawing time
    # plain tick labels (10, 1k, 1M): the default 10^n ones are typeset by mathtext, half the drawing
    short = FuncFormatter(lambda v, _: _short(v))
    ax.xaxis.set_major_formatter(short)
    ax.yaxis.set_major_formatter(short)
    ax.grid(True, alpha=0.3)
    fig.savefig(root / FILES["tokens"], metadata=meta)


def _short(v: float) -> str:
    """A tick label: 1, 10, 100, 1k, 10k, ..., 1M, 1G."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:g}{unit}"
    return f"{v:g}"


def _figure(Figure, bottom: float):
    """A 700x400 px figure whose margins fit the axis labels (room below for rotated ticks)."""
    fig = Figure(figsize=(7, 4), dpi=100)
    fig.subplots_adjust(left=0.11, right=0.97, top=0.91, bottom=bottom)
    return fig
