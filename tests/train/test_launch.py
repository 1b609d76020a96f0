"""The msrun launcher's pieces: the command it builds, the worker arguments, option checks, which log
it shows on failure, and the hang watchdog (a real silent subprocess, stopped with its children)."""
from __future__ import annotations

import socket
import sys
from argparse import Namespace
from pathlib import Path

import psutil
import pytest

from mspretrain.train.launch import (_options, _run_watched, failed_logs, free_port, msrun_command, tail,
                          worker_argv)


def test_worker_argv_is_built_from_the_parsed_arguments():
    from mspretrain.train.cli import parser

    argv = ["launch", "--config", "c.yaml", "--nproc", "2", "--set", "a.b=1", "--nnodes=2", "--node-rank", "1",
            "--master-addr", "10.0.0.1", "--master-port=6000", "--hang-timeout", "30", "--resume", "auto",
            "--cluster-timeout=60", "--set", "x.y=--nproc", "--force"]
    assert worker_argv(parser().parse_args(argv)) == [
        "-m", "mspretrain.train", "launch", "--config", "c.yaml", "--set", "a.b=1", "--set", "x.y=--nproc", "--resume",
        "auto", "--force"]
    assert worker_argv(parser().parse_args(["launch", "--config", "c.yaml"])) == [
        "-m", "mspretrain.train", "launch", "--config", "c.yaml"]


def test_abbreviated_launcher_flags_are_refused(capsys):
    """argparse would read `--npr 2` as --nproc 2; a worker given the raw flag would start msrun again."""
    from mspretrain.train.cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["launch", "--config", "c.yaml", "--npr", "2"])
    assert "unrecognized arguments: --npr" in capsys.readouterr().err


def test_msrun_command():
    cmd = msrun_command(4, 2, 1, "10.0.0.1", 6000, Path("/r/logs/msrun"), 120,
                        ["-m", "mspretrain.train", "launch", "--config", "c.yaml"])
    assert Path(cmd[0]).name == "msrun"
    assert cmd[1:10] == ["--worker_num=8", "--local_worker_num=4", "--master_addr=10.0.0.1",
                         "--master_port=6000", "--node_rank=1", "--log_dir=/r/logs/msrun", "--join=True",
                         "--cluster_time_out=120", "--tail_worker_log=4"]
    assert "--tail_worker_log=0" in msrun_command(2, 1, 0, "127.0.0.1", 6000, Path("l"), 60, [])
    # msrun only accepts the literal `python` (found on PATH, which run_msrun points at the venv)
    assert cmd[10:] == ["python", "-m", "mspretrain.train", "launch", "--config", "c.yaml"]


def args(**kw):
    base = dict(nproc=2, nnodes=1, node_rank=0, master_addr=None, master_port=None, hang_timeout=None,
                cluster_timeout=None)
    return Namespace(**{**base, **kw})


def test_options_pick_a_free_port_and_check_the_node_flags():
    opts = _options(args())
    with socket.socket() as s:                  # the port it chose is free to bind
        s.bind(("127.0.0.1", opts["master_port"]))
    assert opts["master_addr"] == "127.0.0.1" and opts["hang_timeout"] > 0
    assert _options(args(master_port=7001))["master_port"] == 7001
    with pytest.raises(SystemExit, match="--master-port is required"):
        _options(args(nnodes=2, node_rank=1))
    with pytest.raises(SystemExit, match="--node-rank 2 is outside 0..1"):
        _options(args(nnodes=2, node_rank=2, master_port=7001))
    with pytest.raises(SystemExit, match="--nproc"):
        _options(args(nproc=0))
    assert 1024 < free_port() < 65536


def test_failed_logs_prefers_the_worker_with_a_traceback(tmp_path):
    (tmp_path / "worker_0.log").write_text("[WARNING] waiting\nkilled\n")
    (tmp_path / "worker_1.log").write_text("step 1\nTraceback (most recent call last):\n  boom\nValueError: bad\n")
    (tmp_path / "worker_10.log").write_text("fine\n")
    (tmp_path / "scheduler.log").write_text("Traceback (most recent call last):\n")
    assert failed_logs(tmp_path) == [tmp_path / "worker_1.log"]
    assert tail(tmp_path / "worker_1.log", 2) == "  boom\nValueError: bad"
    (tmp_path / "worker_1.log").write_text("quiet\n")
    assert failed_logs(tmp_path) == [tmp_path / f"worker_{r}.log" for r in (0, 1, 10)]   # rank order


def test_watchdog_stops_a_silent_job_and_its_children(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "worker_0.log").write_text("started\n")
    # a "job" that starts a child and then says nothing
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    before = {p.pid for p in psutil.process_iter()}
    rc, hung = _run_watched([sys.executable, "-c", code], None, log_dir, hang_timeout=3)
    assert hung and rc != 0
    started = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
               and "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]
    # a SIGKILL is delivered asynchronously: give the killed a moment to die (a zombie is dead, only
    # not yet reaped by init)
    _, alive = psutil.wait_procs(started, timeout=5)
    leftover = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert leftover == []


def test_watchdog_lets_a_job_that_logs_finish(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log = log_dir / "worker_0.log"
    code = (f"import time\nfor i in range(6):\n    open({str(log)!r}, 'a').write('step\\n'); time.sleep(1)\n")
    rc, hung = _run_watched([sys.executable, "-c", code], None, log_dir, hang_timeout=3.5)
    assert (rc, hung) == (0, False)
