"""The build's own errors, raised by both engines (build.py and ray_engine/)."""


class BuildError(RuntimeError):
    """A build that cannot go on; the message says why and names the file, line or key."""


def stopped(marker: dict) -> BuildError:
    """The error of a chunk (or Ray unit) whose reader stopped: --strict on a bad record, or a reader
    failure; the marker's "stop" is [file, line, reason, detail]."""
    file, line, reason, detail = marker["stop"]
    why = "(--strict)" if marker["stop_kind"] == "strict" else "(reader error)"
    return BuildError(f"{file}:{line}: {reason}: {detail} {why}")


def check_ids(duplicate_ids: list, strict: bool) -> None:
    """With --strict, a doc_id seen twice fails the build, naming the first. Both engines call this
    once every document is read, so a bad record anywhere is named first (the Ray engine reads all
    units before it sees ids)."""
    if strict and duplicate_ids:
        source, doc_id = duplicate_ids[0]
        raise BuildError(f"{source}: doc_id {doc_id!r} appears twice (--strict)")


class NoDatasetError(BuildError):
    """These inputs and this config cannot make a dataset, however often the build is rerun (empty
    after filtering, too little text for one sample, a vocabulary the text cannot fill): the work
    dir is removed, so a rerun with a changed config is not refused as a different build."""
