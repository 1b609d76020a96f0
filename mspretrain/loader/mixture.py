"""A Loader over a mixture: blend weights that change in phases of the stream (blend.MixtureSchedule).

The loader state contract holds unchanged: the sample at global position c is a pure function of (seed,
the sources, the phases, c), so the cursor alone resumes it, on any dp size. What the state adds is the
mixture's identity: its fingerprint covers each source's fingerprint and every phase's end and
quantised weights, so a state of another mixture is refused like one of another dataset.
"""
from __future__ import annotations

import hashlib
import os

from mspretrain.loader.blend import MixtureSchedule
from mspretrain.loader.core import Loader
from mspretrain.loader.manifest import canonical_json


class MixtureLoader(Loader):
    """`Loader` whose positions follow `schedule` over `sources` (dirs, in the order the schedule's
    source indices refer to). Keyword arguments as Loader's; batch["source"] indexes `sources`."""

    def __init__(self, sources: list[str | os.PathLike], schedule: MixtureSchedule, split: str = "train",
                 **kwargs):
        if len(set(map(str, sources))) != len(sources) or schedule.num_sources != len(sources):
            raise ValueError("MixtureLoader: the sources must be distinct and match the schedule")
        super().__init__({str(s): 1.0 for s in sources}, split, **kwargs)
        self.follow_schedule(schedule)
        self.schedule = schedule
        parts = {"sources": [s["fingerprint"] for s in self.sources],
                 "phases": [[int(end) for end in schedule.ends], schedule.counts]}
        self.fingerprint = hashlib.sha256(canonical_json({"mixture": parts}).encode()).hexdigest()

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["sources"] = [{"fingerprint": s["fingerprint"], "num_samples": s["num_samples"]}
                            for s in self.sources]
        state["mixture"] = {"ends": [int(e) for e in self.schedule.ends], "counts": self.schedule.counts}
        return state
