"""Decompression for the readers: gzip members and zstd frames decoded incrementally, so that a
damaged stream still gives every line decoded before the damage.

A damaged compressed stream yields every byte decoded before the damage, then raises `Damaged`
(reason "truncated_compressed" | "corrupt_compressed"), which the format's reader turns into a
BadRecord naming the first line not read whole. A gzip member that fails its check (CRC or data)
cannot be trusted anywhere, the CRC being at its end: gzip files are checked first
(`gzip_damage`), and the stream stops at the start of the damaged member.
"""
from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import BinaryIO

import zstandard

COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
CHUNK = 1 << 16        # bytes per read of an input file
_FEED = 1 << 13        # compressed bytes per decompress call


class Damaged(Exception):
    """A compressed stream ended early or is corrupt; `reason` is the BadRecord code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def compression_of(path: Path) -> tuple[list[str], str | None]:
    """(the name's suffixes, lowercased, without the compression one; gzip, zstd or None)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSION_SUFFIXES.get(suffixes[-1]) if suffixes else None
    return (suffixes[:-1] if compression else suffixes), compression


def decompressed(raw: BinaryIO, compression: str | None, stop=None) -> BinaryIO:
    """`raw` as its decompressed bytes (`raw` itself when not compressed); `stop`: see StreamRaw."""
    if compression:
        return io.BufferedReader(StreamRaw(raw, compression, stop), CHUNK)
    return raw


def gzip_damage(path: Path) -> tuple[int, str] | None:
    """(decompressed offset, why) of the first gzip member that fails its check, or None.

    A gzip member's CRC comes at its end, so a flipped byte in a stored (level 0) member, or one
    that still inflates, shows only after every line of the member has been read: nothing of that
    member can be trusted, the lines before the damage included. So gzip files are checked first,
    member by member (one more decompression, no more memory than the reader's), and the reader
    stops at the start of a damaged member. A stream that is only cut short passes here: the
    reader reports it where it ends."""
    offset, start, obj = 0, 0, None
    try:
        with open(path, "rb", buffering=CHUNK) as f:
            while chunk := f.read(CHUNK):
                for i in range(0, len(chunk), _FEED):
                    data = chunk[i:i + _FEED]
                    while data:
                        if obj is None or obj.eof:
                            if obj is not None:
                                data = data.lstrip(b"\0")
                                if not data:
                                    break
                            obj, start = zlib.decompressobj(31), offset
                        offset += len(obj.decompress(data))
                        data = obj.unused_data if obj.eof else b""
    except zlib.error as e:
        return start, (f"gzip member from decompressed byte {start} fails its check ({e}): none "
                       f"of its lines can be trusted")
    except OSError:
        return None      # the reader reports what it cannot read
    return None


class StreamRaw(io.RawIOBase):
    """Decompresses every gzip member or zstd frame of `raw`, incrementally: every byte decoded
    before a damage is delivered first, and only then does the damage raise Damaged. So the lines
    before a cut or a corrupt spot all reach the reader (gzip.GzipFile would drop the whole
    buffered block around it). Input is fed in small pieces, so that a corrupt spot costs at most
    the output of one piece (zstd decodes whole blocks: there, the block it hits)."""

    def __init__(self, raw: BinaryIO, compression: str, stop: tuple[int, str] | None = None):
        self._raw, self._gzip = raw, compression == "gzip"
        self._stop, self._decoded = stop, 0    # (offset, why): deliver nothing from there on
        self._name = "gzip" if self._gzip else "zstd"
        self._dctx = None if self._gzip else zstandard.ZstdDecompressor()
        self._obj = None                     # decompressor of the current member or frame
        self._pending, self._pos = b"", 0    # decoded bytes not yet delivered
        self._damage: Damaged | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos == len(self._pending):
            if self._damage is not None:
                raise self._damage
            if not self._fill():
                return 0
        n = min(len(buf), len(self._pending) - self._pos)
        buf[:n] = self._pending[self._pos:self._pos + n]
        self._pos += n
        return n

    def _fill(self) -> bool:
        """Decode one more input chunk into _pending; False at a clean end of the stream."""
        chunk = self._raw.read(CHUNK)
        if not chunk:
            if self._obj is not None and not self._obj.eof:
                self._damage = Damaged("truncated_compressed",
                                       f"{self._name} stream ends early (cut short)")
                return True
            return False
        out = []
        for i in range(0, len(chunk), _FEED):
            try:
                self._decode(chunk[i:i + _FEED], out)
            except (zlib.error, zstandard.ZstdError) as e:
                self._damage = Damaged("corrupt_compressed", f"{self._name} stream is corrupt: {e}")
                break
        self._pending, self._pos = b"".join(out), 0
        if self._stop is not None and self._decoded + len(self._pending) >= self._stop[0]:
            self._pending = self._pending[:self._stop[0] - self._decoded]
            self._damage = Damaged("corrupt_compressed", self._stop[1])
        self._decoded += len(self._pending)
        return True

    def _decode(self, data: bytes, out: list) -> None:
        while data:
            if self._obj is None or self._obj.eof:   # the next gzip member / zstd frame
                if self._gzip and self._obj is not None:
                    data = data.lstrip(b"\0")       # zero padding after a member (as gzip allows)
                    if not data:
                        return
                self._obj = zlib.decompressobj(31) if self._gzip else self._dctx.decompressobj()
            out.append(self._obj.decompress(data))
            data = self._obj.unused_data if self._obj.eof else b""
