"""The build's work directory, DIR/.build/: what makes a killed build resumable.

Layout (stage numbers as in plan/__init__.py):
  .build/build.json            which build owns this work dir: its resolved config and chunking
  .build/docs/NNNNN.parquet    stage 1 (docs) output per chunk (cleaned text, filter verdict, split,
                               exact key, MinHash)
  .build/docs/NNNNN.json       its completion marker with the chunk's counts (written last)
  .build/tokenizer.json        stage 3 (tokenizer) marker; the model is out/tokenizer.model
  .build/tokens/NNNNN.npz      stage 4 (tokenize) output per chunk: token ids, lengths and doc ids
                               per split (records.SplitTokens), marker NNNNN.json
  .build/plan/                 the plan's task outputs (shuffle files, labels, keep masks, the
                               tokenizer sample) and done/STAGE-NAME.json, each task's marker
  .build/out/                  the dataset being assembled by stage 5 (write); moved into DIR by
                               stage 6 (finish)

Every file is written under a temporary name and renamed into place, and a chunk or a task counts as
done only once its marker exists, so a SIGKILL at any moment leaves either nothing or a complete
output. A rerun skips what is done and redoes the rest.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from mspretrain.common.files import atomic_write_json

WORK_DIR = ".build"
# Which build this work dir belongs to: its resolved config and chunking (build.work_owner). A
# rerun resumes the work dir only when its own description equals this file. Not a lock: nothing
# stops two processes from using the same work dir at once.
OWNER_FILE = "build.json"


def read_json(path: Path):
    return json.loads(path.read_text())


class WorkDir:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.root = self.out / WORK_DIR
        self.docs = self.root / "docs"
        self.tokens = self.root / "tokens"
        self.plan = self.root / "plan"
        self.staging = self.root / "out"

    @property
    def owner_file(self) -> Path:
        """.build/build.json: the description of the build that owns this work dir."""
        return self.root / OWNER_FILE

    def exists(self) -> bool:
        return self.owner_file.is_file()

    def owner(self) -> dict:
        return read_json(self.owner_file)

    def create(self, owner: dict) -> None:
        """Claim the work dir for the build described by `owner` (its config, chunk size): the
        owner file first, so that a work dir without one is at most an empty directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.owner_file, owner)
        for d in (self.docs, self.tokens, self.staging):
            d.mkdir(exist_ok=True)

    def remove_unclaimed(self) -> bool:
        """Remove a work dir that a build killed before it wrote the owner file left: nothing but
        empty directories of this layout (older versions made them first). False, and nothing
        removed, if it holds anything else: then it is not this tool's to delete."""
        for d in (self.docs, self.tokens, self.staging, self.root):
            try:
                d.rmdir()               # only ever removes an empty directory
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True

    def chunk_file(self, stage_dir: Path, index: int, ext: str) -> Path:
        return stage_dir / f"{index:05d}.{ext}"

    def done_chunks(self, stage_dir: Path) -> dict[int, dict]:
        """index -> marker contents of every completed chunk of a stage."""
        done = {}
        for p in stage_dir.glob("[0-9]*.json"):
            done[int(p.stem)] = read_json(p)
        return done

    def remove(self) -> None:
        """The owner file goes last: a build killed while this runs leaves a work dir that a rerun
        still recognises as its own, and removes (rmtree alone may take the owner file first)."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name == OWNER_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        self.owner_file.unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)
