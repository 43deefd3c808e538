"""Data-parallel ZenFlowAdamW on torch.distributed (docs/design.md, "Data parallel").

The engine does the data-parallel work itself (it reduces the gradients, all-reduces the
column statistics so that every rank selects the same columns, and keeps the host state of
its own 1/N of every matrix's columns); it only needs three collectives. This file gives it
those, as torch.distributed calls on views of the engine's device memory, and does the rest
of the torch-side bookkeeping: the process group, the initial broadcast of the parameters,
and the conversions of checkpoints between the engine's partial buffers, a consolidated
state dict and per-rank shards.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DataParallel", "column_range", "consolidate_shards"]

# The engine's dtype names (the binding's set_collectives) -> torch dtypes.
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
}
# The alignment engine.h asks of the attached device memory.
_MEMORY_ALIGNMENT = 256
# Checkpoint consolidation reduces the state in buckets of this many bytes (bounded temporary
# memory whatever the model size).
_CONSOLIDATE_BUCKET_BYTES = 64 << 20
# torch 2.13 renamed the tensor collectives; older versions have only the first names.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# gloo allocates temporaries as large as each call's data (it flattens a list collective's
# tensors, its ring all-reduce keeps per-call buffers). Once freed, glibc's dynamic mmap
# threshold (which rises to the largest freed mapping, up to 32 MiB) keeps temporaries of
# that size in the heap, resident: tens of MiB per rank at the default 64 MiB buckets. gloo's
# collectives are therefore issued in pieces of at most this many bytes, which bounds them.
_GLOO_PIECE_BYTES = 2 << 20


def column_range(columns: int, rank: int, world_size: int) -> tuple[int, int]:
    """The columns [first, stop) of a matrix with `columns` columns that `rank` owns: the
    engine's rule, rank r owns [r*n/N, (r+1)*n/N) in integer division."""
    return rank * columns // world_size, (rank + 1) * columns // world_size


def resolve_group(process_group: Any) -> Any | None:
    """The process group of a data-parallel optimizer, None for a single process: the given
    group, else the default one when torch.distributed is initialised; None also when the
    group has one rank. A group this process is not in raises ValueError."""
    if process_group is not None:
        if not dist.is_available() or not isinstance(process_group, dist.ProcessGroup):
            raise TypeError(
                "process_group: expected a torch.distributed.ProcessGroup or None, got "
                f"{type(process_group).__name__}"
            )
        group = process_group
    elif dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
    else:
        return None
    if dist.get_rank(group) < 0:
        raise ValueError("process_group: this process is not a member of the group")
    return group if dist.get_world_size(group) > 1 else None


