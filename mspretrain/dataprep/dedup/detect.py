"""Exact and near-duplicate detection.

Exact: `exact_key` is a 16-byte BLAKE2b digest of the normalised text.

Near: MinHash signatures with LSH banding and a verification step.
The signature scheme ("oph-rot-v1", recorded by `describe`) is one-permutation MinHash with
densification (Li, Owen & Zhang 2012; Shrivastava & Li 2014), vectorised in numpy so that a
signature costs O(shingles + num_perm) rather than the O(shingles * num_perm) of classic MinHash:

1. shingles: the text is lower-cased and its line breaks become spaces; the shingles are
   its character n-grams ("char5": 5 characters, which works for Chinese and English alike; a text
   shorter than n is one shingle, padded with NULs);
2. each shingle's code points c_0..c_{n-1} hash to h = fmix64(sum_k c_k * M_k mod 2^64 xor S), with
   odd multipliers M_k and salt S drawn from `seed` by splitmix64;
3. bin = ((h >> 32) * num_perm) >> 32, value = h & 0xffffffff; signature[bin] = min value in the bin;
4. densification by rotation (Shrivastava & Li 2014): an empty bin takes the value of the next
   non-empty bin to its right, wrapping around. Every bin then collides with probability equal to
   the Jaccard similarity, and the fraction of equal entries of two signatures estimates it.

NearDedup indexes kept documents by LSH bands (`lsh_params` picks bands x rows so that a pair at the
threshold becomes a candidate with probability >= 0.995; band b takes the strided bins b, b + bands,
...) and verifies every candidate: an estimate (fraction of equal signature entries) more than
_VERIFY_SIGMAS standard deviations from the threshold decides alone; a pair in between is settled
by the exact Jaccard similarity of the two texts (`exact_jaccard`, when the index is given
`texts_of`, as a build's is). The estimate alone puts pairs near the threshold on the wrong side
(on the labelled set in tests/dataprep/data at 0.8: precision 0.967, recall 0.975); with the exact
verification both are 1.0 there, in English and Chinese, at 0.8 and 0.9
(`neardup_eval.py eval`).

The scheme is ours (not datasketch's, whose `MinHash` hashes every shingle num_perm times, and whose
signatures would not match these anyway): nothing in it depends on a library version.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np


SCHEME = "oph-rot-v1"        # bump whenever anything that changes signatures changes
_MASK64 = (1 << 64) - 1
_BLOCK_CHARS = 1 << 14       # shingles are hashed in blocks of about this many characters (the
                             # working arrays then stay in a core's cache)
_CANDIDATE_RECALL = 0.995    # P(candidate) wanted for a pair right at the threshold
_WIDTH = 16                  # slots per bucket of a band table
_VERIFY_SIGMAS = 4.5         # estimates this many standard deviations from the threshold are trusted


def exact_key(text: str) -> bytes:
    """16-byte BLAKE2b digest of the text (already normalised: equal texts, equal keys)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class DedupConfig:
    threshold: float = 0.8      # estimated Jaccard similarity at which a document is a near duplicate
    num_perm: int = 256         # MinHash permutations (LSH bands and rows follow from them)
    seed: int = 1               # seed of the MinHash permutations
    shingle: str = "char5"      # shingles: charN, n-grams of N characters (2 to 99)

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"DedupConfig.threshold must be in (0, 1], got {self.threshold}")
        if not 2 <= self.num_perm <= 4096:
            raise ValueError(f"DedupConfig.num_perm must be in [2, 4096], got {self.num_perm}")
        shingle_order(self.shingle)

    @property
    def bands_rows(self) -> tuple[int, int]:
        return lsh_params(self.threshold, self.num_perm)


def shingle_order(shingle: str) -> int:
    m = re.fullmatch(r"char([2-9]|[1-9][0-9])", shingle)
    if not m:
        raise ValueError(f"DedupConfig.shingle must look like 'char5' (char n-grams), got {shingle!r}")
    return int(m.group(1))


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows): the most rows (fewest false candidates) such that a pair whose similarity
    equals the threshold is a candidate with probability >= 0.995; bands * rows <= num_perm."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold ** rows) ** bands >= _CANDIDATE_RECALL:
            best = (bands, rows)
    return best


def describe(cfg: DedupConfig) -> dict:
    bands, rows = cfg.bands_rows
    return {"scheme": SCHEME, "num_perm": cfg.num_perm, "bands": bands, "rows": rows,
            "threshold": cfg.threshold, "shingle": cfg.shingle, "seed": cfg.seed,
            "shingle_text": "lowercase, line breaks as spaces",
            "hash": "fmix64(sum c_k*M_k xor S) over code points; bin = high 32 bits * num_perm >> 32",
            "densification": "rotation: an empty bin takes the next non-empty bin to its right",
            "band_layout": "band b = bins b, b + bands, b + 2 * bands, ...",
            "verification": "signature-estimated Jaccard >= threshold",
            "index_bits": 16}


