"""When a build cannot make a dataset: say why in the user's terms, and leave a report behind.

The common first-hour case is records whose text sits under another field name: every record is a
`missing_text_field` bad record and nothing is left, which used to read as "empty corpus". The
message now counts those records per file and names the config key to set. The failure report
(DIR/report.json and report.md, marked `"failed": true`) holds what was read and every bad record;
a later build into the same DIR replaces it, but only a report this tool provably wrote: report.json
carries a digest of both files' contents (`written_by`), and a report without it (written by hand)
or edited since is left alone (the build then refuses the DIR as not its own).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mspretrain.dataprep.workdir import read_json
from mspretrain.common.files import atomic_write_bytes, atomic_write_json

REPORT_FILES = ("report.json", "report.md")


def bad_records(work) -> dict:
    """{file: {reason: [count, first line, first detail]}} over the stage-1 markers in the work dir."""
    out: dict = {}
    for m in sorted(work.done_chunks(work.docs).values(), key=lambda m: m["index"]):
        for file, reasons in m["bad"].items():
            for reason, (n, line, detail) in reasons.items():
                out.setdefault(file, {}).setdefault(reason, [0, line, detail])[0] += n
    return out


def empty_message(work, docs_read: int, cfg) -> str:
    """Why no document is left, naming the files and the config key that would fix it."""
    bad = bad_records(work)
    missing = {f: r["missing_text_field"][0] for f, r in bad.items() if "missing_text_field" in r}
    if missing:
        field = cfg.input.text_field
        parts = [f"{n} record(s) in {f} have no {field!r} field" for f, n in missing.items()]
        return ("; ".join(parts) + f"; set input.text_field (--text-field NAME) to the field that "
                f"holds the text ({docs_read} documents read)")
    skipped = [f for f, r in bad.items() if "binary_file" in r]
    if skipped and docs_read == 0:
        return (f"every input file was skipped as binary (not text): {', '.join(skipped)}")
    n_bad = sum(e[0] for r in bad.values() for e in r.values())
    return (f"no documents left after filtering and dedup ({docs_read} read, {n_bad} bad "
            f"records); see the filter thresholds in the config and the report")


def write_report(out: Path, message: str, work_bad: dict, docs_read: int | None) -> None:
    """DIR/report.json and report.md of a build that made no dataset."""
    out.mkdir(parents=True, exist_ok=True)
    report = {"failed": True, "error": message, "docs_read": docs_read, "bad_records": work_bad}
    lines = ["# dataprep build report: no dataset", "", message, "", "## Bad records", ""]
    if work_bad:
        lines += ["| file | reason | count | first line | detail |", "|---|---|---:|---:|---|"]
        lines += [f"| {f} | {reason} | {n} | {line} | {detail} |"
                  for f, reasons in work_bad.items() for reason, (n, line, detail) in reasons.items()]
    else:
        lines.append("None.")
    md = ("\n".join(lines) + "\n").encode()
    report["written_by"] = {"tool": "dataprep build", "sha256": _digest(report, md)}
    atomic_write_bytes(out / "report.md", md)
    atomic_write_json(out / "report.json", report)   # last: the report counts once it is there


def _digest(report: dict, md: bytes) -> str:
    """sha256 over the report's contents (but its `written_by`) and report.md's bytes."""
    body = {k: v for k, v in report.items() if k != "written_by"}
    h = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode())
    h.update(md)
    return h.hexdigest()


def clear_report(out: Path) -> None:
    """Remove a failed build's report, so DIR counts as empty for the next build: only one this
    tool wrote, unchanged (its digest matches); anything else stays."""
    try:
        report = read_json(out / "report.json")
        md = (out / "report.md").read_bytes()
        mark = report["written_by"]["sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return
    if report.get("failed") is True and mark == _digest(report, md):
        for name in REPORT_FILES:
            (out / name).unlink(missing_ok=True)

