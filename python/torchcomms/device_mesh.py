"""torchcomms.device_mesh: a torch DeviceMesh whose dimensions are TorchComms.

    comm = new_comm("cpu", torch.device("cpu"), name="world")
    mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("dp",))
    fully_shard(model, mesh=mesh)              # FSDP2 over our communicator

A 2-D mesh takes one communicator per dimension, made with ``split``, and the
world communicator (``_global_comm``). For rows x cols ranks, the global rank
of (i, j) is i * cols + j: the communicator of the last dimension holds the
ranks of a row ([0, 1], [2, 3] for 2 x 2), that of the first a column
([0, 2], [1, 3])::

    dp = comm.split([r for r in range(n) if r % cols == rank % cols], "dp")
    tp = comm.split([r for r in range(n) if r // cols == rank // cols], "tp")
    mesh = init_device_mesh(mesh_dim_comms=(dp, tp), mesh_dim_names=("dp", "tp"),
                            _global_comm=comm)

Each dimension becomes a process group (``_BackendWrapper``) registered with
torch.distributed under the dimension's name (``name_1``, ``name_2`` ... when a
group of that name exists already), with its global-to-group rank
mapping, so ``mesh.get_group("tp")``, DTensor, FSDP2 and the functional
collectives find it. When no default process group exists, the mesh's world
group becomes the default one (as upstream does); an existing default group
(e.g. gloo) is left in place.

Importing this module imports torch.distributed and registers the
"torchcomms" c10d backend (and upstream's spelling "torchcomm").
"""

import math
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from torchcomms._backend_wrapper import _BackendWrapper, register_backend
from torchcomms._comms import TorchComm

__all__ = ["init_device_mesh", "_create_torchcomm_process_group", "_flatten_with_comm"]

# upstream's backend name for mesh groups; "torchcomms" is registered as well
_MESH_BACKEND = "torchcomm"

register_backend("torchcomms")
register_backend(_MESH_BACKEND)

_store = None
_meshes = 0


def _get_store_for_pg() -> dist.Store:
    """The store of the mesh's process groups (new_group over them needs a
    shared one): a client of the job's TCPStore at MASTER_ADDR:MASTER_PORT
    (torchrun's or tcrun's agent store, or the one rank 0's first
    communicator hosts), under a prefix; a HashStore for a single process."""
    global _store
    if _store is None:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        world = int(os.environ.get("WORLD_SIZE", os.environ.get("TORCHCOMM_SIZE", "1")) or 1)
        if addr and port and world > 1:
            base = dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                                 use_libuv=False)
            _store = dist.PrefixStore("torchcomms_mesh/", base)
        else:
            _store = dist.HashStore()
    return _store


def _register_pg_in_world(pg, backend_name, store, group_name, backend_config,
                          rank_mapping):
    """torch's _register_pg_in_world (torch >= 2.12), or on an older torch
    (2.11 has none) the same entries of its world state written here."""
    fn = getattr(_c10d, "_register_pg_in_world", None)
    if fn is not None:
        fn(pg, backend_name=backend_name, store=store, group_name=group_name,
           backend_config=backend_config, rank_mapping=rank_mapping)
        return
    w = _c10d._world
    w.pg_map[pg] = (backend_name, store)
    w.pg_names[pg] = group_name
    w.pg_backend_config[pg] = backend_config
    _c10d._register_process_group(group_name, pg)
    w.pg_group_ranks[pg] = rank_mapping
    tag = f"ptd:{group_name}"
    w.tags_to_pg.setdefault(tag, []).append(pg)
    w.pg_to_tag[pg] = tag


def _create_torchcomm_process_group(
    comm: TorchComm,
    group_name: str,
    backend_str: str = _MESH_BACKEND,
    global_ranks_mapping: dict[int, int] | None = None,
    prefix_store: Any | None = None,
) -> dist.ProcessGroup:
    """Wraps `comm` in a process group named `group_name` and registers it
    with torch.distributed (world state, name registry, tag "ptd:<name>"),
    with the mapping global rank -> group rank (identity when None).

    Upstream's signature; `prefix_store` (the group's store, for new_group
    and monitored_barrier over it; the communicator's own store when None)
    is also taken in the 4th place, where an older upstream had it."""
    if isinstance(global_ranks_mapping, dist.Store):  # the older positional order
        global_ranks_mapping, prefix_store = prefix_store, global_ranks_mapping
    register_backend(backend_str)
    group_name = _c10d.GroupName(group_name) if hasattr(_c10d, "GroupName") else group_name
    pg = _BackendWrapper(comm, store=prefix_store)
    pg._set_group_name(group_name)
    if global_ranks_mapping is None:
        global_ranks_mapping = {i: i for i in range(comm.get_size())}
    backend_config = dist.BackendConfig(dist.Backend(backend_str))
    _register_pg_in_world(
        pg,
        backend_name=backend_str,
        store=pg.get_group_store(),
        group_name=group_name,
        backend_config=str(backend_config),
        rank_mapping=dict(global_ranks_mapping),
    )
    return pg


