"""The one interface of a per-document step, and the document as the steps see it.

A step reads `doc.text` and `doc.attrs`, may rewrite either, and returns "" to keep the document or
the reason it is dropped (a short stable code, counted in the report). A step that declares
`reads_metadata` may also read `doc.metadata`, what the reader knew of the record besides its text
(records.Document.metadata), read-only. Steps are pure functions of the document and of what they
were built with, so every engine and worker count writes the same bytes. `Pipeline`
(steps/pipeline.py) builds the chain from the config and runs it."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

NO_METADATA: Mapping = MappingProxyType({})


@dataclass
class StepDoc:
    text: str
    attrs: dict = field(default_factory=lambda: {"language": "", "script": "", "language_score": 0.0,
                                                   "language_unplaced": False,
                                                   "quality": None, "pii": {}, "decontam": []})
    metadata: Mapping = field(default_factory=lambda: NO_METADATA)

    def __post_init__(self):
        if self.metadata:   # a view: a step cannot change what the next one, or the memo, sees
            self.metadata = MappingProxyType(dict(self.metadata))


class Step:
    """One per-document step. `name` is its name in the pipeline; `reasons` are the drop reasons it
    can return (the report lists them in pipeline order); `reads_metadata`: whether its result
    depends on `doc.metadata` (the pipeline then tells documents apart by it, not by text alone)."""
    name = ""
    reasons: tuple[str, ...] = ()
    reads_metadata = False

    def __call__(self, doc: StepDoc) -> str:
        raise NotImplementedError
