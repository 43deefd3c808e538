"""Data-parallel training with ZenFlowAdamW under torchrun.

    torchrun --nproc_per_node 2 examples/torchrun_data_parallel.py

Runs on the CPU with gloo as written (NCCL and CUDA parameters: pass --device cuda). Each rank
trains the same small model on its share of every global batch; zenflow reduces the
gradients itself, so the model is a plain module, not DistributedDataParallel. Prints each
rank's loss and, at the end, zenflow's statistics (per-rank bytes down and up, collective
bytes, host update time).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import zenflow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world_size:
        raise SystemExit(
            f"--global-batch {args.global_batch} must be divisible by the world size {world_size}"
        )
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if args.device == "cuda"
        else torch.device("cpu")
    )

    torch.manual_seed(rank)  # different on every rank: the optimizer broadcasts rank 0's
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 16),
    ).to(device)
    # The default process group; each rank keeps and updates 1/world_size of the deferred columns.
    opt = zenflow.ZenFlowAdamW(
        model.parameters(), lr=3e-3, topk_ratio=0.1, update_interval=4, max_grad_norm=1.0
    )
    opt.overlap_backward(model)  # hands gradients over while backward runs

    # A fixed regression task, the same global batches on every rank (seeded by step).
    target = torch.nn.Linear(128, 16).to(device)
    share = args.global_batch // world_size
    for step in range(args.steps):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(args.global_batch, 128, generator=generator).to(device)
        with torch.no_grad():
            y = target(x)
        mine = slice(rank * share, (rank + 1) * share)
        # Each rank's loss is the mean over its share; the step follows the global mean.
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step:3d} loss {loss.item():.5f}", flush=True)

    opt.flush()
    state = opt.state_dict()  # the whole state, on every rank (a collective)
    shard = opt.sharded_state_dict()  # this rank's columns only
    own = sum(t.numel() for entry in shard["state"].values() for t in entry.values())
    whole = sum(t.numel() for entry in state["state"].values() for t in entry.values())
    print(f"rank {rank}: {zenflow.format_stats(opt.stats())}", flush=True)
    print(f"rank {rank}: its shard holds {own} of the state's {whole} values", flush=True)
    opt.close()
    dist.barrier()  # every rank done before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