class _EngineCollectives:
    """The three callables one engine calls (Engine.set_collectives), on views of that
    engine's attached device memory. One per engine: the memory is the engine's."""

    def __init__(self, parallel: DataParallel):
        self._group = parallel.group
        self._world_size = parallel.world_size
        self._device = parallel.device
        # gloo's reduce_scatter_tensor is about 1.6x slower than its list form (32 MiB, 2
        # ranks: 50 ms against 32 ms, and its all-reduce takes 27 ms): use the list form there.
        gloo = dist.get_backend(parallel.group) == "gloo"
        self._list_reduce_scatter = gloo
        self._piece_bytes = _GLOO_PIECE_BYTES if gloo else None
        # gloo with CUDA parameters (several ranks on one GPU, as in tests): the collectives
        # run on host copies of the engine's buffers, taken in the engine's stream order.
        self._staged = parallel.staged
        self.memory: torch.Tensor | None = None
        self._base = 0

    def attach(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self._base = memory.data_ptr()

    def _view(self, what: str, address: int, count: int, dtype: str) -> torch.Tensor:
        torch_dtype = _DTYPES.get(dtype)
        if torch_dtype is None:
            raise TypeError(f"{what}: unsupported dtype {dtype!r}")
        memory = self.memory
        if memory is None:
            raise ValueError(f"{what}: the engine's device memory is not attached")
        size = torch_dtype.itemsize
        offset = address - self._base
        if offset < 0 or offset + count * size > memory.numel():
            raise ValueError(
                f"{what}: [{address:#x}, +{count * size} bytes) is outside the engine's device memory "
                f"[{self._base:#x}, +{memory.numel()} bytes)"
            )
        if offset % size:
            raise ValueError(f"{what}: {address:#x} is not aligned for {dtype}")
        return memory[offset : offset + count * size].view(torch_dtype)

    def _stream(self, stream: int) -> contextlib.AbstractContextManager:
        """The engine's stream as torch's current one while the collective is enqueued:
        torch.distributed orders the collective after the work on the current stream and the
        current stream's later work after it."""
        if self._device.type != "cuda":
            return contextlib.nullcontext()
        if torch.cuda.current_stream(self._device).cuda_stream == stream:
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=self._device))

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cpu() if self._staged else tensor

    def _back(self, target: torch.Tensor, result: torch.Tensor) -> None:
        if result is not target:
            target.copy_(result)

    def _pieces(self, count: int, element_size: int) -> list[slice]:
        """[0, count) in the pieces one collective call takes (the whole range but on gloo)."""
        if self._piece_bytes is None:
            return [slice(0, count)]
        step = max(1, self._piece_bytes // element_size)
        return [slice(start, min(count, start + step)) for start in range(0, count, step)]

    def all_reduce_sum(self, address: int, count: int, dtype: str, stream: int) -> None:
        if count == 0:
            return
        data = self._view("all_reduce_sum", address, count, dtype)
        with self._stream(stream):
            host = self._host(data)
            for piece in self._pieces(count, host.element_size()):
                dist.all_reduce(host[piece], op=dist.ReduceOp.SUM, group=self._group)
            self._back(data, host)

    def _in_out(
        self,
        what: str,
        in_address: int,
        in_count: int,
        out_address: int,
        out_count: int,
        dtype: str,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The collective's input and output, and the engine's output buffer (the output
        itself, unless the collective runs on host copies: then `_back` copies it there)."""
        source = self._view(what, in_address, in_count, dtype)
        target = self._view(what, out_address, out_count, dtype)
        if self._staged:  # host copies: they never overlap
            return source.cpu(), torch.empty_like(target, device="cpu"), target
        size = source.element_size()
        if (
            in_address < out_address + out_count * size
            and out_address < in_address + in_count * size
        ):
            source = source.clone()  # overlapping buffers: not every backend takes them in place
        return source, target, target

    def reduce_scatter_sum(
        self, in_address: int, out_address: int, count: int, dtype: str, stream: int
    ) -> None:
        if count == 0:
            return
        with self._stream(stream):
            source, out, target = self._in_out(
                "reduce_scatter_sum",
                in_address,
                count * self._world_size,
                out_address,
                count,
                dtype,
            )
            if self._list_reduce_scatter:
                chunks = source.chunk(self._world_size)
                for piece in self._pieces(count, out.element_size()):
                    pieces = [chunk[piece] for chunk in chunks]
                    dist.reduce_scatter(out[piece], pieces, op=dist.ReduceOp.SUM, group=self._group)
            else:
                _reduce_scatter_tensor(out, source, op=dist.ReduceOp.SUM, group=self._group)
            self._back(target, out)

    def all_gather(
        self, in_address: int, out_address: int, count: int, dtype: str, stream: int
    ) -> None:
        if count == 0:
            return
        with self._stream(stream):
            source, out, target = self._in_out(
                "all_gather", in_address, count, out_address, count * self._world_size, dtype
            )
            if self._piece_bytes is None:
                _all_gather_tensor(out, source, group=self._group)
            else:
                chunks = out.chunk(self._world_size)
                for piece in self._pieces(count, out.element_size()):
                    dist.all_gather(
                        [chunk[piece] for chunk in chunks], source[piece], group=self._group
                    )
            self._back(target, out)


class DataParallel:
    """One data-parallel ZenFlowAdamW's process group and what it does with it."""

    def __init__(self, group: Any, device: torch.device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.source = dist.get_global_rank(group, 0)  # the broadcast source, as DDP
        self.backend = str(dist.get_backend(group))
        self.device = device
        if device.type == "cpu" and self.backend == "nccl":
            raise ValueError(
                "process_group: an NCCL group reduces CUDA tensors; CPU parameters need a gloo group"
            )
        # gloo and CUDA parameters: every collective goes through host copies (correct, and
        # slow: for tests, e.g. several ranks sharing one GPU); NCCL is the GPU path.
        self.staged = device.type == "cuda" and self.backend == "gloo"
        self.ranks_per_host = self._ranks_on_this_host()

    def _ranks_on_this_host(self) -> int:
        """The group's ranks on this host, which share its cores (the engine's thread plan:
        ranks_per_host). Asked of the group once (torchrun's LOCAL_WORLD_SIZE describes the
        whole job, not necessarily this group)."""
        names: list[Any] = [None] * self.world_size
        dist.all_gather_object(names, socket.gethostname(), group=self.group)
        return max(1, names.count(socket.gethostname()))

    def attach(self, engine: Any) -> None:
        """Makes `engine` a rank of the group and gives it its device memory (always, in data
        parallel: every buffer the engine hands a collective lies in it)."""
        collectives = _EngineCollectives(self)
        engine.set_collectives(
            self.rank,
            self.world_size,
            collectives.all_reduce_sum,
            collectives.reduce_scatter_sum,
            collectives.all_gather,
        )
        # The engine wants its memory 256-byte aligned (torch's CPU allocator gives 64): a
        # view at the first aligned byte of a slightly larger buffer.
        size = engine.device_memory_size()
        raw = torch.empty(size + _MEMORY_ALIGNMENT, dtype=torch.uint8, device=self.device)
        start = -raw.data_ptr() % _MEMORY_ALIGNMENT
        memory = raw[start : start + size]
        collectives.attach(memory)
        engine.attach_device_memory(memory)

    def broadcast(self, params: list[torch.Tensor]) -> None:
        """Every rank takes the group's first rank's parameters (as DDP does at construction)."""
        with torch.no_grad():
            for p in params:
                if self.staged:
                    host = p.detach().cpu()
                    dist.broadcast(host, src=self.source, group=self.group)
                    p.detach().copy_(host)
                else:
                    dist.broadcast(p.detach(), src=self.source, group=self.group)

    def sum_state(self, saved: dict) -> None:
        """The engine's partial state (each rank's buffers hold what it owns, zeros elsewhere)
        summed over the ranks, in place: afterwards every rank holds the whole state. The
        buffers are CPU tensors; NCCL sums them on the device."""
        buffers = [t for entry in saved["params"] for t in entry.values()]
        for dtype in (torch.float32, torch.int32):
            bucket: list[torch.Tensor] = []
            bucket_bytes = 0
            for t in buffers:
                if t.dtype != dtype or t.numel() == 0:
                    continue
                bucket.append(t)
                bucket_bytes += t.numel() * t.element_size()
                if bucket_bytes >= _CONSOLIDATE_BUCKET_BYTES:
                    self._sum_bucket(bucket)
                    bucket, bucket_bytes = [], 0
            if bucket:
                self._sum_bucket(bucket)

    def _sum_bucket(self, bucket: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1) for t in bucket])
        flat = flat if self.staged else flat.to(self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat = flat.cpu()
        offset = 0
        for t in bucket:
            t.view(-1).copy_(flat[offset : offset + t.numel()])
            offset += t.numel()


def _shard_info(shard: Any, index: int) -> dict:
    name = f"shards[{index}]"
    if not isinstance(shard, dict):
        raise TypeError(
            f"{name}: expected a dict from sharded_state_dict(), got {type(shard).__name__}"
        )
    zenflow = shard.get("zenflow")
    info = zenflow.get("shard") if isinstance(zenflow, dict) else None
    keys = ("rank", "world_size", "matrices", "ranges")
    if (
        not isinstance(info, dict)
        or any(key not in info for key in keys)
        or "state" not in shard
        or "param_groups" not in shard
    ):
        raise ValueError(f"{name}: not a ZenFlowAdamW.sharded_state_dict()")
    return info


def consolidate_shards(shards: Any) -> dict[str, Any]:
    """The whole state dict (what state_dict() returns) from the sharded_state_dict() of every
    rank of one run, in any order. Raises ValueError when a rank is missing or repeated, or
    when the shards are of different runs."""
    if not isinstance(shards, (list, tuple)):
        raise TypeError(
            f"shards: expected a list of sharded_state_dict()s, got {type(shards).__name__}"
        )
    if not shards:
        raise ValueError("shards: empty (give every rank's sharded_state_dict())")
    infos = [_shard_info(shard, i) for i, shard in enumerate(shards)]
    world_size = int(infos[0]["world_size"])
    by_rank: dict[int, int] = {}
    for i, info in enumerate(infos):
        if int(info["world_size"]) != world_size:
            raise ValueError(
                f"shards[{i}]: of a run with {info['world_size']} ranks, shards[0] of one with {world_size}"
            )
        rank = int(info["rank"])
        if rank in by_rank:
            raise ValueError(
                f"shards[{i}]: rank {rank} appears twice (shards[{by_rank[rank]}] too)"
            )
        by_rank[rank] = i
    if len(shards) != world_size or set(by_rank) != set(range(world_size)):
        missing = sorted(set(range(world_size)) - set(by_rank))
        raise ValueError(f"shards: {world_size} ranks saved, missing rank(s) {missing}")
    first = shards[by_rank[0]]
    schedule = first["zenflow"]["schedule"]
    for i, shard in enumerate(shards):
        if shard["zenflow"]["schedule"] != schedule:
            raise ValueError(
                f"shards[{i}]: its schedule differs from rank 0's (shards of different steps)"
            )

    state: dict[int, dict] = {}
    for index, entry in first["state"].items():  # the dense parameters and rank 0's extras
        state[index] = dict(entry)
    for index, (shape, columns) in first["zenflow"]["shard"]["matrices"].items():
        rows = shape[0]
        full = {
            key: torch.zeros((rows, columns), dtype=torch.float32)
            for key in ("master", "exp_avg", "exp_avg_sq", "accumulator")
        }
        full["steps"] = torch.zeros(columns, dtype=torch.int32)
        step = 0.0
        covered = 0  # the ranks' column ranges must tile [0, columns) in rank order
        for rank in range(world_size):
            i = by_rank[rank]
            info = infos[i]
            part = shards[i]["state"].get(index)
            if part is None or list(info["matrices"].get(index, [])) != [shape, columns]:
                raise ValueError(
                    f"shards[{i}]: no state of matrix {index} (shards of another model)"
                )
            lo, hi = (int(c) for c in info["ranges"][index])
            if lo != covered or hi < lo or hi > columns:
                raise ValueError(
                    f"shards[{i}]: matrix {index} holds columns [{lo}, {hi}), expected them to start "
                    f"at {covered} (of {columns})"
                )
            covered = hi
            for key in ("master", "exp_avg", "exp_avg_sq", "steps", "accumulator"):
                want = (rows, hi - lo) if key != "steps" else (hi - lo,)
                if key == "accumulator" and key not in part:
                    continue  # a shard saved before the accumulators were part of the state
                if key not in part or tuple(part[key].shape) != want:
                    raise ValueError(
                        f"shards[{i}]['state'][{index}][{key!r}]: expected shape {want} "
                        "(shards of another model)"
                    )
            for key in ("master", "exp_avg", "exp_avg_sq", "accumulator"):
                if key in part:
                    full[key][:, lo:hi] = part[key]
            full["steps"][lo:hi] = part["steps"]
            step = max(step, float(part["step"]))
        if covered != columns:
            raise ValueError(
                f"shards: matrix {index} has columns [{covered}, {columns}) in no shard"
            )
        entry = state.setdefault(index, {})
        for key in ("master", "exp_avg", "exp_avg_sq", "accumulator"):
            entry[key] = full[key].reshape(shape)
        entry["steps"] = full["steps"]
        entry["step"] = torch.tensor(step)
    zenflow = {key: value for key, value in first["zenflow"].items() if key != "shard"}
    return {"state": state, "param_groups": first["param_groups"], "zenflow": zenflow}
