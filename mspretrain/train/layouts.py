"""Recompute by cost: `train estimate`'s search for the fastest layout that fits.

A layout is a recompute setting (none; select recompute of attention, or full recompute, of the
first N layers of each pipeline stage, N as small as fits), a micro-batch (train.micro_batch_size, or
parallel.micro_batch_num with pipeline stages: more accumulation, fewer activations) and
dp x mp x pp at the same world size, model_parallel up to topology.MP_ADVISED_MAX (and the config's
own), with the config's optimizer sharding. Memory is memory.estimate's, time steptime.step_time's;
the fastest layout whose estimate fits under the device less the margin wins, ties going to the
larger micro-batch (the model does not price small matmuls), then to less recompute.
"""
from __future__ import annotations

from dataclasses import dataclass

from mspretrain.train import memory
from mspretrain.train.memory import GB, _valid, _with, advise, diff_sets, estimate, format_advice
from mspretrain.train.parallel.plan import stage_layers
from mspretrain.train.parallel.recompute import recompute_plan
from mspretrain.train.parallel.topology import MP_ADVISED_MAX
from mspretrain.train.step.batching import local_batch, micro_batch, micro_batches
from mspretrain.train.steptime import StepTime, assumptions, step_time


@dataclass(frozen=True)
class Option:
    cfg: object
    memory: float               # estimate().total, bytes
    time: StepTime

    def fits(self, usable: float) -> bool:
        return self.memory <= usable


def evaluate(cfg, seq: int, vocab: int) -> Option:
    rplan = recompute_plan(cfg.recompute, cfg.model.num_layers)
    return Option(cfg, estimate(cfg, seq, vocab).total, step_time(cfg, seq, vocab, rplan))


# ---------------------------------------------------------------- recompute of a layer range

def first_layers(cfg, n: int) -> str:
    """The first n layers of each pipeline stage, as layer ranges: "0-3,20-23"."""
    p = cfg.parallel
    chosen = [i for layers in stage_layers(cfg.model.num_layers, p.pipeline_stage, p.stage_offsets)
              for i in layers[:n]]
    runs: list[list[int]] = []
    for i in chosen:                    # adjacent stages' ranges merge: "0-39", not "0-19,20-39"
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def with_recompute(cfg, mode: str, n: int = 0):
    """cfg with recompute `mode` (none | select | full) on the first n layers of each stage."""
    if mode == "none":
        return _with(cfg, recompute={"mode": "none", "select": {}, "full_layers": ""})
    ranges = first_layers(cfg, n)
    if mode == "select":
        return _with(cfg, recompute={"mode": "select", "select": {"attention": ranges}, "full_layers": ""})
    every = n >= _longest_stage(cfg)
    return _with(cfg, recompute={"mode": "full", "select": {}, "full_layers": "" if every else ranges})


def _longest_stage(cfg) -> int:
    p = cfg.parallel
    return max(len(s) for s in stage_layers(cfg.model.num_layers, p.pipeline_stage, p.stage_offsets))


def least(cfg, mode: str, seq: int, vocab: int, usable: float) -> Option | None:
    """`mode` recompute on the fewest first layers of each stage that fit (memory falls as N grows)."""
    top = _longest_stage(cfg)
    if not evaluate(with_recompute(cfg, mode, top), seq, vocab).fits(usable):
        return None
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        if evaluate(with_recompute(cfg, mode, mid), seq, vocab).fits(usable):
            hi = mid
        else:
            lo = mid + 1
    return evaluate(with_recompute(cfg, mode, hi), seq, vocab)


def fastest_recompute(cfg, seq: int, vocab: int, usable: float) -> Option | None:
    """The fastest recompute that fits on cfg's layout and micro-batch: none when it fits (recompute
    only adds time), else the quicker of the least select and the least full recompute."""
    none = evaluate(with_recompute(cfg, "none"), seq, vocab)
    if none.fits(usable):
        return none
    found = [o for o in (least(cfg, m, seq, vocab, usable) for m in ("select", "full")) if o]
    return min(found, key=lambda o: o.time.total, default=None)


# ---------------------------------------------------------------- micro-batches and dp x mp x pp

def _layouts(cfg):
    """dp x mp x pp at cfg's world size; the config's own first."""
    p = cfg.parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    yield cfg
    widths = [m for m in (1, 2, 4, 8, 16, 32) if m <= min(MP_ADVISED_MAX, p.devices_per_node)]
    for mp in widths:
        for pp in (1, 2, 4, 8):
            if world % (mp * pp) or pp > cfg.model.num_layers or (mp, pp) == (p.model_parallel, p.pipeline_stage):
                continue
            dp = world // (mp * pp)
            yield _with(cfg, parallel={
                "data_parallel": dp, "model_parallel": mp, "pipeline_stage": pp, "stage_offsets": [],
                "sequence_parallel": p.sequence_parallel and mp > 1,
                "optimizer_shard": p.optimizer_shard and dp > 1,
                "vocab_emb_dp": p.vocab_emb_dp or mp == 1})


