"""Where the stages run: worker processes on this machine (local) or Ray core tasks (ray)."""
