"""The one base of every error the project raises on purpose.

A command catches `MspretrainError` and prints its one line; anything else that escapes is a bug and
keeps its traceback. Each subclass also derives from the builtin it used to be (ValueError for bad
values, RuntimeError for a state that cannot go on), so callers that catch those keep working.
"""


class MspretrainError(Exception):
    """A failure the project names on purpose: the message says what, where (file, line, key) and the fix."""
