"""`train launch --nproc N [--nnodes K --node-rank R --master-addr A --master-port P]`: run the trainer
under msrun, one worker per process, and make a failure loud.

msrun (MindSpore 2.10) starts a scheduler and the workers with the `python` first on PATH, so the venv's
bin goes first; every worker runs `python -m mspretrain.train launch <the same arguments without the launch
flags>` (built from the parsed arguments) and finds its rank through train.parallel.distributed.setup(). Logs: RUN/logs/msrun/worker_R.log and
scheduler.log. msrun's --join kills the job when a worker exits non-zero; we then print the tail of the
failed worker's log and exit non-zero. A job whose logs stay silent for `hang_timeout` seconds is
stopped as hung (a worker stuck in a collective never exits on its own).
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

TAIL_LINES = 40
DEFAULT_HANG_TIMEOUT = 1800.0       # seconds without any log output (an Ascend compile can take long)


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def worker_argv(args) -> list[str]:
    """The workers' command line, built from the parsed `train launch` arguments (never the raw argv:
    a launcher flag, abbreviated or not, must not reach a worker, which would start msrun again)."""
    out = ["-m", "mspretrain.train", "launch", "--config", str(args.config)]
    for item in getattr(args, "set", None) or ():
        out += ["--set", item]
    if getattr(args, "resume", None):
        out += ["--resume", str(args.resume)]
    if getattr(args, "force", False):
        out.append("--force")
    return out


def msrun_command(nproc: int, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                  log_dir: Path, cluster_timeout: int, worker: list[str]) -> list[str]:
    msrun = Path(sys.executable).parent / "msrun"
    return [str(msrun) if msrun.exists() else "msrun",
            f"--worker_num={nproc * nnodes}", f"--local_worker_num={nproc}",
            f"--master_addr={master_addr}", f"--master_port={master_port}", f"--node_rank={node_rank}",
            f"--log_dir={log_dir}", "--join=True", f"--cluster_time_out={cluster_timeout}",
            f"--tail_worker_log={node_rank * nproc}",      # this node's first worker, to the console
            "python", *worker]


def _options(args) -> dict:
    nproc, nnodes = _int(args, "nproc", 1), _int(args, "nnodes", 1)
    node_rank = _int(args, "node_rank", 0)
    addr = getattr(args, "master_addr", None) or "127.0.0.1"
    port = getattr(args, "master_port", None)
    if nproc < 1 or nnodes < 1:
        raise SystemExit(f"train launch: --nproc ({nproc}) and --nnodes ({nnodes}) must be >= 1")
    if not 0 <= node_rank < nnodes:
        raise SystemExit(f"train launch: --node-rank {node_rank} is outside 0..{nnodes - 1}")
    if not port:
        if nnodes > 1:
            raise SystemExit("train launch: --master-port is required with --nnodes > 1 "
                             "(every node must use the same one)")
        port = free_port(addr)
    hang = getattr(args, "hang_timeout", None) or float(os.environ.get("TRAIN_HANG_TIMEOUT", DEFAULT_HANG_TIMEOUT))
    cluster = int(getattr(args, "cluster_timeout", None) or os.environ.get("TRAIN_CLUSTER_TIMEOUT", 300))
    return dict(nproc=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=addr, master_port=int(port),
                hang_timeout=float(hang), cluster_timeout=cluster)


def _int(args, name: str, default: int) -> int:
    value = getattr(args, name, None)
    return default if value is None else int(value)


def _config(args):
    from mspretrain.train.config import load_config

    return load_config(getattr(args, "config", None), getattr(args, "set", None) or ())


def check_nodes(cfg, nproc: int, nnodes: int) -> None:
    """The topology errors of this job (train.parallel.topology), before msrun starts anything: the
    workers would find them too, but each in its own log after the cluster formed."""
    from mspretrain.train.parallel import topology

    topology.check(cfg, nproc * nnodes, {"MS_WORKER_NUM": str(nproc * nnodes),
                                         topology.LOCAL_WORKERS_ENV: str(nproc)})


def run_msrun(args) -> int:
    """Run msrun for `train launch --nproc N ...`; returns 0, or exits non-zero after showing the
    failed worker's log tail."""
    from mspretrain.train.parallel.topology import LOCAL_WORKERS_ENV

    opts = _options(args)
    cfg = _config(args)
    check_nodes(cfg, opts["nproc"], opts["nnodes"])
    log_dir = Path(cfg.run.dir) / "logs" / "msrun"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = msrun_command(opts["nproc"], opts["nnodes"], opts["node_rank"], opts["master_addr"],
                        opts["master_port"], log_dir, opts["cluster_timeout"], worker_argv(args))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env[LOCAL_WORKERS_ENV] = str(opts["nproc"])     # the node's worker count, which msrun does not export
    print("train launch: " + shlex.join(cmd), flush=True)
    rc, hung = _run_watched(cmd, env, log_dir, opts["hang_timeout"])
    if rc == 0:
        return 0
    why = f"no log output for {opts['hang_timeout']:.0f} s: stopped as hung" if hung else f"exit code {rc}"
    print(f"train launch: the job failed ({why}); logs in {log_dir}", file=sys.stderr, flush=True)
    for path in [log_dir / "launcher.log"] + failed_logs(log_dir):
        print(f"---- last {TAIL_LINES} lines of {path} ----", file=sys.stderr)
        print(tail(path, TAIL_LINES), file=sys.stderr, flush=True)
    raise SystemExit(rc if rc > 0 else 1)


# msrun 2.10's line when a worker exits non-zero (parallel/cluster/process_entity/_api.py)
MSRUN_WORKER_FAILED = "exit with exception. Error code:"


def _run_watched(cmd, env, log_dir: Path, hang_timeout: float) -> tuple[int, bool]:
    """Run msrun; stop it (and its workers) when no log under log_dir grew for hang_timeout s."""
    from mspretrain.train.log_filter import LAUNCHER_LOG, pump
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    worker_failed = threading.Event()
    output = pump(proc.stdout, log_dir / LAUNCHER_LOG,      # MindSpore's log lines: the file only
                  seen=(MSRUN_WORKER_FAILED, worker_failed))
    last_size, last_change = -1, time.monotonic()
    try:
        while True:
            try:
                proc.wait(timeout=1.0)      # returns as msrun exits, not up to a second later
                break
            except subprocess.TimeoutExpired:
                pass
            if worker_failed.is_set():
                # msrun has killed the workers but waits for its scheduler, which only gives up
                # when the dead worker's heartbeat times out (30 s): the job has failed already
                _stop(proc)
                break
            size = sum(p.stat().st_size for p in log_dir.glob("*.log") if p.is_file())
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > hang_timeout:
                _stop(proc)
                return (proc.returncode or 1), True
    except KeyboardInterrupt:
        _stop(proc)
        raise
    output.join(timeout=10)
    return ((proc.returncode or 1) if worker_failed.is_set() else proc.returncode), False


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT msrun (it kills its workers), then SIGKILL msrun and any worker left, by pid."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def failed_logs(log_dir: Path) -> list[Path]:
    """Worker logs holding a Python traceback or a fatal error; all worker logs when none does."""
    logs = sorted(log_dir.glob("worker_*.log"), key=lambda p: _rank_of(p))
    marks = ("Traceback (most recent call last)", "Error:", "Segmentation fault", "core dumped")
    failed = [p for p in logs if any(m in _read(p) for m in marks)]
    return failed or logs


def _rank_of(path: Path) -> int:
    digits = path.stem.rsplit("_", 1)[-1]
    return int(digits) if digits.isdigit() else 1 << 30


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(path: Path, lines: int) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])
