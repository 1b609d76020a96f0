"""Every error the project names on purpose shares one base, so a command catches that base alone."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import mspretrain
from mspretrain.common.errors import MspretrainError


def _error_classes():
    for info in pkgutil.walk_packages(mspretrain.__path__, "mspretrain."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == info.name and name.endswith("Error"):
                yield obj


def test_every_named_error_of_the_package_derives_from_the_one_base():
    found = list(_error_classes())
    assert len(found) >= 15, [c.__name__ for c in found]     # the walk reached every room
    stray = [f"{c.__module__}.{c.__name__}" for c in found if not issubclass(c, MspretrainError)]
    assert not stray


def test_the_train_command_prints_one_line_for_any_domain_error(tmp_path, capsys):
    from mspretrain.train.cli import main
    code = main(["compare", str(tmp_path / "no-run-a"), str(tmp_path / "no-run-b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "no-run-a" in err[0]
