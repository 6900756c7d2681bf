"""What the integrations share: the release check (one line when the trainer is missing or another release), a
hook that runs a function on a module right after it is imported (how a Ray worker gets the correction registered
without importing the trainer's heavy packages itself), and the launcher that runs a trainer's own entry point
with the registration done in the driver and in every Ray worker."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import runpy
import sys
from collections.abc import Callable, Iterable
from types import ModuleType


class UnsupportedRelease(RuntimeError):
    """The trainer is not installed, or is a release the integration was not tested against."""


def installed_release(package: str, supported: Iterable[str]) -> str:
    """The installed version of `package`, which must be one of `supported`; UnsupportedRelease otherwise."""
    supported = list(supported)
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedRelease(
            f"{package} is not installed: reinforce_pro's {package} integration supports {package} "
            f"{', '.join(supported)} (docs/integrations.md)"
        ) from None
    if version not in supported:
        raise UnsupportedRelease(
            f"{package} {version} is not supported: reinforce_pro's {package} integration is tested on {package} "
            f"{', '.join(supported)}; install one of them, or port the patch by hand (docs/integrations.md)"
        )
    return version


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call fn(module) once `name` is imported: now if it already is, else right after its first import."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, fn))


class _AfterImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that answers for one module: it finds the module's real spec through the other finders
    and wraps its loader so that fn(module) runs after the module's code, then removes itself."""

    def __init__(self, name: str, fn: Callable[[ModuleType], None]) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                spec.loader = _ThenCall(spec.loader, self.fn)
                return spec
        return None


class _ThenCall(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, fn: Callable[[ModuleType], None]) -> None:
        self.loader, self.fn = loader, fn

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.fn(module)


def with_worker_hook(init: Callable, hook: str) -> Callable:
    """ray.init, which adds `hook` (a "module.function" path) as every worker's setup hook to the runtime_env the
    trainer passes (its env_vars and the rest kept)."""

    @functools.wraps(init)
    def wrapped(*args, runtime_env=None, **kwargs):
        env = dict(runtime_env or {})
        if env.setdefault("worker_process_setup_hook", hook) != hook:
            raise ValueError(
                f"the runtime_env already has a worker_process_setup_hook ({env['worker_process_setup_hook']!r}); "
                f"call {hook} from it, or apply the source patch instead (docs/integrations.md)"
            )
        return init(*args, runtime_env=env, **kwargs)

    return wrapped


def run_trainer(module: str, argv: list[str], register: Callable[[], None], hook: str) -> None:
    """Run the trainer's entry point `module` as `__main__` with `argv`, after `register()` here and with `hook`
    (the same registration) in every Ray worker the trainer starts."""
    import ray

    register()
    ray.init = with_worker_hook(ray.init, hook)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
