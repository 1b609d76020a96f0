"""Shared by every test directory."""
import signal

# A suite started as a background job of a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and so would every command a test starts: the tests that send Ctrl-C to a build, a training run or
# this process would see nothing happen. Python's own handler puts SIGINT back for this process,
# and a handler, unlike SIG_IGN, is not inherited across exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Files of multi-process tests first, then files of slow ones, the rest after. Under xdist's
    loadfile (scripts/test.sh, with --no-loadscope-reorder) each file runs whole on one worker in
    this order: a long file started last would leave the other worker idle for minutes."""
    def weight(item):
        return 0 if item.get_closest_marker("msrun") else 1 if item.get_closest_marker("slow") else 2
    files = {}
    for item in items:
        files[item.path] = min(files.get(item.path, 2), weight(item))
    items.sort(key=lambda item: files[item.path])     # stable: collection order within each group
