"""mspretrain: dataprep (build datasets), loader (read them), train (the MindSpore trainer), common."""


def hold_ctrl_c():
    """From now on a Ctrl-C is held: remembered, nothing raised (mspretrain.common.console acts on
    it). Returns (the handler before, the list a Ctrl-C appends to), or (None, []) where Ctrl-C is
    not ours to arrange: another thread, SIGINT ignored (nohup: it stays so) or handled outside
    Python. In the package's root, with the built-in `_signal`: a console script has imported both
    before `main` runs, so `main`'s first line calls this without importing anything."""
    import _signal
    previous = _signal.getsignal(_signal.SIGINT)
    if previous is _signal.SIG_IGN or previous is None:
        return None, []
    hit: list = []
    try:
        _signal.signal(_signal.SIGINT, lambda signum, frame: hit.append(signum))
    except ValueError:          # not the main thread
        return None, hit
    return previous, hit
