"""torchcomms: communicators for distributed PyTorch over libtorchcomms.

Everything public lives in the C extension ``torchcomms._comms`` and is
re-exported here. This module must stay cheap and side-effect free:
``torch.distributed`` imports it while torch itself is still importing, so it
never imports torch or torch.distributed, and it raises only ImportError.
Submodules (``objcol``, ``perf``, ``device_mesh``, ``hooks``, ``functional``),
``register_c10d_backend``, ``is_backend_built`` and ``built_backends`` load on
first attribute access.
"""

try:
    from torchcomms._comms import *  # noqa: F401,F403
    from torchcomms._comms import __all__ as _comms_all, __version__
    from torchcomms._comms import _is_backend_registered  # noqa: F401
except ImportError:
    raise
except Exception as _e:  # pragma: no cover - a broken build
    raise ImportError(f"torchcomms: cannot load the extension module: {_e}") from _e

__all__ = list(_comms_all) + ["__version__", "is_backend_built", "built_backends"]

_SUBMODULES = frozenset({"objcol", "perf", "device_mesh", "hooks", "functional"})


# Loaded on first use (they import torch.distributed): register_c10d_backend()
# registers the "torchcomms" c10d backend, so that
# torch.distributed.init_process_group(backend="torchcomms") and
# new_group(..., backend="torchcomms") make groups over TorchComms.
_LAZY = {"register_c10d_backend": ("_backend_wrapper", "register_backend"),
         # which backends exist (_backends.py: scans the installed packages'
         # "torchcomms.backends" entry points, so only when asked)
         "is_backend_built": ("_backends", "is_backend_built"),
         "built_backends": ("_backends", "built_backends"),
         "_load_backend": ("_backends", "_load_backend")}


# torch.distributed imports `from torchcomms._comms import _BackendWrapper`
# (upstream's extension defines it), and so do torchcomms' own modules and
# tests. Ours is Python (torchcomms._backend_wrapper, which imports torch):
# the extension module resolves these names on first access.
_COMMS_LAZY = {"_BackendWrapper": "_backend_wrapper", "_WorkWrapper": "_backend_wrapper"}


def _comms_getattr(name):
    import importlib

    if name in _COMMS_LAZY:
        try:
            # torch first: torch.distributed asks for this very name while
            # torch imports, and must find the wrapper module complete
            importlib.import_module("torch")
            mod = importlib.import_module(f"{__name__}.{_COMMS_LAZY[name]}")
        except ImportError as e:
            raise ImportError(f"torchcomms._comms.{name} needs torch: {e}") from e
        return getattr(mod, name)
    raise AttributeError(f"module 'torchcomms._comms' has no attribute {name!r}")


def _install_comms_getattr():
    import sys

    mod = sys.modules.get(f"{__name__}._comms")
    if mod is not None and not hasattr(type(mod), "__getattr__"):
        mod.__getattr__ = _comms_getattr


_install_comms_getattr()


def __getattr__(name):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        mod, attr = _LAZY[name]
        importlib.import_module("torch")  # first: see _comms_getattr
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES | set(_LAZY))
