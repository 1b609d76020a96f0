"""The chain of per-document steps of a build, built from its config, and the per-worker state that
goes with it (the memo of repeated documents, the loaded evaluation index and quality model).

Order: normalise, identify the language, the heuristic quality filters, the language filter,
decontamination, PII, the quality classifier. A step that is configured off is not in the chain."""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Mapping

import numpy as np

from mspretrain.dataprep.steps import decontam, filters, langid, pii, quality
from mspretrain.dataprep.steps.base import NO_METADATA, Step, StepDoc
from mspretrain.dataprep.steps.clean import normalize


class Normalize(Step):
    name = "normalize"

    def __call__(self, doc: StepDoc) -> str:
        doc.text = normalize(doc.text)
        return ""


class LanguageId(Step):
    name = "language_id"

    def __call__(self, doc: StepDoc) -> str:
        lang, doc.attrs["language_score"], doc.attrs["language_unplaced"] = langid.classify(doc.text)
        doc.attrs["language"], doc.attrs["script"] = lang, langid.script(doc.text, lang)
        return ""


class QualityFilters(Step):
    name = "quality_filters"
    reasons = filters.FILTER_NAMES

    def __init__(self, cfg: filters.FilterConfig):
        self.cfg = cfg

    def __call__(self, doc: StepDoc) -> str:
        return filters.quality_reason(doc.text, self.cfg) or ""


class LanguageFilter(Step):
    name = "language_filter"
    reasons = ("language", "language_score")

    def __init__(self, languages: tuple[str, ...], min_score: float, undetermined: str = "drop"):
        self.languages, self.min_score, self.undetermined = languages, min_score, undetermined

    def __call__(self, doc: StepDoc) -> str:
        a = doc.attrs
        return langid.language_reason(a["language"], a["language_score"], self.languages,
                                      self.min_score, self.undetermined) or ""


class Decontaminate(Step):
    """Drop a document holding evaluation text, or cut that text out (`decontam.action`)."""
    name = "decontaminate"
    reasons = ("decontam",)

    def __init__(self, cfg: decontam.DecontamConfig, min_chars: int):
        self.cfg, self.min_chars = cfg, min_chars
        self.index = decontam.EvalIndex([it for f in cfg.files for it in decontam.read_items(f, cfg.text_field)],
                                        cfg.ngram)

    def __call__(self, doc: StepDoc) -> str:
        items, spans = self.index.find(doc.text)
        if not items:
            return ""
        doc.attrs["decontam"] = items
        if self.cfg.action == "drop":
            return "decontam"
        doc.text = decontam.cut(doc.text, spans)
        return "decontam" if len(doc.text) < self.min_chars else ""


class RedactPii(Step):
    """Count personal data; redact it (the default), drop the document, or keep it as it is."""
    name = "pii"
    reasons = ("pii",)

    def __init__(self, cfg: pii.PiiConfig):
        self.cfg, self.phones = cfg, pii.PhoneCheck(cfg.phone_regions)

    def __call__(self, doc: StepDoc) -> str:
        redacted, doc.attrs["pii"] = pii.redact(doc.text, self.phones)
        if doc.attrs["pii"] and self.cfg.action == "drop":
            return "pii"
        if self.cfg.action == "redact":
            doc.text = redacted
        return ""


class QualityClassifier(Step):
    name = "quality_classifier"
    reasons = ("quality",)

    def __init__(self, cfg: quality.QualityFilterConfig):
        self.model, self.threshold = quality.QualityModel.load(cfg.model), cfg.threshold

    def __call__(self, doc: StepDoc) -> str:
        doc.attrs["quality"] = self.model.score(doc.text)
        return "quality" if doc.attrs["quality"] < self.threshold else ""


def build_steps(f: filters.FilterConfig, d: decontam.DecontamConfig, p: pii.PiiConfig) -> list[Step]:
    """The chain for a build's filters, decontamination and PII config, in pipeline order."""
    steps = [Normalize(), LanguageId(), QualityFilters(f),
             LanguageFilter(f.languages, f.min_language_score, f.undetermined)]
    if d.files:
        steps.append(Decontaminate(d, f.min_chars))
    steps.append(RedactPii(p))
    if f.quality.model:
        steps.append(QualityClassifier(f.quality))
    return steps


@dataclass
class DocResult:
    """What the pipeline computes for one raw text: the cleaned text, the drop reason ("" when
    kept), the attributes, and for a kept text its exact key and MinHash row (filled in once the
    chunk's new signatures are computed)."""
    clean: str
    reason: str
    attrs: dict
    key: bytes | None
    sig: np.ndarray | None = None


class DocMemo:
    """DocResults by raw text, the most recently used last, holding at most `budget` characters of
    raw and cleaned text. Corpora repeat whole documents (licences, boilerplate, mirrored pages); a
    worker that meets one again takes its result from here. Every step is pure, so the bytes written
    are the same with or without it, in any worker; only the time differs. Keyed by the text itself:
    a str caches its hash, and a hit costs one comparison, cheaper than a digest of every text. (A
    pipeline whose steps read metadata keys by (text, metadata): Pipeline.result.)"""

    def __init__(self, budget: int = 32 << 20):
        self.budget, self.size = budget, 0
        self._items: OrderedDict[Hashable, tuple[DocResult, int]] = OrderedDict()

    def get(self, key: Hashable) -> DocResult | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Hashable, result: DocResult) -> None:
        text = key if isinstance(key, str) else key[0]
        size = len(text) + len(result.clean)
        if size > self.budget // 4:   # a huge document would push out everything
            return
        self._items[key] = result, size
        self.size += size
        while self.size > self.budget:
            _, (_, gone) = self._items.popitem(last=False)
            self.size -= gone


class Pipeline:
    """The steps of one build and the state a worker keeps while it serves that build."""

    # every drop reason a chain can return, in check order (the report's order)
    reasons = (QualityFilters.reasons + LanguageFilter.reasons + Decontaminate.reasons
               + RedactPii.reasons + QualityClassifier.reasons)

    def __init__(self, steps: list[Step], key_of, memo: DocMemo | None = None):
        self.steps, self.key_of = steps, key_of
        self.memo = DocMemo() if memo is None else memo
        self.reads_metadata = any(step.reads_metadata for step in steps)

    def process(self, text: str, metadata: Mapping = NO_METADATA) -> tuple[str, str, dict]:
        """(cleaned text, drop reason or "", attributes) of one raw text: every step in turn, up to
        the first that drops it."""
        doc = StepDoc(text, metadata=metadata)
        for step in self.steps:
            reason = step(doc)
            if reason:
                return doc.text, reason, doc.attrs
        return doc.text, "", doc.attrs

    def result(self, text: str, new: list[DocResult], metadata: Mapping = NO_METADATA) -> DocResult:
        """The DocResult of a raw text (and its metadata, for steps that read it), from the memo or
        computed (a computed kept one is appended to `new`, whose MinHash rows the caller fills in,
        a chunk at a time)."""
        key = (text, _canonical(metadata)) if self.reads_metadata else text
        result = self.memo.get(key)
        if result is None:
            clean, reason, attrs = self.process(text, metadata)
            result = DocResult(clean, reason, attrs, None if reason else self.key_of(clean))
            if not reason:
                new.append(result)
            self.memo.put(key, result)
        return result

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)


def _canonical(metadata: Mapping) -> str:
    """One string per distinct metadata, whatever its key order (the memo's key holds it)."""
    return json.dumps(dict(metadata), sort_keys=True, ensure_ascii=False, default=repr)
