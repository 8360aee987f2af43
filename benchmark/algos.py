"""Import an algorithm script as a module: shared by the tests and the benchmark tools that read a saved model.

Imported as `algos` (benchmark/ is on the path of its scripts, and on pytest's through pytest.ini)."""

import functools
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def load_algorithm(name: str):
    """Import algorithms/<name>.py as a module (the scripts are not a package, on purpose), once per process. Named
    algorithms.<name>, the dotted path of its file, which is how mutmut (make mutation) finds its functions."""
    spec = importlib.util.spec_from_file_location(f"algorithms.{name}", ROOT / "algorithms" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # tyro reads the Args docstrings through the module's source
    spec.loader.exec_module(module)
    return module
