"""torchcomms: communicators for distributed PyTorch over libtorchcomms.

Everything public lives in the C extension ``torchcomms._comms`` and is
re-exported here. This module must stay cheap and side-effect free:
``torch.distributed`` imports it while torch itself is still importing, so it
never imports torch or torch.distributed, and it raises only ImportError.
Submodules (``objcol``, ``perf``, ...) load on first attribute access.
"""

try:
    from torchcomms._comms import *  # noqa: F401,F403
    from torchcomms._comms import __all__ as _comms_all, __version__
except ImportError:
    raise
except Exception as _e:  # pragma: no cover - a broken build
    raise ImportError(f"torchcomms: cannot load the extension module: {_e}") from _e

__all__ = list(_comms_all) + ["__version__"]

_SUBMODULES = frozenset({"objcol", "perf", "device_mesh"})


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)
