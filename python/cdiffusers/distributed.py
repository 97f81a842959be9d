"""cdiffusers' stand-ins for what diffusers' tensor-parallel scripts import from
``torch.distributed`` (init_process_group, get_rank, get_world_size, barrier,
destroy_process_group, DeviceMesh) and from ``transformers`` / ``diffusers`` (DistributedConfig,
TensorParallelConfig).

One process per rank, started by an MPI launcher (``mpirun -np 2 python3 script.py``): the
process group is the library's MPI group (cdf_dist_init, include/cdiffusers/dist.h); run without a
launcher it is a group of one. A model given ``parallel_config=TensorParallelConfig(mesh=mesh)``
(or ``distributed_config=`` + ``device_mesh=`` for a text encoder) is loaded sharded over the
mesh: each rank reads only its slice of every sharded weight (cdf_tp_enable)."""
import atexit
import os

from . import _cdiffusers as _C
from ._common import device_name

__all__ = ["init_process_group", "is_initialized", "get_rank", "get_world_size", "barrier", "destroy_process_group",
           "DeviceMesh", "TensorParallelConfig", "DistributedConfig"]

# torch.distributed backend names -> the library's ("mpi" under a launcher, else "local")
_KNOWN_BACKENDS = ("tpu_dist", "nccl", "gloo", "mpi", "xla", "cpu:gloo,cuda:nccl")


def _under_launcher():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))


def init_process_group(backend=None, init_method=None, world_size=-1, rank=-1, **kwargs):
    """torch.distributed.init_process_group: joins the MPI job this process was started in
    (``backend`` "tpu_dist", "nccl", "gloo", "mpi" or None all mean that), or a group of one
    without a launcher. world_size / rank, when given, must agree with the launcher's."""
    if backend is not None and backend not in _KNOWN_BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r} (cdiffusers uses MPI for any of "
                         f"{', '.join(_KNOWN_BACKENDS)})")
    lib_backend = "mpi" if _under_launcher() and _C.dist_backend_available("mpi") else "local"
    if _under_launcher() and lib_backend == "local":
        raise RuntimeError("started by an MPI launcher but this cdiffusers was built without MPI")
    r, w = _C.dist_init(lib_backend)
    # MPI wants every rank to finalise; the seed's script never calls destroy_process_group
    atexit.register(_C.dist_finalize)
    if world_size not in (-1, None) and world_size != w:
        raise ValueError(f"init_process_group: world_size={world_size} but the launcher started {w} processes")
    if rank not in (-1, None) and rank != r:
        raise ValueError(f"init_process_group: rank={rank} but this process is rank {r}")


def is_initialized():
    return _C.dist_info() is not None


def _info():
    info = _C.dist_info()
    if info is None:
        raise RuntimeError("Default process group has not been initialized, please make sure to call "
                           "init_process_group.")
    return info


def get_rank(group=None):
    return _info()[0]


def get_world_size(group=None):
    return _info()[1]


def barrier(group=None):
    _C.dist_barrier()


def destroy_process_group(group=None):
    _C.dist_finalize()


class DeviceMesh:
    """torch.distributed.device_mesh.DeviceMesh(device_type, mesh): a 1-D mesh of every rank, one
    device per rank (cdf_device_mesh). device_type "tpu" is the pjrt device."""

    def __init__(self, device_type, mesh, *, mesh_dim_names=None):
        world = get_world_size()
        ranks = list(mesh.tolist() if hasattr(mesh, "tolist") else mesh)
        if ranks != list(range(world)):
            raise NotImplementedError(f"DeviceMesh: cdiffusers meshes are 1-D over every rank in order "
                                      f"(list(range({world}))), got {ranks}")
        self.device_type = device_type
        self.device = device_name(device_type)
        self.mesh = ranks
        self.mesh_dim_names = mesh_dim_names

    def size(self, mesh_dim=None):
        return len(self.mesh)

    def get_rank(self):
        return get_rank()

    def __repr__(self):
        return f"DeviceMesh({self.device_type!r}, {self.mesh})"


class TensorParallelConfig:
    """diffusers.TensorParallelConfig(mesh=...): pass as ``parallel_config=`` to a model's
    from_pretrained to load it sharded over the mesh (the library's tensor-parallel plans)."""

    def __init__(self, mesh=None, tp_degree=None, **kwargs):
        if mesh is None:
            raise ValueError("TensorParallelConfig needs mesh=DeviceMesh(...)")
        if tp_degree is not None and tp_degree != mesh.size():
            raise ValueError(f"TensorParallelConfig: tp_degree={tp_degree} but the mesh has {mesh.size()} ranks")
        self.mesh = mesh


class DistributedConfig:
    """transformers.DistributedConfig(tp_plan="auto"): with ``device_mesh=`` on a text encoder's
    from_pretrained, loads it sharded (the library's plan for that encoder)."""

    def __init__(self, tp_plan="auto", **kwargs):
        if tp_plan != "auto":
            raise NotImplementedError(f"DistributedConfig: only tp_plan='auto' (the library's plan), got {tp_plan!r}")
        self.tp_plan = tp_plan
