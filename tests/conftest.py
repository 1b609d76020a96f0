"""Shared by every test directory."""
import signal

# A suite started as a background job of a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and so would every command a test starts: the tests that send Ctrl-C to a build, a training run or
# this process would see nothing happen. Python's own handler puts SIGINT back for this process,
# and a handler, unlike SIG_IGN, is not inherited across exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