def _flatten_with_comm(
    mesh: dist.DeviceMesh,
    mesh_dim_name: str,
    comm: TorchComm,
    global_ranks: list[int],
    layout: Any,
) -> dist.DeviceMesh:
    """Registers `comm` (over the global ranks `global_ranks`, in its rank
    order) as the flattened dimension `mesh_dim_name` of `mesh`'s root mesh,
    whose layout is `layout` (a _MeshLayout over the dimensions flattened),
    and returns the flattened 1-D mesh: afterwards ``mesh[mesh_dim_name]``
    and ``mesh[mesh_dim_name].get_group()`` find it, as after
    ``mesh._flatten(mesh_dim_name)``, without creating a communicator."""
    from torch.distributed._mesh_layout import _MeshLayout

    global_ranks = [int(r) for r in global_ranks]
    if len(global_ranks) != comm.get_size():
        raise ValueError(f"_flatten_with_comm: {len(global_ranks)} global ranks for a "
                         f"communicator of {comm.get_size()} ranks")
    root = mesh._get_root_mesh()
    if mesh_dim_name in (root.mesh_dim_names or ()):
        raise ValueError(f"_flatten_with_comm: {mesh_dim_name!r} is a dimension of the mesh "
                         f"already ({root.mesh_dim_names})")
    pg = _create_torchcomm_process_group(
        comm, _free_group_name(mesh_dim_name), _MESH_BACKEND,
        {g: i for i, g in enumerate(global_ranks)})
    name = pg.group_name
    flat_layout = layout.coalesce() if hasattr(layout, "coalesce") else \
        _MeshLayout([layout.collapse()])
    flat = dist.DeviceMesh(
        root.device_type,
        mesh_dim_names=(mesh_dim_name,),
        _init_backend=False,
        _rank=root.get_rank(),
        _layout=flat_layout,
        _rank_map=root._rank_map,
        _root_mesh=root,
    )
    flat._dim_group_names = [name]
    flat._pg_registry[name] = _c10d._resolve_process_group(name)
    root._flatten_mapping[mesh_dim_name] = flat
    return flat


def _free_group_name(name: str) -> str:
    """`name`, or `name`_1, _2 ... when a group of that name exists already
    (a second mesh with the same dimension names)."""
    taken = set(_c10d._world.pg_names.values())
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    return candidate


def init_device_mesh(
    mesh_dim_comms: tuple[TorchComm, ...],
    mesh_dim_names: tuple[str, ...],
    _global_comm: TorchComm | None = None,
) -> dist.DeviceMesh:
    """A DeviceMesh of shape (c.get_size() for c in mesh_dim_comms) whose
    dimension i runs on mesh_dim_comms[i]. With more than one dimension,
    `_global_comm` (over every rank of the mesh) is required."""
    mesh_dim_comms = tuple(mesh_dim_comms)
    mesh_dim_names = tuple(mesh_dim_names)
    if not mesh_dim_comms:
        raise ValueError("init_device_mesh: mesh_dim_comms is empty")
    if len(mesh_dim_names) != len(mesh_dim_comms):
        raise ValueError(f"init_device_mesh: {len(mesh_dim_comms)} communicators but "
                         f"{len(mesh_dim_names)} dimension names")
    if len(set(mesh_dim_names)) != len(mesh_dim_names):
        raise ValueError(f"init_device_mesh: duplicate dimension names {mesh_dim_names}")
    if len(mesh_dim_comms) > 1 and _global_comm is None:
        raise RuntimeError(
            "More than one torch comm objects are passed but no global comm(_global_comm) "
            "is provided. Please provide a global comm object via _global_comm.")

    device = mesh_dim_comms[0].get_device()
    mesh_shape = tuple(c.get_size() for c in mesh_dim_comms)
    world_size = math.prod(mesh_shape)
    mesh = torch.arange(world_size, dtype=torch.int, device="cpu").view(mesh_shape)
    global_rank = int(mesh[tuple(c.get_rank() for c in mesh_dim_comms)].item())
    if _global_comm is not None and (_global_comm.get_size() != world_size
                                     or _global_comm.get_rank() != global_rank):
        raise ValueError(
            f"init_device_mesh: the dimension communicators place this process at global "
            f"rank {global_rank} of {world_size} (ranks "
            f"{[c.get_rank() for c in mesh_dim_comms]} in a {mesh_shape} mesh), but "
            f"_global_comm has it as rank {_global_comm.get_rank()} of "
            f"{_global_comm.get_size()}: split the dimensions as the module docstring shows")

    global _meshes
    _meshes += 1  # every rank makes its meshes in the same order: same prefixes
    store = dist.PrefixStore(f"mesh{_meshes}/", _get_store_for_pg())
    global_pg = None
    if _global_comm is not None:
        global_pg = _create_torchcomm_process_group(
            _global_comm, _free_group_name(_global_comm.get_name()), _MESH_BACKEND,
            prefix_store=dist.PrefixStore("world/", store))

    group_names = []
    for idx, (comm, dim_name) in enumerate(zip(mesh_dim_comms, mesh_dim_names)):
        name = _free_group_name(dim_name)
        # the ranks of this process's group along dimension idx
        rows = mesh.transpose(idx, -1).reshape(-1, mesh.size(idx))
        row = int(torch.where(rows == global_rank)[0].item())
        ranks = rows[row].tolist()
        if comm.get_rank() != ranks.index(global_rank):
            raise AssertionError("init_device_mesh: inconsistent ranks")
        pg = _create_torchcomm_process_group(
            comm, name, _MESH_BACKEND, {g: j for j, g in enumerate(ranks)},
            prefix_store=dist.PrefixStore(f"dim{idx}/", store))
        if global_pg is None and idx == 0:
            global_pg = pg
        group_names.append(name)

    if not dist.is_initialized():
        _c10d._update_default_pg(global_pg)

    device_mesh = dist.DeviceMesh(
        device_type=device.type,
        mesh=mesh,
        mesh_dim_names=mesh_dim_names,
        _init_backend=False,
        _rank=global_rank,
    )
    device_mesh._dim_group_names = group_names
    for name in group_names:  # what torch.compile looks groups up in
        device_mesh._pg_registry[name] = _c10d._resolve_process_group(name)
    return device_mesh
