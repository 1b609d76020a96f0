"""What a hostile first week tried against `dataprep build`, each through the real CLI in
a subprocess: output directories the tool must not delete, datasets damaged behind its back, ids
that repeat across files, input directories with links and hidden names, damaged compressed files,
and the failures of the machine (a full disk, unreadable files, odd file names) that must be one
clear line, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataprep_helpers import REPO, TEST_SETTINGS, tree_snapshot

TEXT = ("Debian keeps a record of every file installed by each program, so removing software "
        "later leaves the computer as it was. Entry {n}, with a few more words: {w}.")
WORDS = "apt dpkg aptitude synaptic tasksel debconf systemd journald udev grub".split()


def dataprep(*args, **kw) -> subprocess.CompletedProcess:
    """`python -m mspretrain.dataprep ARGS`, `build` with the small test settings (which ARGS can
    override)."""
    argv = list(map(str, args))
    if argv[0] == "build":
        argv[1:1] = TEST_SETTINGS
    return subprocess.run([sys.executable, "-m", "mspretrain.dataprep", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=600, **kw)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """The error line of a failed command, checked to be one line and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


OTHER = ("The release team freezes the archive before each stable release, and only fixes for "
         "serious bugs enter it from then on. Note {n} lists: {w}.")


def records(n: int, start: int = 0, ids=None, text: str = TEXT) -> list[dict]:
    return [{"id": i if ids is None else ids(i),
             "text": text.format(n=i, w=" ".join(WORDS[(i + k) % 10] for k in range(i % 7 + 3)))}
            for i in range(start, start + n)]


# ------------------------------------------------------------------ 5. what --out may hold

@pytest.mark.parametrize("case", ["build-dir", "hand-report", "edited-report"])
def test_an_out_dir_this_tool_did_not_write_is_refused_and_left_as_it_was(tmp_path, case):
    src = jsonl(tmp_path / "in" / "a.jsonl", records(50))
    out = tmp_path / "data"
    if case == "build-dir":       # a .build/ of the user's own, no build.json
        (out / ".build").mkdir(parents=True)
        (out / ".build" / "notes.txt").write_text("mine")
    elif case == "hand-report":   # a report.json that says failed, written by hand
        out.mkdir()
        (out / "report.json").write_text('{"failed": true}\n')
        (out / "report.md").write_text("my notes\n")
    else:                         # a real failed build's report, edited since
        assert dataprep("build", src, "--out", out, "--text-field", "body").returncode == 1
        md = out / "report.md"
        md.write_text(md.read_text() + "\nmy notes\n")
    before = tree_snapshot(out)
    line = one_line_error(dataprep("build", src, "--out", out), 1)
    assert f"--out {out} exists and is not a dataset built by dataprep; nothing overwritten or " \
           f"deleted" in line
    assert tree_snapshot(out) == before


def test_a_failed_build_report_is_replaced_and_an_empty_unclaimed_work_dir_removed(tmp_path):
    src = jsonl(tmp_path / "in" / "a.jsonl", records(50))
    out = tmp_path / "data"
    assert dataprep("build", src, "--out", out, "--text-field", "body").returncode == 1
    assert json.loads((out / "report.json").read_text())["failed"] is True
    for sub in ("docs", "tokens", "out"):     # what a build killed before build.json leaves
        (out / ".build" / sub).mkdir(parents=True)
    # both are this tool's: the next build goes on (and fails the same way, with a new report)
    proc = dataprep("build", src, "--out", out, "--text-field", "body")
    assert "have no 'body' field" in one_line_error(proc, 1)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


# ------------------------------------------------------------------ 9. a rebuild over damage

