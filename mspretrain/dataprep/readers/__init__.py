"""Corpus readers: the input files of a build, and the documents and bad records each one holds.

- listing.py: INPUT paths to `InputFile`s, and what a directory holds that is not read;
- registry.py: the formats by suffix (`register`), `read_file` and `split_input`;
- compressed.py: gzip / zstd decoded incrementally, damage found and named;
- binary.py: binary content found before a file is read as text;
- lines.py: capped lines, shared by the line-based formats;
- one file per format: jsonl.py (.jsonl .ndjson .json), parquet.py (.parquet), text.py (the rest).

Record types (`InputFile`, `Document`, `BadRecord`) live in dataprep/records.py.
"""
from mspretrain.dataprep.records import BadRecord, Document, InputFile
from mspretrain.dataprep.readers.listing import LEFT_OUT, InputPathError, list_inputs
from mspretrain.dataprep.readers.compressed import COMPRESSION_SUFFIXES, Damaged
from mspretrain.dataprep.readers.lines import TooLong, capped_lines
from mspretrain.dataprep.readers.registry import (ID_SCOPES, PLUGIN_GROUP, TEXT_UNITS, Format,
                                                  ReaderPluginError, ReadOptions, file_format,
                                                  format_of, in_process_sources, load_sources,
                                                  read_file, register, split_input, splittable,
                                                  this_process_only)
# the built-in formats, registered as they are imported
from mspretrain.dataprep.readers.jsonl import read_jsonl, split_jsonl
from mspretrain.dataprep.readers.parquet import read_parquet, split_parquet
from mspretrain.dataprep.readers.text import read_text

__all__ = ["BadRecord", "COMPRESSION_SUFFIXES", "Damaged", "Document", "Format", "ID_SCOPES",
           "InputFile", "InputPathError", "LEFT_OUT", "PLUGIN_GROUP", "ReadOptions",
           "ReaderPluginError", "TEXT_UNITS", "TooLong", "capped_lines", "file_format",
           "format_of", "in_process_sources", "list_inputs", "load_sources", "read_file",
           "read_jsonl", "read_parquet", "read_text",
           "register", "split_input", "split_jsonl", "split_parquet", "splittable",
           "this_process_only"]
