"""The one interface of a per-document step, and the document as the steps see it.

A step reads `doc.text` and `doc.attrs`, may rewrite either, and returns "" to keep the document or
the reason it is dropped (a short stable code, counted in the report). Steps are pure functions of
the document and of what they were built with, so every engine and worker count writes the same
bytes. `Pipeline` (steps/pipeline.py) builds the chain from the config and runs it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepDoc:
    text: str
    attrs: dict = field(default_factory=lambda: {"language": "", "script": "", "language_score": 0.0,
                                                   "quality": None, "pii": {}, "decontam": []})


class Step:
    """One per-document step. `name` is its name in the pipeline; `reasons` are the drop reasons it
    can return (the report lists them in pipeline order)."""
    name = ""
    reasons: tuple[str, ...] = ()

    def __call__(self, doc: StepDoc) -> str:
        raise NotImplementedError