def test_a_rebuild_over_a_damaged_dataset_names_the_damage_and_touches_nothing(corpus, reference,
                                                                             tmp_path):
    import shutil
    out = tmp_path / "data"
    shutil.copytree(reference, out)
    ok = dataprep("build", corpus, "--out", out)
    assert ok.returncode == 0 and "already holds this dataset" in ok.stdout, ok.stderr
    shard = sorted((out / "shards").glob("train-*.mindrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    before = tree_snapshot(out)
    line = one_line_error(dataprep("build", corpus, "--out", out), 1)
    assert f"--out {out} holds this dataset, damaged: {shard}: sha256 differs from the manifest" \
           in line and "nothing overwritten" in line and f"dataprep verify {out}" in line
    assert tree_snapshot(out) == before


# ------------------------------------------------------------------ 4. ids across files

def test_ids_restarting_in_every_file_are_a_loud_problem_and_id_scope_file_keeps_them(tmp_path):
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", records(200))
    jsonl(src / "b.jsonl", records(200, start=200, ids=lambda i: i - 200, text=OTHER))  # 0..199
    out = tmp_path / "global"
    proc = dataprep("build", src, "--out", out, "--vocab-size", "300", "--seq-length", "16")
    assert proc.returncode == 0, proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if "doc id" in x]
    assert len(warnings) == 1 and "warning: b.jsonl: 200 doc id(s) already used by a.jsonl " \
        "(first '0'" in warnings[0] and "input.id_scope: file" in warnings[0], proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["id_conflicts"] == {"b.jsonl": {"ids": 200, "first_id": "0",
                                                  "files": {"a.jsonl": 200}}}
    assert report["inputs"]["b.jsonl"]["docs_kept"] == 0
    assert "Ids already used by another file" in (out / "report.md").read_text()

    out = tmp_path / "file"
    proc = dataprep("build", src, "--out", out, "--vocab-size", "300", "--seq-length", "16",
                    "--set", "input.id_scope=file")
    assert proc.returncode == 0 and "doc id" not in proc.stderr, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["id_conflicts"] == {} and report["bad_records"] == {}
    b = report["inputs"]["b.jsonl"]
    assert b["docs_read"] == 200 and b["docs_kept"] > 0    # near duplicates dropped, no more
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["input"]["id_scope"] == "file"
    import pyarrow.parquet as pq
    ids = {r["doc_id"] for s in ("train", "valid")
           for r in pq.read_table(out / "provenance" / f"{s}.parquet").to_pylist()}
    assert "a.jsonl#0" in ids and "b.jsonl#0" in ids


def test_an_integer_id_and_the_same_digits_as_a_string_are_reported_as_one_id(tmp_path):
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", records(100))                                     # ids 0..99
    jsonl(src / "b.jsonl", records(1, start=100, ids=lambda i: "1") + records(99, start=101,
                                                                               ids=lambda i: f"b{i}"))
    proc = dataprep("build", src, "--out", tmp_path / "data", "--vocab-size", "300",
                    "--seq-length", "16")
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stderr.splitlines() if "doc id" in x]
    assert len(line) == 1 and "b.jsonl: 1 doc id(s) already used by a.jsonl (first '1'; an " \
        "integer id is its digits, 1 and \"1\" are one id)" in line[0], proc.stderr


# ------------------------------------------------------------------ 3. what a directory holds

def test_what_an_input_directory_holds_and_is_not_read_is_named_in_the_report(tmp_path):
    import os
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", records(200))
    jsonl(src / ".hidden.jsonl", records(5, start=500))
    jsonl(src / ".git" / "x.jsonl", records(5, start=600))
    jsonl(tmp_path / "outside" / "o.jsonl", records(50, start=700, text=OTHER))
    (src / "link-dir").symlink_to(tmp_path / "outside")
    (src / "broken.jsonl").symlink_to(tmp_path / "missing.jsonl")
    (src / "linked.jsonl").symlink_to(tmp_path / "outside" / "o.jsonl")   # a file: read
    os.mkfifo(src / "pipe.jsonl")
    out = tmp_path / "data"
    proc = dataprep("build", src, "--out", out, "--vocab-size", "300", "--seq-length", "16")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["left_out"] == {
        "hidden": [f"{src}/.git", f"{src}/.hidden.jsonl"],
        "symlinked_dirs": [f"{src}/link-dir"], "broken_symlinks": [f"{src}/broken.jsonl"],
        "not_files": [f"{src}/pipe.jsonl"]}
    assert sorted(report["inputs"]) == ["a.jsonl", "linked.jsonl"]
    assert "left out of the inputs: 1 symlinked dirs" in proc.stdout
    assert "Left out of the input directories" in (out / "report.md").read_text()
    # a FIFO given as an INPUT is refused in one line (reading it would wait for a writer)
    line = one_line_error(dataprep("build", src / "pipe.jsonl", "--out", tmp_path / "d2"), 1)
    assert f"neither a file nor a directory (a FIFO, socket or device?): {src}/pipe.jsonl" in line


# ------------------------------------------------------------------ 10. a gzip that fails its CRC

