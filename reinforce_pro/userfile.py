"""Import a user's Python file (reward function, self-play task, agent) and turn any failure into one
clear error that names the flag and the file instead of a traceback from inside the user's code."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def import_user_file(path: str | Path, flag: str, error: type[Exception], what: str) -> ModuleType:
    """`path` as a module; raises `error` ("<flag> <path>: ...") if it is not a .py file or fails to import.
    `what` says what the file must define, for the message."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise error(f"{flag} {path}: not an existing .py file (it must define {what})")
    spec = importlib.util.spec_from_file_location(f"reinforce_pro_user_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: say which file broke and how
        raise error(f"{flag} {path}: importing it failed: {type(e).__name__}: {e}") from e
    return module
