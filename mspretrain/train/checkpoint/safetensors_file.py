"""The model file in safetensors format (checkpoint.format: safetensors): model.safetensors, byte for
byte what `ms.save_checkpoint(..., format="safetensors")` writes for the same tensors (tested): the
`safetensors` library's layout with MindSpore's metadata {"format": "ms"}, so that
`ms.load_checkpoint(path, format="safetensors")`, MindFormers' loaders and `safetensors.safe_open`
all read it.

A synchronous write goes through the library (`serialize_file`, from views of the host tensors). A
background write's image (format.ModelImage) needs each tensor's offset in the file before any byte
is written, to copy the tensor straight to its place in one page-aligned buffer that goes to the disk
past the page cache; the library only writes whole files through its own buffers, so `layout`
encodes the header here, to the library's rules (tensors by dtype, largest first, then by name; the
JSON padded with spaces to 8 bytes), and the tests hold it to the library's bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from mspretrain.train.checkpoint.layout import CheckpointError

METADATA = {"format": "ms"}         # what ms.save_checkpoint(format="safetensors") records

# MindSpore's dtype name -> (the library's TensorSpec name, the header's code); in the library's
# order of dtypes, from the last in a file to the first
_DTYPES = {"Bool": ("bool", "BOOL"), "UInt8": ("uint8", "U8"), "Int8": ("int8", "I8"),
           "Int16": ("int16", "I16"), "UInt16": ("uint16", "U16"), "Float16": ("float16", "F16"),
           "BFloat16": ("bfloat16", "BF16"), "Int32": ("int32", "I32"), "UInt32": ("uint32", "U32"),
           "Float32": ("float32", "F32"), "Float64": ("float64", "F64"), "Int64": ("int64", "I64"),
           "UInt64": ("uint64", "U64")}
_RANK = {ms_name: i for i, ms_name in enumerate(_DTYPES)}


def _check_dtypes(tensors) -> None:
    bad = sorted({f"{t.name} ({t.dtype})" for t in tensors if t.dtype not in _DTYPES})
    if bad:
        raise CheckpointError(f"checkpoint.format safetensors: no safetensors dtype for {', '.join(bad[:5])}; "
                              f"set checkpoint.format=ckpt")


def write(path, tensors, bytes_of) -> dict:
    """Write `tensors` (format.HostTensor list) to `path` with the library, fsync it, and return the
    {"sha256", "bytes"} of the file as it is on disk (read back: the library writes it itself)."""
    from safetensors import TensorSpec, serialize_file

    _check_dtypes(tensors)
    keep, specs = [], {}
    for t in tensors:
        data = np.frombuffer(bytes_of(t.data), np.uint8)
        keep.append(data)           # the library reads the bytes through their address
        specs[t.name] = TensorSpec(dtype=_DTYPES[t.dtype][0], shape=list(t.dims),
                                   data_ptr=data.ctypes.data if len(data) else 0, data_len=len(data))
    serialize_file(specs, str(path), METADATA)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"sha256": digest, "bytes": os.path.getsize(path)}


def layout(tensors, sizes: list[int]) -> tuple[bytes, list[int], int]:
    """The file's head (length and JSON header), the offset in the file of each tensor's bytes (in
    the order of `tensors`; `sizes`: their lengths), and the file's length."""
    _check_dtypes(tensors)
    order = sorted(range(len(tensors)), key=lambda i: (-_RANK[tensors[i].dtype], tensors[i].name.encode()))
    header, at = {"__metadata__": METADATA}, 0
    starts = [0] * len(tensors)
    for i in order:
        t = tensors[i]
        header[t.name] = {"dtype": _DTYPES[t.dtype][1], "shape": list(t.dims), "data_offsets": [at, at + sizes[i]]}
        starts[i], at = at, at + sizes[i]
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return head, [len(head) + s for s in starts], len(head) + at
