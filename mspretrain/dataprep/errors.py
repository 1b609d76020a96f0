"""The build's own errors, raised by the plan, its tasks and both executors."""


from mspretrain.common.errors import MspretrainError


class BuildError(MspretrainError, RuntimeError):
    """A build that cannot go on; the message says why and names the file, line or key."""


def stopped(stop: list, kind: str) -> BuildError:
    """The error of a work unit whose reader stopped: --strict on a bad record (kind "strict"), or a
    reader failure; `stop` is [file, line, reason, detail]."""
    file, line, reason, detail = stop
    why = "(--strict)" if kind == "strict" else "(reader error)"
    return BuildError(f"{file}:{line}: {reason}: {detail} {why}")


def check_ids(duplicate_ids: list, strict: bool) -> None:
    """With --strict, a doc_id seen twice fails the build, naming the first. Both engines call this
    once every document is read, so a bad record anywhere is named first (the Ray engine reads all
    units before it sees ids)."""
    if strict and duplicate_ids:
        source, doc_id = duplicate_ids[0][:2]
        raise BuildError(f"{source}: doc_id {doc_id!r} appears twice (--strict)")


class NoDatasetError(BuildError):
    """These inputs and this config cannot make a dataset, however often the build is rerun (empty
    after filtering, too little text for one sample, a vocabulary the text cannot fill): the work
    dir is removed, so a rerun with a changed config is not refused as a different build.
    `docs_read`: the documents read before the build found it, where it knows (its failure report)."""

    def __init__(self, message: str, docs_read: int | None = None):
        super().__init__(message)
        self.docs_read = docs_read


def id_conflicts(duplicate_ids: list) -> dict:
    """{file: {"ids": n, "first_id": id, "files": {earlier file: n}}} of the ids a file repeats from
    other files (a configuration problem: ids that restart per file, see input.id_scope), in the
    order met. Entries of a work dir from before the first file was recorded count for nothing."""
    out: dict = {}
    for entry in duplicate_ids:
        if len(entry) < 3 or entry[0] == entry[2]:
            continue
        source, doc_id, first = entry
        c = out.setdefault(source, {"ids": 0, "first_id": doc_id, "files": {}})
        c["ids"] += 1
        c["files"][first] = c["files"].get(first, 0) + 1
    return out


def id_warnings(conflicts: dict) -> list[str]:
    """One warning line per file whose ids other files already used."""
    return [f"warning: {f}: {c['ids']} doc id(s) already used by "
            f"{', '.join(c['files'])} (first {c['first_id']!r}; an integer id is its digits, 1 and "
            f"\"1\" are one id): dropped as duplicate_doc_id. Ids restarting in every file? Set "
            f"input.id_scope: file (--set input.id_scope=file) to namespace them by file"
            for f, c in conflicts.items()]
