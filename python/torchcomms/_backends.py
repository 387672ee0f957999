"""Which backends this torchcomms has: is_backend_built, built_backends,
_load_backend (the ``torchcomms.backends`` entry-point group) and the step
new_comm takes for a name no one registered (``_resolve``).

How new_comm finds a backend, first match wins (docs/backends.md):

1. a class registered in this process with ``torchcomms.register_backend``
   (the first registration of a name stays);
2. an entry point of that name in the group ``torchcomms.backends`` of an
   installed package: loading it imports its module (which may call
   register_backend); a loaded TorchCommBackend subclass that is not
   registered yet is registered under the name;
3. the C loader: ``$TORCHCOMMS_BACKEND_LIB_PATH_<NAME>``,
   ``libtorchcomms-<name>.so`` beside the extension, the built-in ``cpu``
   (which also serves torch's c10d names ``gloo`` and ``torchcomms`` on CPU).

Loaded lazily (``torchcomms.is_backend_built`` ...): importing torchcomms
must not scan the installed packages.
"""

import os
import sys

__all__ = ["is_backend_built", "built_backends"]

GROUP = "torchcomms.backends"
# Built into the library, and the c10d names the built-in serves on CPU.
_BUILTIN = ("cpu",)
_C10D_NAMES = ("gloo", "torchcomms")

# The group's entry points by name (the first of a name, as torchcomms'
# _load_backend takes), cached per state of sys.path.
_eps_key = None
_eps = {}


def _entry_points():
    global _eps_key, _eps
    key = tuple(sys.path)
    if key != _eps_key:
        from importlib.metadata import entry_points
        found = {}
        for ep in entry_points(group=GROUP):
            found.setdefault(ep.name, ep)
        _eps, _eps_key = found, key
    return _eps


def _env_name(backend):
    return "TORCHCOMMS_BACKEND_LIB_PATH_" + backend.upper().replace("-", "_")


def _plugin_dir():
    from torchcomms import _comms
    return os.path.dirname(os.path.abspath(_comms.__file__))


def _c_plugin(backend):
    """The plugin file the C loader would open for `backend`, or None:
    $TORCHCOMMS_BACKEND_LIB_PATH_<NAME> (a file, or a directory holding
    libtorchcomms-<name>.so), else the file beside the extension."""
    env = os.environ.get(_env_name(backend))
    if env:
        path = os.path.join(env, f"libtorchcomms-{backend}.so") if os.path.isdir(env) else env
        if os.path.isfile(path):
            return path
    path = os.path.join(_plugin_dir(), f"libtorchcomms-{backend}.so")
    return path if os.path.isfile(path) else None


def is_backend_built(backend: str) -> bool:
    """True if this torchcomms can create communicators of `backend` without
    registering anything first: the built-in "cpu", torch's c10d names
    "gloo" and "torchcomms" (served by "cpu" on CPU, or by the gloo plugin
    TORCHCOMMS_BACKEND_LIB_PATH_GLOO names), a C plugin the loader finds
    (beside the extension, such as "nccl", or named by
    TORCHCOMMS_BACKEND_LIB_PATH_<NAME>), or an entry point of the
    "torchcomms.backends" group. Classes registered at run time are
    _is_backend_registered's answer, not this one's."""
    if not isinstance(backend, str):
        return False
    if backend in _BUILTIN or backend == "torchcomms":
        return True
    if backend == "gloo":  # the loader's alias, unless a gloo plugin is named
        return not os.environ.get(_env_name(backend)) or _c_plugin(backend) is not None
    return _c_plugin(backend) is not None or backend in _entry_points()


def built_backends() -> list:
    """Every name is_backend_built answers True for, sorted."""
    names = set(_BUILTIN) | set(_C10D_NAMES) | set(_entry_points())
    prefix, suffix = "libtorchcomms-", ".so"
    for f in os.listdir(_plugin_dir()):
        if f.startswith(prefix) and f.endswith(suffix):
            names.add(f[len(prefix):-len(suffix)])
    for k in os.environ:
        if k.startswith("TORCHCOMMS_BACKEND_LIB_PATH_"):
            name = k[len("TORCHCOMMS_BACKEND_LIB_PATH_"):].lower()
            if name and _c_plugin(name) is not None:
                names.add(name)
    return sorted(n for n in names if is_backend_built(n))


def _load_backend(backend: str) -> None:
    """Loads the entry point `backend` of the "torchcomms.backends" group
    (importing its module). ModuleNotFoundError when there is none, as
    torchcomms' _load_backend. A TorchCommBackend subclass it names that is
    not registered yet is registered under `backend`."""
    ep = _entry_points().get(backend)
    if ep is None:
        raise ModuleNotFoundError(
            f"failed to find backend {backend}, is it registered via entry_points.txt?")
    obj = ep.load()
    from torchcomms._comms import TorchCommBackend, _is_backend_registered, register_backend
    if (isinstance(obj, type) and issubclass(obj, TorchCommBackend)
            and not _is_backend_registered(backend)):
        register_backend(backend, obj)


def _resolve(backend):
    """new_comm's step 2 for a name not registered: loads its entry point if
    there is one; returns the class now registered under the name, or None
    (the C loader's turn)."""
    if backend in _entry_points():
        _load_backend(backend)
    from torchcomms._comms import _registered_backend
    return _registered_backend(backend)
