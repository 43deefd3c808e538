"""zenflow's public low-level ops, one module per C header (zenflow/norms.h, topk.h,
optim.h, pack.h, cpu_adamw.h).

Every op takes torch tensors, numpy arrays or cupy arrays (torch directly, others through
DLPack or the array interface) and returns results of the same kind on the same device.
Each tensor is converted once per call. CPU arrays run the host implementation (SIMD,
multithreaded); CUDA arrays run the CUDA kernels on the current stream of their framework
(or on `stream`, a raw cudaStream_t handle). The arrays an op allocates (outputs, scratch
workspace) come from the pool of the stream its kernels run on, as if allocated under
`with torch.cuda.stream(...)`: scratch memory freed at return is never reused before the
kernels finish; results passed to another stream need the framework's record_stream. Bad input raises ValueError or TypeError
naming the argument, and writes nothing. Every torch tensor an op writes has its autograd
version counter bumped, as torch's own in-place ops do.
"""

from __future__ import annotations

from .cpu_adamw import (
    cpu_accumulate,
    cpu_adamw_step,
    cpu_adamw_step_flat,
    cpu_adamw_step_skip_columns,
    cpu_gather_columns,
    cpu_scatter_columns,
)
from .norms import ColumnStats, column_stats
from .optim import ColumnState, adamw_selected_columns_
from .pack import exchange_selected_columns, pack_columns, packed_offsets, scatter_columns
from .topk import select_topk_columns, topk_count

__all__ = [
    "ColumnState",
    "ColumnStats",
    "adamw_selected_columns_",
    "column_stats",
    "cpu_accumulate",
    "cpu_adamw_step",
    "cpu_adamw_step_flat",
    "cpu_adamw_step_skip_columns",
    "cpu_gather_columns",
    "cpu_scatter_columns",
    "exchange_selected_columns",
    "pack_columns",
    "packed_offsets",
    "scatter_columns",
    "select_topk_columns",
    "topk_count",
]