def _micro_batches(cfg):
    """cfg at every micro-batch its per-rank batch allows (pipeline: every micro_batch_num >= pp)."""
    p, local = cfg.parallel, local_batch(cfg)
    for d in (d for d in range(1, local + 1) if local % d == 0):
        if p.pipeline_stage > 1:
            if d >= p.pipeline_stage:
                yield _with(cfg, parallel={"micro_batch_num": d}, train={"micro_batch_size": 0})
        else:
            size = 0 if d == local and not cfg.train.micro_batch_size else d
            yield _with(cfg, parallel={"micro_batch_num": 1}, train={"micro_batch_size": size})


def fastest(cfg, seq: int, vocab: int, usable: float) -> Option | None:
    """The fastest valid layout that fits under `usable` bytes; None when none does."""
    best = None
    for layout in _layouts(cfg):
        for candidate in _micro_batches(layout):
            if not _valid(candidate):
                continue
            option = fastest_recompute(candidate, seq, vocab, usable)
            if option and (best is None or _rank(option) < _rank(best)):
                best = option
    return best


def _rank(option: Option) -> tuple:
    return round(option.time.total, 3), -micro_batch(option.cfg), option.time.recompute


# ---------------------------------------------------------------- printing

def recompute_label(cfg) -> str:
    r = cfg.recompute
    if r.mode == "select":
        return "select " + ", ".join(f"{k} {v}" for k, v in r.select.items())
    return r.mode + (f" {r.full_layers or f'0-{cfg.model.num_layers - 1}'}" if r.mode == "full" else "")


def describe(cfg) -> str:
    p = cfg.parallel
    return (f"dp {p.data_parallel} x mp {p.model_parallel} x pp {p.pipeline_stage}, micro-batch "
            f"{micro_batch(cfg)} x {micro_batches(cfg)}, recompute {recompute_label(cfg)}")


def _seconds(t: StepTime) -> str:
    return (f"{t.total:7.2f} s  (compute {t.compute:.2f} + recompute {t.recompute:.2f} + comm {t.comm:.2f} "
            f"+ bubble {t.bubble:.2f})")


def format_time(cfg, seq: int, vocab: int) -> str:
    t = evaluate(cfg, seq, vocab).time
    return f"step time (model) {_seconds(t)}\n  {assumptions(cfg)}"


def _line(option: Option, usable: float, label: str) -> str:
    mark = "fits" if option.fits(usable) else "    "
    return f"  {mark} {option.memory / GB:7.2f} GB {_seconds(option.time)}  {label}"


def report(cfg, seq: int, vocab: int, usable: float) -> str:
    """The recompute options of cfg's layout and micro-batch, then the fastest layout that fits."""
    lines = [f"recompute on this layout ({describe(cfg).rsplit(', recompute', 1)[0]}), against "
             f"{usable / GB:.2f} GB (device less margin):"]
    every = _longest_stage(cfg)
    shown = [with_recompute(cfg, "none"), with_recompute(cfg, "select", every), with_recompute(cfg, "full", every)]
    if not evaluate(shown[0], seq, vocab).fits(usable):
        for mode in ("select", "full"):
            if (o := least(cfg, mode, seq, vocab, usable)) and _count(o.cfg) < cfg.model.num_layers:
                shown.append(o.cfg)     # the fewest layers that fit
    lines += [_line(evaluate(c, seq, vocab), usable, recompute_label(c)) for c in shown]
    best = fastest(cfg, seq, vocab, usable)
    if best is None:
        return "\n".join(lines + [format_advice(advise(cfg, seq, vocab, usable), usable)
                                  or f"  nothing fits in {usable / GB:.2f} GB"])
    sets = diff_sets(cfg, best.cfg)
    if not sets:
        return "\n".join(lines + [f"this config is the fastest layout that fits: {describe(cfg)}"])
    mine = evaluate(cfg, seq, vocab)
    lines += [f"fastest that fits: {describe(best.cfg)}",
              f"  {best.memory / GB:.2f} GB, {best.time.total:.2f} s/step (this config: {mine.memory / GB:.2f} GB, "
              f"{mine.time.total:.2f} s/step{'' if mine.fits(usable) else ', does NOT fit'})",
              "  " + " ".join(f"--set {s}" for s in sets)]
    return "\n".join(lines)


def _count(cfg) -> int:
    return len(recompute_plan(cfg.recompute, cfg.model.num_layers))


def main(cfg, device_memory: str | None = "64GB", seq_length: int | None = None,
         margin: str = memory.MARGIN) -> int:
    """`train estimate`: the estimate and its step time; on a device, the recompute options of this
    layout and the fastest layout that fits under the device less the margin (or, when none does,
    the cheapest changes); the topology's errors and warnings. Returns 0."""
    from mspretrain.train.parallel import topology

    seq, vocab = memory.dataset_shape(cfg, seq_length)
    device = memory.parse_size(device_memory) if device_memory else None
    kept = memory.parse_margin(margin, device) if device else 0.0
    est = estimate(cfg, seq, vocab)
    print(memory.format_estimate(cfg, est, device, kept))
    print(format_time(cfg, seq, vocab))
    if device:
        print(report(cfg, seq, vocab, device - kept))
    p = cfg.parallel
    found = topology.problems(cfg, p.data_parallel * p.model_parallel * p.pipeline_stage, env={})
    for line in (*(f"error: {e}" for e in found.errors), *found.warnings):
        print(line)
    return 0
