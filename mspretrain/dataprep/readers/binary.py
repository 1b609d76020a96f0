"""Binary-file detection by content, before a file is read as text.

A text reader fed an executable or an image still finds printable runs in it (help text, symbol
names, config snippets) that pass every quality filter; so a file whose first bytes look binary is
skipped whole, and never read line by line. The signals, any one of which is enough:
  - a NUL byte (text in UTF-8 has none; UTF-16 text is not readable as UTF-8 anyway);
  - a known binary magic number at offset 0 (ELF, PE, Mach-O, images, archives, PDF, ...);
  - more than `MAX_INVALID_SHARE` of the bytes are not valid UTF-8 (a Latin-1 text file has a few
    per cent; a binary blob has about half).
"""
from __future__ import annotations

HEAD_BYTES = 1 << 16          # bytes looked at: enough for a verdict, cheap for a 10^5-file corpus
MAX_INVALID_SHARE = 0.10

MAGIC = {
    b"\x7fELF": "ELF executable",
    b"MZ": "Windows executable",
    b"\xcf\xfa\xed\xfe": "Mach-O executable",
    b"\xfe\xed\xfa\xcf": "Mach-O executable",
    b"\xca\xfe\xba\xbe": "Mach-O universal binary / Java class",
    b"\x89PNG\r\n\x1a\n": "PNG image",
    b"\xff\xd8\xff": "JPEG image",
    b"GIF87a": "GIF image",
    b"GIF89a": "GIF image",
    b"%PDF-": "PDF document",
    b"PK\x03\x04": "zip archive",
    b"\x1f\x8b": "gzip data",
    b"\x28\xb5\x2f\xfd": "zstd data",
    b"BZh": "bzip2 data",
    b"\xfd7zXZ\x00": "xz data",
    b"7z\xbc\xaf\x27\x1c": "7z archive",
    b"PAR1": "parquet file",
    b"SQLite format 3\x00": "SQLite database",
    b"\x00asm": "WebAssembly module",
}


def binary_reason(head: bytes) -> str | None:
    """Why `head` (the first bytes of a file, decompressed) is binary, or None for text."""
    if not head:
        return None
    for magic, what in MAGIC.items():
        if head.startswith(magic):
            if magic == b"MZ" and len(head) < 64:   # "MZ" alone may start a short text file
                continue
            return f"binary content ({what}, magic bytes {magic[:8]!r})"
    nul = head.find(b"\x00")
    if nul >= 0:
        return f"binary content (NUL byte at offset {nul})"
    invalid = _invalid_utf8_bytes(head)
    if invalid > MAX_INVALID_SHARE * len(head):
        return (f"binary content ({invalid} of the first {len(head)} bytes are not valid UTF-8, "
                f"over {MAX_INVALID_SHARE:.0%})")
    return None


def _invalid_utf8_bytes(data: bytes) -> int:
    """About how many bytes of `data` are not valid UTF-8: the replacement characters a lenient
    decode inserts (one per invalid byte or cut sequence), less those the data itself holds."""
    return data.decode("utf-8", errors="replace").count("\ufffd") - data.count(b"\xef\xbf\xbd")