# ------------------------------------------------------------------------------------ hashing

def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@lru_cache(maxsize=8)
def _constants(seed: int, order: int) -> tuple[np.ndarray, np.uint64]:
    """(odd multipliers, one per shingle position; salt), drawn from `seed`."""
    base = _splitmix64(seed & _MASK64)
    mults = np.array([_splitmix64(base + 1 + k) | 1 for k in range(order)], dtype=np.uint64)
    return mults, np.uint64(_splitmix64(base ^ 0x5EED))


_FMIX1, _FMIX2, _S33 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place (one scratch array, no temporaries)."""
    tmp = np.empty_like(h)
    for mult in (_FMIX1, _FMIX2, None):
        np.right_shift(h, _S33, out=tmp)
        h ^= tmp
        if mult is not None:
            h *= mult
    return h


def shingle_text(text: str) -> str:
    """Lower-cased, line breaks as spaces: the text whose character n-grams are the shingles.

    Meant for normalised text (whitespace runs already collapsed), where re-wrapped lines then give
    the same shingles.
    """
    return text.lower().replace("\n", " ")


def signatures(texts: list[str], cfg: DedupConfig) -> np.ndarray:
    """[len(texts), num_perm] uint32 signatures; pure: the same text always gives the same row.

    Texts are hashed in blocks of about _BLOCK_CHARS characters (long texts in pieces that overlap
    by order - 1 characters, so that every window is hashed exactly once), which keeps the
    working arrays in cache.
    """
    order, k = shingle_order(cfg.shingle), cfg.num_perm
    if len(texts) == 1:   # one text that is one block: no merging of pieces
        s = shingle_text(texts[0])
        if len(s) <= _BLOCK_CHARS:
            return _densify(*_block_minima([s], order, cfg))
    sig = np.full((len(texts), k), _EMPTY, dtype=np.uint32)
    filled = np.zeros((len(texts), k), dtype=bool)
    pieces: list[str] = []
    owners: list[int] = []
    size = 0
    for i, text in enumerate(texts):
        s = shingle_text(text)
        for start in range(0, max(1, len(s) - order + 1), _BLOCK_CHARS):
            pieces.append(s[start:start + _BLOCK_CHARS + order - 1])
            owners.append(i)
            size += len(pieces[-1]) + order
            if size >= _BLOCK_CHARS:
                _add_block(pieces, owners, order, cfg, sig, filled)
                pieces, owners, size = [], [], 0
    if pieces:
        _add_block(pieces, owners, order, cfg, sig, filled)
    return _densify(sig, filled)


_EMPTY = 0xFFFFFFFF   # an empty bin's value before densification


def _add_block(pieces: list[str], owners: list[int], order: int, cfg: DedupConfig,
               sig: np.ndarray, filled: np.ndarray) -> None:
    """Fold the bin minima of `pieces` into the rows `owners` of sig and filled."""
    piece_sig, piece_filled = _block_minima(pieces, order, cfg)
    rows = np.array(owners)
    if len(set(owners)) == len(owners):
        sig[rows] = np.minimum(sig[rows], piece_sig)
        filled[rows] |= piece_filled
    else:
        np.minimum.at(sig, rows, piece_sig)
        np.logical_or.at(filled, rows, piece_filled)


def _code_points(text: str) -> np.ndarray:
    """The code points of `text`: uint8 when they all fit (no widening pass), else uint32."""
    try:
        return np.frombuffer(text.encode("latin-1"), dtype=np.uint8)
    except UnicodeEncodeError:
        return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _block_minima(docs: list[str], order: int, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    """Bin minima and non-empty bins of a block of shingle texts, laid out as doc + `order` NULs,
    one after another (so that the one window of a text shorter than `order` ends in NULs)."""
    mults, salt = _constants(cfg.seed, order)
    k, pad = cfg.num_perm, "\0" * order
    cps = _code_points(pad.join(docs) + pad)
    n_windows = len(cps) - order + 1
    h = np.multiply(cps[:n_windows], mults[0], dtype=np.uint64)
    tmp = np.empty_like(h)
    for j in range(1, order):
        h += np.multiply(cps[j:j + n_windows], mults[j], out=tmp, dtype=np.uint64)
    # Doc d holds windows [counts[d]) of its lengths[d] + order (a short doc has one window);
    # the others run into the padding.
    if len(docs) == 1:
        h = h[:max(len(docs[0]) - order + 1, 1)]
        slot = np.zeros(1, np.int64)
    else:
        lengths = np.array([len(s) for s in docs], dtype=np.int64)
        counts = np.maximum(lengths - order + 1, 1)
        spans = np.stack([counts, lengths + order - counts], axis=1).reshape(-1)
        h = h[np.repeat(np.tile(np.array([True, False]), len(docs)), spans)[:n_windows]]
        slot = np.repeat(np.arange(len(docs), dtype=np.int64) * k, counts)
    h ^= salt
    h = _fmix64(h)
    if k & (k - 1) == 0:   # a power of two: ((h >> 32) * k) >> 32 is the top log2(k) bits
        bins = h >> np.uint64(65 - k.bit_length())
    else:
        bins = (h >> np.uint64(32)) * np.uint64(k)
        bins >>= np.uint64(32)
    slot = slot + bins.view(np.int64)
    sig = np.full(len(docs) * k, _EMPTY, dtype=np.uint32)
    np.minimum.at(sig, slot, h.astype(np.uint32))  # the low 32 bits
    filled = np.zeros(len(docs) * k, dtype=bool)
    filled[slot] = True
    return sig.reshape(-1, k), filled.reshape(-1, k)


def _densify(sig: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """Every empty bin takes the value of the next non-empty bin to its right, wrapping around."""
    n, k = sig.shape
    if n == 1:   # one row: 1-d arrays
        if filled.all():
            return sig
        pos = np.where(filled[0], np.arange(k, dtype=np.int32), np.int32(2 * k))
        nxt = np.minimum.accumulate(pos[::-1])[::-1]
        nxt[nxt >= 2 * k] = pos.min()
        return sig[:, nxt]
    empty_rows = np.flatnonzero(~filled.all(axis=1))
    if len(empty_rows) == 0:
        return sig
    out = sig.copy()
    cols = np.arange(k, dtype=np.int32)
    for start in range(0, len(empty_rows), 2048):  # bounded working memory
        rows = empty_rows[start:start + 2048]
        pos = np.where(filled[rows], cols, np.int32(2 * k))
        nxt = np.minimum.accumulate(pos[:, ::-1], axis=1)[:, ::-1]
        nxt = np.where(nxt >= 2 * k, pos.min(axis=1)[:, None], nxt)
        out[rows] = np.take_along_axis(sig[rows], nxt, axis=1)
    return out


@lru_cache(maxsize=64)
def shingle_hashes(text: str, order: int, seed: int) -> np.ndarray:
    """The sorted distinct 64-bit hashes of the shingles of `text` (every window of `order` characters of `shingle_text`; a shorter
    text is one window, padded with NULs): two texts'
    exact Jaccard similarity, up to a 64-bit collision (probability ~ shingles**2 / 2**64)."""
    s = shingle_text(text)
    if len(s) < order:
        s = s.ljust(order, "\0")
    mults, salt = _constants(seed, order)
    cps = np.frombuffer(s.encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.uint64)
    n = len(cps) - order + 1
    h = cps[:n] * mults[0]
    for j in range(1, order):
        h += cps[j:j + n] * mults[j]
    h ^= salt
    return np.unique(_fmix64(h))


def exact_jaccard(a: str, b: str, cfg: DedupConfig) -> float:
    """Jaccard similarity of the shingle sets of two texts."""
    order = shingle_order(cfg.shingle)
    ha, hb = shingle_hashes(a, order, cfg.seed), shingle_hashes(b, order, cfg.seed)
    inter = len(np.intersect1d(ha, hb, assume_unique=True))
    return inter / (len(ha) + len(hb) - inter)


# ------------------------------------------------------------------------------------ index

class _BandTable:
    """Bucketed hash tables, one per LSH band: 32-bit band hash -> kept document numbers.

    A hash picks a bucket of _WIDTH slots in its band; a full bucket overflows into the next one.
    Several documents may share a hash and `find` returns them all. A 32-bit hash can also match by
    chance, which only adds a candidate (candidates are verified). 8 bytes a slot, at most half of
    them used. Buckets of all bands are rows of one array: row = band * buckets + bucket.
    """

    def __init__(self, bands: int, buckets: int = 64):
        self.size, self.bands, self.buckets = 0, bands, buckets
        self.keys = np.zeros((bands * buckets, _WIDTH), dtype=np.uint32)
        self.vals = np.full((bands * buckets, _WIDTH), -1, dtype=np.int32)
        self.fill = np.zeros(bands * buckets, dtype=np.int32)
        self._base = np.arange(bands, dtype=np.int64) * buckets

    def _rows(self, band_base: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        return band_base + (hashes & np.uint32(self.buckets - 1)).astype(np.int64)

    def _next(self, rows: np.ndarray) -> np.ndarray:
        """The next bucket of the same band, wrapping around."""
        bucket = rows % self.buckets
        return rows - bucket + (bucket + 1) % self.buckets

    def find(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query row, document number) pairs stored under [q, bands] hashes (with repeats)."""
        q = hashes.shape[0]
        query = np.repeat(np.arange(q), self.bands)
        key = hashes.reshape(-1)
        rows = self._rows(np.tile(self._base, q), key)
        queries, found = [], []
        while len(rows):
            vals = self.vals[rows]
            hit = (self.keys[rows] == key[:, None]) & (vals >= 0)
            queries.append(np.repeat(query, np.count_nonzero(hit, axis=1)))
            found.append(vals[hit])
            full = self.fill[rows] == _WIDTH
            query, key, rows = query[full], key[full], self._next(rows[full])
        return np.concatenate(queries), np.concatenate(found)

    def insert(self, hashes: np.ndarray, vals: np.ndarray) -> None:
        """Insert [n, bands] hashes for the n documents numbered `vals`, in that order."""
        if 2 * (self.size + len(vals)) > self.buckets * _WIDTH:
            self._rebuild(self.size + len(vals))
        self.size += len(vals)
        if len(vals) == 1:  # one entry per band: no two compete for a slot
            rows, key = self._rows(self._base, hashes[0]), hashes[0]
            while len(rows):
                pos = self.fill[rows]
                ok = pos < _WIDTH
                self.keys[rows[ok], pos[ok]] = key[ok]
                self.vals[rows[ok], pos[ok]] = vals[0]
                self.fill[rows[ok]] += 1
                key, rows = key[~ok], self._next(rows[~ok])
            return
        self._place(np.tile(self._base, len(vals)), hashes.reshape(-1),
                    np.repeat(vals.astype(np.int32), self.bands))

    def _place(self, band_base: np.ndarray, key: np.ndarray, val: np.ndarray) -> None:
        """Put entries into their buckets; entries of one bucket keep their given order."""
        rows = self._rows(band_base, key)
        while len(rows):
            order = np.argsort(rows, kind="stable")
            rows, key, val = rows[order], key[order], val[order]
            starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
            pos = self.fill[rows] + rank
            fits = pos < _WIDTH
            self.keys[rows[fits], pos[fits]] = key[fits]
            self.vals[rows[fits], pos[fits]] = val[fits]
            np.add.at(self.fill, rows[fits], 1)
            key, val, rows = key[~fits], val[~fits], self._next(rows[~fits])

    def _rebuild(self, need: int) -> None:
        """Grow to at least 4 * `need` slots per band and re-insert in document order."""
        used = self.vals >= 0
        band = np.nonzero(used)[0] // self.buckets
        key, val = self.keys[used], self.vals[used]
        order = np.argsort(val, kind="stable")
        buckets, size = self.buckets, self.size
        while buckets * _WIDTH < 4 * need:
            buckets *= 2
        self.__init__(self.bands, buckets)
        self.size = size
        self._place(band[order] * buckets, key[order], val[order])

    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes + self.fill.nbytes

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Every entry as (band << 32 | hash, document number), sorted by cell then number."""
        used = self.vals >= 0
        band = (np.nonzero(used)[0] // self.buckets).astype(np.uint64)
        cells = (band << np.uint64(32)) | self.keys[used].astype(np.uint64)
        vals = self.vals[used]
        order = np.lexsort((vals, cells))
        return cells[order], vals[order]


class _Segment:
    """A frozen part of the index on disk: kept documents numbered [first, first + count), as the
    sorted cells of their band table with the document number of each entry, their signatures and
    their keys (a UTF-8 blob with offsets). Every file is memory-mapped, so a lookup touches only the
    pages its binary searches visit, and nothing stays in memory between lookups."""
    _BLOCK = 1 << 20    # entries per step of a merge: its memory bound

    def __init__(self, root: Path, name: str, first: int, count: int):
        self.root, self.name, self.first, self.count = root, name, first, count
        self._maps: dict[str, np.ndarray] = {}   # mapped once: np.load parses the header each time

    def _path(self, part: str) -> Path:
        return self.root / f"near-{self.name}-{part}"

    def _load(self, part: str) -> np.ndarray:
        if part not in self._maps:
            path = self._path(part + ".npy" if part != "keys" else "keys.bin")
            self._maps[part] = (np.load(path, mmap_mode="r") if part != "keys" else
                                np.memmap(path, np.uint8, "r") if path.stat().st_size else
                                np.zeros(0, np.uint8))
        return self._maps[part]

    @classmethod
    def write(cls, root: Path, name: str, first: int, table: "_BandTable", sigs: np.ndarray,
              keys: list[str]) -> "_Segment":
        seg = cls(root, name, first, len(sigs))
        cells, numbers = table.cells()
        np.save(seg._path("cells.npy"), cells)
        np.save(seg._path("numbers.npy"), numbers.astype(np.int64))
        np.save(seg._path("sigs.npy"), sigs)
        blobs = [k.encode("utf-8") for k in keys]
        np.save(seg._path("keyends.npy"), np.cumsum([len(b) for b in blobs], dtype=np.int64))
        seg._path("keys.bin").write_bytes(b"".join(blobs))
        return seg

    def find(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, document number) of the entries under each of `cells` (uint64)."""
        table = self._load("cells")
        lo = np.searchsorted(table, cells, "left")
        n = np.searchsorted(table, cells, "right") - lo
        query = np.repeat(np.arange(len(cells)), n)
        at = np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())
        return query, np.asarray(self._load("numbers")[at])

    def sigs(self, numbers: np.ndarray) -> np.ndarray:
        return self._load("sigs")[numbers - self.first]

    def key(self, number: int) -> str:
        ends = self._load("keyends")
        i = number - self.first
        start = int(ends[i - 1]) if i else 0
        return self._load("keys")[start:int(ends[i])].tobytes().decode("utf-8")

    @classmethod
    def merge(cls, root: Path, name: str, a: "_Segment", b: "_Segment") -> "_Segment":
        """One segment of `a` and the segment `b` right after it, written a block at a time (never
        whole in memory); the inputs' files are removed."""
        seg = cls(root, name, a.first, a.count + b.count)
        ca, cb, na, nb = a._load("cells"), b._load("cells"), a._load("numbers"), b._load("numbers")
        n = len(ca) + len(cb)
        cells = np.lib.format.open_memmap(seg._path("cells.npy"), "w+", np.uint64, (n,))
        numbers = np.lib.format.open_memmap(seg._path("numbers.npy"), "w+", np.int64, (n,))
        i = j = k = 0
        while i < len(ca) or j < len(cb):
            # every entry up to `cut` from both sides; a's first on equal cells (smaller numbers)
            ends = [x[min(p + cls._BLOCK, len(x)) - 1] for x, p in ((ca, i), (cb, j)) if p < len(x)]
            cut = min(ends)
            i2, j2 = int(np.searchsorted(ca, cut, "right")), int(np.searchsorted(cb, cut, "right"))
            c = np.concatenate([ca[i:i2], cb[j:j2]])
            order = np.argsort(c, kind="stable")
            cells[k:k + len(c)] = c[order]
            numbers[k:k + len(c)] = np.concatenate([na[i:i2], nb[j:j2]])[order]
            i, j, k = i2, j2, k + len(c)
        cells.flush()
        numbers.flush()
        del cells, numbers
        sa, sb = a._load("sigs"), b._load("sigs")
        sigs = np.lib.format.open_memmap(seg._path("sigs.npy"), "w+", sa.dtype,
                                         (len(sa) + len(sb), sa.shape[1]))
        rows = max(1, cls._BLOCK // sa.shape[1])
        for dst, src in ((0, sa), (len(sa), sb)):
            for r in range(0, len(src), rows):
                part = src[r:r + rows]
                sigs[dst + r:dst + r + len(part)] = part
        sigs.flush()
        del sigs
        ea, eb = a._load("keyends"), b._load("keyends")
        ends = np.lib.format.open_memmap(seg._path("keyends.npy"), "w+", np.int64, (len(ea) + len(eb),))
        for dst, src, base in ((0, ea, 0), (len(ea), eb, int(ea[-1]) if len(ea) else 0)):
            for r in range(0, len(src), cls._BLOCK):
                ends[dst + r:dst + r + len(src[r:r + cls._BLOCK])] = src[r:r + cls._BLOCK] + base
        ends.flush()
        del ends
        with open(seg._path("keys.bin"), "wb") as out:
            for src in (a, b):
                with open(src._path("keys.bin"), "rb") as f:
                    while block := f.read(1 << 24):
                        out.write(block)
        a.remove()
        b.remove()
        return seg

    def remove(self) -> None:
        self._maps.clear()
        for part in ("cells.npy", "numbers.npy", "sigs.npy", "keyends.npy", "keys.bin"):
            self._path(part).unlink(missing_ok=True)


class NearDedup:
    """LSH index of kept documents; `add` in input order keeps the first of every near-duplicate set.

    Signatures are used through the low 16 bits of each entry (half the memory; two different
    entries agree by chance with probability 2**-16, a negligible bias of the similarity estimate):
    for the band hashes, for storage and for verification alike. `add_many` does the work of many
    `add` calls with a few vectorised steps and gives the same results.
    """

    def __init__(self, cfg: DedupConfig, texts_of: Callable[[list[str]], list[str]] | None = None,
                 spill: Path | None = None, hot_docs: int = 1 << 15):
        """`texts_of(keys)`: the texts of kept documents, for exact verification (see `_verify`);
        asked once per lookup for all the pairs it verifies, so a caller that reads texts back
        from files reads each file once.
        `spill`: a directory where the index is frozen into segments (_Segment) every `hot_docs`
        kept documents, so that memory holds at most that many signatures, table entries and
        keys; lookups then also read the segments. Segments are merged as a binary counter
        merges its digits (two of about the same size into one), so there are at most about
        log2(kept / hot_docs) + 1 of them and a chunk's lookups do not slow down with the corpus.
        The results are the same."""
        self.cfg, self.texts_of = cfg, texts_of
        self._spill, self._hot_docs = spill, hot_docs
        self._segments: list[_Segment] = []
        self._made = 0  # segments written so far (their names)
        self.frozen = 0  # times the documents in memory went to a new segment
        self._hot = 0   # number of the first document in memory (the ones before: in segments)
        t, k = cfg.threshold, cfg.num_perm
        self._margin = _VERIFY_SIGMAS * math.sqrt(t * (1 - t) / k) + 1 / k
        self.bands, self.rows = cfg.bands_rows
        self._table = _BandTable(self.bands)
        self._keys: list[str] = []     # of the documents in memory
        self._sigs = np.empty((1024, cfg.num_perm), dtype=np.uint16)
        self._band_mult = np.array([_splitmix64(0xBA9D + j) | 1 for j in range(self.rows)],
                                   dtype=np.uint64)

    def __len__(self) -> int:
        return self._hot + len(self._keys)

    def _key(self, number: int) -> str:
        """The key of kept document `number`, from memory or its segment."""
        if number >= self._hot:
            return self._keys[number - self._hot]
        return next(s for s in self._segments if number < s.first + s.count).key(number)

    def band_hashes(self, sigs: np.ndarray) -> np.ndarray:
        """[n, bands] uint32 hashes of the bands of [n, num_perm] signatures (low 16 bits used)."""
        n, sigs = sigs.shape[0], sigs.astype(np.uint16, copy=False)
        # Band b takes bins b, b + bands, b + 2 * bands, ...: spread out, because densification
        # copies values between neighbouring bins of sparse sketches.
        bands = sigs[:, :self.bands * self.rows].reshape(n, self.rows, self.bands).transpose(0, 2, 1)
        h = (bands.astype(np.uint64) * self._band_mult).sum(axis=2, dtype=np.uint64)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x9E3779B97F4A7C15)
        return (h >> np.uint64(32)).astype(np.uint32)

    def _similarity(self, kept: np.ndarray, sig16: np.ndarray) -> np.ndarray:
        return np.count_nonzero(self._kept_sigs(kept) == sig16, axis=-1) / self.cfg.num_perm

    def _kept_sigs(self, numbers: np.ndarray) -> np.ndarray:
        """The stored (16-bit) signatures of kept documents `numbers`, from memory or segments."""
        hot = numbers >= self._hot
        if hot.all():
            return self._sigs[numbers - self._hot]
        out = np.empty((len(numbers), self.cfg.num_perm), np.uint16)
        out[hot] = self._sigs[numbers[hot] - self._hot]
        for seg in self._segments:
            mine = (numbers >= seg.first) & (numbers < seg.first + seg.count)
            if mine.any():
                out[mine] = seg.sigs(numbers[mine])
        return out

    def _find(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query row, document number) pairs of every kept document sharing a band cell with
        [q, bands] hashes, from the table in memory and every segment (with repeats)."""
        rows, found = self._table.find(hashes)
        if not self._segments:
            return rows, found
        cells = ((np.arange(self.bands, dtype=np.uint64) << np.uint64(32))
                 | hashes.astype(np.uint64)).reshape(-1)
        rows, found = [rows], [found]
        for seg in self._segments:
            at, numbers = seg.find(cells)
            rows.append(at // self.bands)
            found.append(numbers)
        return np.concatenate(rows), np.concatenate(found)

    def _verify(self, sims: np.ndarray, text_a, texts_b) -> np.ndarray:
        """Estimates near the threshold replaced by the exact Jaccard similarity of the two texts
        (`text_a(i)` gives pair i's first text, `texts_b(pairs)` the second texts of a list of
        pairs); the others kept. An estimate further than
        `_margin` (VERIFY_SIGMAS standard deviations) from the threshold is on the right side of
        it with probability > 0.99999, so only the pairs in between need their texts."""
        if text_a is None or texts_b is None:
            return sims
        t = self.cfg.threshold
        pairs = np.flatnonzero((sims >= t - self._margin) & (sims < t + self._margin)).tolist()
        for i, b in zip(pairs, texts_b(pairs) if pairs else ()):
            sims[i] = exact_jaccard(text_a(i), b, self.cfg)
        return sims

    def query(self, sig: np.ndarray, text: str | None = None) -> list[tuple[str, float]]:
        """Kept documents similar to `sig` (and `text`, which turns on exact verification when the
        index has `texts_of`) at the threshold or more, best first (ties: the earliest kept first)."""
        sig16 = sig.astype(np.uint16, copy=False)[None, :]
        _, found = self._find(self.band_hashes(sig16))
        idx = np.unique(found)
        sims = self._similarity(idx, sig16)
        sims = self._verify(sims, None if text is None else (lambda i: text),
                            self.texts_of and (lambda ii: self.texts_of([self._key(int(idx[i]))
                                                                         for i in ii])))
        order = np.lexsort((idx, -sims))
        return [(self._key(int(idx[i])), float(sims[i])) for i in order
                if sims[i] >= self.cfg.threshold - 1e-12]

    def index(self, key: str, sig: np.ndarray) -> None:
        """Keep `key`: make it findable by later queries."""
        sig16 = sig.astype(np.uint16, copy=False)[None, :]
        self._index_many([key], sig16, self.band_hashes(sig16))

    def _index_many(self, keys: list[str], sigs16: np.ndarray, hashes: np.ndarray) -> None:
        n, m = len(self), len(keys)
        h = len(self._keys)   # documents in memory
        if h + m > len(self._sigs):  # grow by a quarter: little slack, and a small copy peak
            grown = np.empty((max(h + m, len(self._sigs) * 5 // 4), self.cfg.num_perm), np.uint16)
            grown[:h] = self._sigs[:h]
            self._sigs = grown
        self._sigs[h:h + m] = sigs16
        self._keys.extend(keys)
        self._table.insert(hashes, np.arange(n, n + m))
        if self._spill is not None and h + m >= self._hot_docs:
            self._freeze()

    def _freeze(self) -> None:
        """Move the documents in memory into a new segment on disk, then merge the newest two
        segments while the older is less than twice the newer."""
        self._spill.mkdir(parents=True, exist_ok=True)
        segs = self._segments
        segs.append(_Segment.write(self._spill, self._name(), self._hot, self._table,
                                   self._sigs[:len(self._keys)], self._keys))
        self.frozen += 1
        while len(segs) >= 2 and segs[-2].count < 2 * segs[-1].count:
            b, a = segs.pop(), segs.pop()
            segs.append(_Segment.merge(self._spill, self._name(), a, b))
        self._hot = len(self)
        self._keys = []
        self._table = _BandTable(self.bands)
        self._sigs = np.empty((1024, self.cfg.num_perm), dtype=np.uint16)

    def _name(self) -> str:
        self._made += 1
        return f"{self._made:06d}"

    @property
    def docs_in_memory(self) -> int:
        """Kept documents whose signatures, table entries and keys are in memory (not in segments)."""
        return len(self._keys)

    @property
    def segments(self) -> int:
        return len(self._segments)

    def add(self, key: str, sig: np.ndarray, text: str | None = None) -> tuple[str, float] | None:
        """(kept_key, similarity) if `key` near-duplicates a kept document, else None (and `key`
        is kept). The best match wins; on a tie, the earliest kept document."""
        if sig.shape != (self.cfg.num_perm,):
            raise ValueError(f"signature of {key!r} has shape {sig.shape}, "
                             f"expected ({self.cfg.num_perm},)")
        return self.add_many([key], sig[None, :], None if text is None else (lambda i: text))[0]

    def add_many(self, keys: list[str], sigs: np.ndarray,
                 text: Callable[[int], str] | None = None) -> list[tuple[str, float] | None]:
        """Exactly what `add` would return for each (key, sig) in order, computed in bulk: the
        matches among documents kept before the batch are found vectorised, those within the batch
        through a small dict of the batch's kept documents. `text(j)`: the text of batch row j,
        for exact verification (with `texts_of`)."""
        if sigs.ndim != 2 or sigs.shape != (len(keys), self.cfg.num_perm):
            raise ValueError(f"signatures have shape {sigs.shape}, expected "
                             f"({len(keys)}, {self.cfg.num_perm})")
        sig16 = sigs.astype(np.uint16, copy=False)
        hashes = self.band_hashes(sig16)
        earlier = self._matches_in_index(sig16, hashes, text)
        cells = self._shared_cells(hashes)
        n0, threshold = len(self), self.cfg.threshold - 1e-12
        batch_cells: dict[int, list[int]] = {}  # band cell -> kept batch rows
        number_of: dict[int, int] = {}          # kept batch row -> document number
        kept_rows: list[int] = []
        results: list[tuple[str, float] | None] = []
        for j in range(len(keys)):
            best = earlier.get(j)  # (similarity, document number)
            cand = {i for c in cells[j] for i in batch_cells.get(c, ())} if cells[j] else ()
            if cand:
                rows = np.fromiter(sorted(cand), dtype=np.int64, count=len(cand))
                sims = np.count_nonzero(sig16[rows] == sig16[j], axis=1) / self.cfg.num_perm
                sims = self._verify(sims, text and (lambda i: text(j)),
                                    text and self.texts_of and (lambda ii: [text(int(rows[i]))
                                                                            for i in ii]))
                for i, sim in zip(rows.tolist(), sims.tolist()):
                    number = number_of[i]
                    if sim >= threshold and (best is None or sim > best[0]
                                             or (sim == best[0] and number < best[1])):
                        best = (sim, number)
            if best is None:
                number_of[j] = n0 + len(kept_rows)
                kept_rows.append(j)
                for c in cells[j]:
                    batch_cells.setdefault(c, []).append(j)
                results.append(None)
            else:
                results.append((self._key_of(best[1], keys, kept_rows, n0), float(best[0])))
        if kept_rows:
            rows = np.array(kept_rows)
            self._index_many([keys[r] for r in kept_rows], sig16[rows], hashes[rows])
        return results

    def _shared_cells(self, hashes: np.ndarray) -> list[list[int]]:
        """Per batch row, its (band, hash) cells that another row of the batch shares: only those
        can link two documents of the batch."""
        m = len(hashes)
        cells = ((np.arange(self.bands, dtype=np.uint64) << np.uint64(32)) | hashes).reshape(-1)
        order = np.argsort(cells, kind="stable")
        same = cells[order[1:]] == cells[order[:-1]]
        shared = np.zeros(len(cells), dtype=bool)
        shared[order[1:][same]] = True
        shared[order[:-1][same]] = True
        out: list[list[int]] = [[] for _ in range(m)]
        rows = np.flatnonzero(shared) // self.bands
        for row, cell in zip(rows.tolist(), cells[shared].tolist()):
            out[row].append(cell)
        return out

    def _key_of(self, number: int, keys: list[str], kept_rows: list[int], n0: int) -> str:
        return self._key(number) if number < n0 else keys[kept_rows[number - n0]]

    def _matches_in_index(self, sig16: np.ndarray, hashes: np.ndarray, text=None) -> dict[int, tuple]:
        """Batch row -> (similarity, document number) of its best verified match among kept docs."""
        if not len(self):
            return {}
        rows, found = self._find(hashes)
        if len(rows) == 0:
            return {}
        pairs = np.unique((rows.astype(np.int64) << 32) | found.astype(np.int64))
        rows, numbers = pairs >> 32, pairs & 0xFFFFFFFF
        sims = np.empty(len(pairs))
        for i in range(0, len(pairs), 4096):  # bounded memory for the comparison
            s = slice(i, i + 4096)
            sims[s] = np.count_nonzero(self._kept_sigs(numbers[s]) == sig16[rows[s]], axis=1)
        sims /= self.cfg.num_perm
        sims = self._verify(sims, text and (lambda i: text(int(rows[i]))),
                            self.texts_of and (lambda ii: self.texts_of([self._key(int(numbers[i]))
                                                                         for i in ii])))
        ok = sims >= self.cfg.threshold - 1e-12
        best: dict[int, tuple] = {}
        for row, number, sim in zip(rows[ok].tolist(), numbers[ok].tolist(), sims[ok].tolist()):
            # numbers ascend within a row: the first of equals is the earliest kept
            if row not in best or sim > best[row][0]:
                best[row] = (sim, number)
        return best

    def nbytes(self) -> int:
        """Memory held by the signatures and band tables (keys not counted)."""
        return self._sigs.nbytes + self._table.nbytes()
