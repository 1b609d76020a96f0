"""The build's own errors, raised by both engines (build.py and ray_engine/)."""


class BuildError(RuntimeError):
    """A build that cannot go on; the message says why and names the file, line or key."""


class NoDatasetError(BuildError):
    """These inputs and this config cannot make a dataset, however often the build is rerun (empty
    after filtering, too little text for one sample, a vocabulary the text cannot fill): the work
    dir is removed, so a rerun with a changed config is not refused as a different build."""
