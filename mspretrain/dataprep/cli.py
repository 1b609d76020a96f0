"""`dataprep build | inspect | quality | verify` (also `python -m mspretrain.dataprep`). Exit 0 on success, 1 on
a runtime error (a bad input or dataset, a full disk, a locked --out: the message names the file or line), 2 on
a usage error (a flag, a config key or value: it names the key), 130 on Ctrl-C (mspretrain.common.console)."""
from __future__ import annotations

import sys

from mspretrain import hold_ctrl_c     # the package's root: loaded already

# Nothing else at module level: the console script imports this module before `main` can hold a
# Ctrl-C (mspretrain.common.console); every function imports what it needs.


def main(argv: list[str] | None = None) -> int:
    """The `dataprep` command; argv None: the process's own command line (a console script)."""
    held = hold_ctrl_c()      # first: a Ctrl-C from here on ends the command with one line
    from mspretrain.common import console
    parsed: list = []

    def load():
        import importlib
        import os
        # pyarrow's own allocator (jemalloc/mimalloc) keeps the memory of freed chunk tables: on a
        # 250 MB build ~100 MB more peak RSS across the main process and a worker, for no speed
        # gain here. It is read when pyarrow's default pool is first made, so it is set before the
        # build imports pyarrow; worker processes inherit it. An explicit setting wins.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        args = _parser().parse_args(argv)
        parsed.append(args)
        for module in ("mspretrain.common.config", "mspretrain.dataprep.interrupt",
                       *_MODULES[args.command]):
            importlib.import_module(module)
        return lambda: _run(args)

    return console.run("dataprep", load, exiting=argv is None, held=held,
                       interrupted=lambda: _interrupted(parsed[0] if parsed else None, argv))


def _run(args) -> int:
    """The command; a usage error (a flag, a config key or value: mspretrain.common.console) exits
    2, the commands return 1 for the runtime errors they name."""
    from mspretrain.common.config import report
    from mspretrain.common.console import UsageError
    from mspretrain.dataprep import interrupt
    with interrupt.catching():      # a Ctrl-C that a library swallows is raised again
        try:
            return args.func(args)
        except UsageError as e:     # ConfigError included
            return report(f"dataprep {args.command}", e)


# the modules each command imports (main imports them first, while a Ctrl-C is only remembered)
_MODULES = {
    "build": ("mspretrain.dataprep.build", "mspretrain.dataprep.config", "mspretrain.dataprep.report.summary",
              "mspretrain.common.lock"),
    "inspect": ("mspretrain.dataprep.inspection", "mspretrain.loader.manifest"),
    "quality": ("mspretrain.dataprep.steps.quality",),
    "verify": ("mspretrain.dataprep.verify",),
}


def _interrupted(args, argv) -> str:
    """The one line a Ctrl-C prints, whenever it comes (before the arguments are parsed too)."""
    if args is None:
        return "dataprep: interrupted"
    if args.command == "build":
        import shlex
        return (f"dataprep build: interrupted; the finished work is kept in {args.out}/.build; "
                f"rerun the same command to resume: dataprep "
                f"{shlex.join(sys.argv[1:] if argv is None else argv)}")
    return f"dataprep {args.command}: interrupted"


def _parser():
    import argparse

    from mspretrain.common.config import add_config_options
    p = argparse.ArgumentParser(prog="dataprep", description="Build, inspect and verify "
                                "MindRecord pretraining datasets.")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="raw corpus -> dataset directory")
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="files or directories (recursive)")
    b.add_argument("--out", required=True, metavar="DIR")
    add_config_options(b)
    b.add_argument("--workers", type=int, help="worker processes (run.workers)")
    b.add_argument("--text-field", help="input.text_field: the jsonl/parquet field with the text")
    b.add_argument("--id-field", help="input.id_field: the field that becomes the doc_id")
    b.add_argument("--seq-length", type=int, help="pack.seq_length")
    tok = b.add_mutually_exclusive_group()
    tok.add_argument("--vocab-size", type=int, help="tokenizer.vocab_size of a trained tokenizer")
    tok.add_argument("--tokenizer", metavar="MODEL", help="reuse this sentencepiece .model")
    b.add_argument("--max-shard-bytes", metavar="SIZE", help="shards.max_shard_bytes: 2GiB, 64MB, "
                   "or bytes")
    b.add_argument("--dedup-threshold", type=float, help="dedup.threshold (Jaccard)")
    b.add_argument("--valid-fraction", type=float, help="pack.valid_fraction")
    b.add_argument("--strict", action="store_true", default=None,
                   help="fail on the first bad record (run.strict)")
    b.add_argument("--decontaminate", action="append", default=[], metavar="FILE",
                   help="evaluation set (JSON lines with text) to remove from the corpus; adds to "
                   "decontam.files (repeatable)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.add_argument("--engine", choices=("local", "ray"), help="run.engine: worker processes on "
                   "this machine, or Ray core tasks on a cluster (docs/scale-out.md)")
    b.add_argument("--ray-address", metavar="auto|HOST:PORT", help="run.ray_address: join this "
                   "Ray cluster (default: start a local Ray instance)")
    b.set_defaults(func=_build)

    i = sub.add_parser("inspect", help="manifest summary and one sample decoded")
    i.add_argument("dir", metavar="DIR")
    i.add_argument("--sample", type=int, default=0, metavar="I")
    i.add_argument("--split", default="train")
    i.set_defaults(func=_inspect)

    q = sub.add_parser("quality", help="the document quality classifier")
    qsub = q.add_subparsers(dest="quality_command", required=True)
    qt = qsub.add_parser("train", help="train a classifier from good and bad example documents")
    qt.add_argument("--positive", required=True, metavar="FILE",
                    help="good documents: JSON lines with text, or plain text (blank-line paragraphs)")
    qt.add_argument("--negative", required=True, metavar="FILE", help="bad documents, same formats")
    qt.add_argument("--out", required=True, metavar="MODEL")
    qt.add_argument("--text-field", default="text")
    qt.set_defaults(func=_quality_train)

    v = sub.add_parser("verify", help="check a dataset against its manifest")
    v.add_argument("dir", metavar="DIR")
    v.set_defaults(func=_verify)
    return p


