"""torchcomms.hooks: the flight recorder and the NaN check, as in
meta-pytorch/torchcomms (``torchcomms.hooks.FlightRecorderHook``,
``torchcomms.hooks.NanCheckHook``).

``torch.distributed`` imports ``FlightRecorderHook`` from here while torch
itself is still being imported: this package imports neither torch nor the
extension at load time (only the standard library).
"""

from torchcomms.hooks.fr import FlightRecorderHook
from torchcomms.hooks.nan_check import NanCheckHook

__all__ = ["FlightRecorderHook", "NanCheckHook"]

# as torchcomms sets it (torch.distributed shows where it took it from)
FlightRecorderHook.__module__ = "torchcomms.hooks"
