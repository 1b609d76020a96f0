"""A process for test_interrupt.py: a LocalExecutor whose workers take seconds to start (as in a fresh
clone), tasks larger than a pipe's buffer queued behind them, and a Ctrl-C while the main process
waits for the first result. Prints "interrupted" and exits 130, as the dataprep command does."""
import os
import signal
import sys
import threading
import time

if __name__ == "__mp_main__":   # a spawned worker imports this file first: a slow start-up
    time.sleep(3)


def slow(delay, payload):
    time.sleep(delay)
    return {"bytes": len(payload)}


def main() -> int:
    from mspretrain.dataprep import interrupt
    from mspretrain.dataprep.executor.local import LocalExecutor, WorkerPool
    try:
        with interrupt.catching(), WorkerPool(2) as pool:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            LocalExecutor(pool, progress=False).run("slow", slow,
                                                    [(0.1, b"x" * (1 << 20))] * 100)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