_FLAG_KEYS = {"workers": "run.workers", "seq_length": "pack.seq_length",
              "vocab_size": "tokenizer.vocab_size", "tokenizer": "tokenizer.model",
              "dedup_threshold": "dedup.threshold", "valid_fraction": "pack.valid_fraction",
              "strict": "run.strict", "engine": "run.engine", "ray_address": "run.ray_address",
              "text_field": "input.text_field", "id_field": "input.id_field"}


def _build(args) -> int:
    import os

    from mspretrain.common.config import parse_size
    from mspretrain.common.console import FAILED, UsageError
    from mspretrain.dataprep.build import build
    from mspretrain.dataprep.config import load_build_config
    from mspretrain.common.errors import MspretrainError
    from mspretrain.common.lock import out_dir_lock
    from mspretrain.dataprep.errors import id_warnings
    from mspretrain.dataprep.report.summary import summary
    overrides = {key: getattr(args, flag) for flag, key in _FLAG_KEYS.items()
                 if getattr(args, flag) is not None}
    if args.max_shard_bytes is not None:
        overrides["shards.max_shard_bytes"] = parse_size(args.max_shard_bytes, "--max-shard-bytes")
    if args.no_progress:
        overrides["run.progress"] = False
    cfg = load_build_config(args.config, overrides, args.set)
    if args.decontaminate:
        cfg = load_build_config(args.config, {**overrides, "decontam.files": [
            *cfg.decontam.files, *args.decontaminate]}, args.set)
    why = _unusable_out(args.out)
    if why:     # the flag's value cannot work: a usage error (exit 2)
        raise UsageError(f"--out {args.out}: {why}")
    try:
        # the lock of the real directory: two aliases of one DIR (a symlink) share it
        with out_dir_lock(os.path.realpath(args.out), f"--out {args.out}"):
            result = build(args.inputs, args.out, cfg)
    except UsageError:
        raise
    except MspretrainError as e:   # the build's, a tokenizer's, a lock's: one line
        print(f"dataprep build: error: {e}", file=sys.stderr)
        return FAILED
    except OSError as e:   # the machine's: a full disk, a read-only or unreadable path
        kept = (f"; the finished work is kept in {args.out}/.build: fix that and rerun the same "
                f"command to resume" if os.path.isdir(os.path.join(args.out, ".build")) else "")
        print(f"dataprep build: error: {_os_error(e)}{kept}", file=sys.stderr)
        return FAILED
    if result.already_built:
        print(f"{args.out} already holds this dataset (same inputs and config, fingerprint "
              f"{result.manifest.fingerprint[:16]}, every file's sha256 checked); nothing to do")
    else:
        print(summary(result.report))
        for line in id_warnings(result.report.get("id_conflicts", {})):
            print(f"dataprep build: {line}", file=sys.stderr)
    return 0


def _unusable_out(out: str) -> str:
    """Why --out cannot be a dataset directory, or "": a file where a directory must be, or a
    directory this process cannot write in (read-only file system, permissions)."""
    import os
    from pathlib import Path
    path = Path(out).absolute()
    for parent in (path, *path.parents):
        if parent.exists():
            break
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK) or _read_only(parent):
        what = "--out" if parent == path else "its parent"
        return f"{what} {parent} is not writable (read-only file system or permissions)"
    return ""


def _read_only(path) -> bool:
    """os.access ignores a read-only mount for root; statvfs does not."""
    import os
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _os_error(e: OSError) -> str:
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror or e}{where}"


def _quality_train(args) -> int:
    from mspretrain.common.console import FAILED
    from mspretrain.dataprep.steps.quality import QualityModelError, read_texts, train
    try:
        pos = read_texts(args.positive, args.text_field)
        neg = read_texts(args.negative, args.text_field)
        model = train(pos, neg)
    except (QualityModelError, ValueError) as e:
        print(f"dataprep quality train: error: {e}", file=sys.stderr)
        return FAILED
    model.save(args.out)
    scores = [model.score(t) for t in pos + neg]
    right = sum(s >= 0.5 for s in scores[:len(pos)]) + sum(s < 0.5 for s in scores[len(pos):])
    print(f"{args.out}: trained on {len(pos)} positive and {len(neg)} negative documents; "
          f"training accuracy {right / len(scores):.3f}")
    return 0


def _inspect(args) -> int:
    from mspretrain.common.console import FAILED
    from mspretrain.dataprep.inspection import inspect_dataset
    from mspretrain.loader.manifest import ManifestError
    try:
        print(inspect_dataset(args.dir, args.sample, args.split))
    except (ManifestError, IndexError) as e:
        print(f"dataprep inspect: error: {e}", file=sys.stderr)
        return FAILED
    return 0


def _verify(args) -> int:
    from mspretrain.common.console import FAILED
    from mspretrain.dataprep.verify import verify_dataset
    faults = verify_dataset(args.dir)
    for f in faults:
        print(f"FAULT: {f}")
    if faults:
        print(f"dataprep verify: {len(faults)} fault(s) in {args.dir}", file=sys.stderr)
        return FAILED
    print(f"{args.dir}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