def test_a_gzip_member_failing_its_crc_loses_that_member_named_and_nothing_else(tmp_path):
    import gzip
    good = "".join(json.dumps(r) + "\n" for r in records(250)).encode()
    damaged = "".join(json.dumps(r) + "\n" for r in records(250, start=250, text=OTHER)).encode()
    second = bytearray(gzip.compress(damaged, compresslevel=0, mtime=0))   # stored: still inflates
    at = bytes(second).index(b"Note 300 lists")
    second[at] ^= 0x20                                                      # "note 300": valid JSON
    src = tmp_path / "in"
    src.mkdir()
    (src / "x.jsonl.gz").write_bytes(gzip.compress(good, compresslevel=0, mtime=0) + bytes(second))
    out = tmp_path / "data"
    proc = dataprep("build", src, "--out", out, "--vocab-size", "300", "--seq-length", "16")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    n, line, detail = report["bad_records"]["x.jsonl.gz"]["corrupt_compressed"]
    assert (n, line) == (1, 251) and "fails its check" in detail     # the member's first line
    assert report["inputs"]["x.jsonl.gz"]["docs_read"] == 250         # the good member, whole
    import pyarrow.parquet as pq
    ids = pq.read_table(out / "documents" / "attributes.parquet").column("doc_id").to_pylist()
    assert ids == [str(i) for i in range(250)]
    strict = dataprep("build", src, "--out", tmp_path / "strict", "--strict")
    assert "x.jsonl.gz:251: corrupt_compressed: gzip member" in one_line_error(strict, 1)


# ------------------------------------------------------------------ the machine's failures

@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs (mounting needs root; skipped without it), unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("free_kib", [64, 600, 1500])
def test_a_full_disk_is_one_line_and_the_rerun_after_freeing_space_is_identical(
        corpus, reference, small_disk, free_kib):
    import os
    from dataprep_helpers import dataset_bytes
    ballast = small_disk / "ballast"
    st = os.statvfs(small_disk)
    with open(ballast, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * (st.f_bavail * st.f_frsize - free_kib * 1024))
    out = small_disk / "data"
    line = one_line_error(dataprep("build", corpus, "--out", out), 1)
    assert "No space left on device" in line and str(out) in line, line
    ballast.unlink()
    proc = dataprep("build", corpus, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert dataset_bytes(out) == dataset_bytes(reference)


def test_a_non_utf8_file_name_is_read_and_a_lone_surrogate_is_a_bad_record(tmp_path):
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", records(200))
    (src / "s.jsonl").write_text('{"id": "\\ud800", "text": "a lone surrogate for an id"}\n'
                                 '{"id": "ok", "text": "a pair \\ud83d\\ude00 is a character"}\n')
    with open(bytes(src) + b"/caf\xe9.jsonl", "wb") as f:
        f.write(json.dumps(records(1, start=900, text=OTHER)[0]).encode() + b"\n")
    out = tmp_path / "data"
    proc = dataprep("build", src, "--out", out, "--vocab-size", "300", "--seq-length", "16")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["bad_records"]["s.jsonl"]["invalid_unicode"][:2] == [1, 1]
    assert report["inputs"]["caf\\xe9.jsonl"]["docs_read"] == 1
    assert report["inputs"]["s.jsonl"]["docs_read"] == 1


@pytest.mark.parametrize("case", ["file-parent", "read-only"])
def test_an_out_that_cannot_be_written_is_one_line_naming_it(tmp_path, case):
    src = jsonl(tmp_path / "in" / "a.jsonl", records(20))
    if case == "file-parent":
        (tmp_path / "afile").write_text("x")
        out, want = tmp_path / "afile" / "sub", f"{tmp_path / 'afile'} is not a directory"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        out, want = ro / "data", f"its parent {ro} is not writable"
    try:
        line = one_line_error(dataprep("build", src, "--out", out), 2)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "ro")], capture_output=True)
    assert line.startswith(f"dataprep build: error: --out {out}: ") and want in line, line


def test_two_builds_through_a_symlinked_alias_of_one_out_do_not_both_run(corpus, tmp_path):
    import os
    import time
    real = tmp_path / "real"
    real.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out",
            str(real / "data"), *TEST_SETTINGS]
    first = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        while not (real / ".data.lock.pid").exists() and first.poll() is None:
            time.sleep(0.05)
        second = dataprep("build", corpus, "--out", alias / "data")
        line = one_line_error(second, 1)
        assert f"--out {alias / 'data'} is in use by another process (pid {first.pid}" in line
    finally:
        first.kill()
        first.communicate()
    assert os.path.realpath(alias / "data") == str(real / "data")


def test_an_unreadable_input_file_is_one_line_naming_it(tmp_path):
    """As root every file is readable: the build runs without the capabilities that let root
    read any file (setpriv), so mode 000 means what it means for any user."""
    import shutil
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) not installed")
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", records(50))
    secret = jsonl(src / "b.jsonl", records(5, start=50))
    secret.chmod(0)
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(src), "--out",
            str(tmp_path / "data"), *TEST_SETTINGS]
    proc = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    line = one_line_error(proc, 1)
    assert f"{secret}: cannot read this input file (Permission denied)" in line, line
