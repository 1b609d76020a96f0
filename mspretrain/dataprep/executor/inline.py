"""`dataprep build` with run.workers 1: the stage plan's tasks one after another in the build's own
process. A worker process would only add its start-up and the hand-offs while this one waits; the
plan, the tasks and so the bytes are the ones the process pool and Ray run."""
from __future__ import annotations

from mspretrain.dataprep.executor.base import Executor, task_failed, timed_task


class _Task:
    def __init__(self, fn, args: tuple):
        self.fn, self.args = fn, args
        self.result: dict | None = None
        self.error: Exception | None = None


class InlineExecutor(Executor):
    """Runs each task when the plan waits for it; a task's error is raised when its stage is
    collected, as the other executors do."""

    def describe(self) -> dict:
        return {"engine": "local", "where": "the build's own process (run.workers 1)", "workers": 1}

    def _start(self, fn, calls: list[tuple]) -> list:
        return [_Task(fn, args) for args in calls]

    def _wait(self, handles: list) -> tuple[list, list]:
        task = handles[0]
        try:
            task.result = timed_task(task.fn, *task.args)
        except Exception as e:    # noqa: BLE001 - reported by _results, with the stage's name
            task.error = e
        return [task], handles[1:]

    def _results(self, name: str, handles: list) -> list[dict]:
        for task in handles:
            if task.error is not None:
                raise task_failed(name, task.error) from task.error
        return [task.result for task in handles]
