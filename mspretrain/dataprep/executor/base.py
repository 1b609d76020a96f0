"""What both executors share: a stage plan (plan/run.py) hands them stages, each a name, a task
function and one argument tuple per task; an executor runs `fn(*args)` for every tuple somewhere
(a local worker process, a Ray worker) and returns the tasks' marker dicts in task order.

The plan decides every byte; an executor decides only where and when a task runs. Tasks write their
outputs to the work dir and return small markers, so results never depend on the executor."""
from __future__ import annotations

import time

from tqdm import tqdm

from mspretrain.dataprep import interrupt
from mspretrain.dataprep.errors import BuildError


class Executor:
    """Runs stages and accounts for them (tasks, reused tasks, wall and task CPU seconds per stage,
    for the report). Subclasses say how to start tasks, wait for some, and fetch their results."""

    def __init__(self, progress: bool):
        self.progress = progress
        self.tasks: dict = {}
        self.reused: dict = {}
        self.seconds: dict = {}
        self.cpu: dict = {}

    # ------------------------------------------------------------------ the plan's calls

    def run(self, name: str, fn, calls: list[tuple]) -> list[dict]:
        return self.collect(self.submit(name, fn, calls))[0]

    def run_many(self, *stages: tuple) -> list[list[dict]]:
        """Independent stages ((name, fn, calls) each) at once: their tasks share the CPUs, so a
        stage of few tasks does not leave the others idle. Results per stage, in task order."""
        return self.collect(*(self.submit(*s) for s in stages))

    def submit(self, name: str, fn, calls: list[tuple]) -> dict:
        """Start a stage's tasks; `collect` waits for them."""
        return {"name": name, "t0": time.perf_counter(), "tasks": self._start(fn, calls)}

    def collect(self, *pending: dict) -> list[list[dict]]:
        """Wait for submitted stages (one progress bar), then account for each."""
        stage_of = {id(t): p for p in pending for t in p["tasks"]}
        left = {id(p): len(p["tasks"]) for p in pending}
        ended = {id(p): time.perf_counter() for p in pending if not p["tasks"]}
        with tqdm(total=len(stage_of), desc="+".join(p["name"] for p in pending), unit="task",
                  disable=not self.progress) as bar:
            waiting = [t for p in pending for t in p["tasks"]]
            while waiting:
                ready, waiting = self._wait(waiting)
                interrupt.check()
                for t in ready:
                    p = stage_of[id(t)]
                    left[id(p)] -= 1
                    if not left[id(p)]:
                        ended[id(p)] = time.perf_counter()
                bar.update(len(ready))
        out = []
        for p in pending:
            name = p["name"]
            results = self._results(name, p["tasks"])
            self.seconds[name] = round(self.seconds.get(name, 0) + ended[id(p)] - p["t0"], 3)
            self.cpu[name] = round(self.cpu.get(name, 0) + sum(r["task_cpu_s"] for r in results), 3)
            self.tasks[name] = self.tasks.get(name, 0) + len(results)
            self.reused[name] = self.reused.get(name, 0) + sum(bool(r.get("reused")) for r in results)
            out.append(results)
        return out

    def summary(self) -> dict:
        """The report's account of the tasks."""
        return {"tasks": self.tasks, "tasks_reused": self.reused, "stage_s": self.seconds,
                "task_cpu_s": self.cpu}

    # ------------------------------------------------------------------ per executor

    def check_inputs(self, files) -> None:
        """BuildError for inputs this executor's workers could not read as this process does
        (none here: the local workers load this process's formats, see executor/local.py)."""

    def describe(self) -> dict:
        """Where the tasks run, for the report: {"engine", "where", ...}."""
        raise NotImplementedError

    def _start(self, fn, calls: list[tuple]) -> list:
        """Handles of the started tasks `timed_task(fn, *args)`, one per call."""
        raise NotImplementedError

    def _wait(self, handles: list) -> tuple[list, list]:
        """(finished, still running): at least one finished, or a short timeout passed."""
        raise NotImplementedError

    def _results(self, name: str, handles: list) -> list[dict]:
        """The finished tasks' markers; a task's BuildError as it was raised, any other failure
        as a BuildError that names the stage."""
        raise NotImplementedError


def timed_task(fn, *args) -> dict:
    """fn(*args), with the CPU seconds the task took (the report's per-stage CPU time)."""
    t0 = time.process_time()
    result = fn(*args)
    return {**result, "task_cpu_s": time.process_time() - t0}


def task_failed(name: str, error: BaseException) -> Exception:
    """A task's failure as the build reports it: its own BuildError (a clear message that names the
    file or field) and the machine's OSError (a full disk: the command names the path) unchanged,
    anything else with the stage's name."""
    if isinstance(error, (BuildError, OSError)):
        return error
    return BuildError(f"stage {name}: {error!r}")
