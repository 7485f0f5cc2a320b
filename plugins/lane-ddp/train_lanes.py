"""A small lane model trained data-parallel with PyTorch (DDP), as a drivetrain stage runs it.

    python3 train_lanes.py FRAMES_DIR MODEL_DIR

Reads the frame table `ingest` writes (Parquet under FRAMES_DIR) and learns the car's
lateral offset in its lane (`lateral_offset_m`) from its signals. Every rank reads the
rendezvous from the environment the engine gives every stage (torchrun's contract:
`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), so the same file runs
as one process or as N ranks, here or in a pod. It trains on the GPU the stage was given
(`CUDA_VISIBLE_DEVICES`, NCCL) when there is one, else on the CPU (gloo).

After every epoch rank 0 writes a checkpoint into `DRIVETRAIN_CHECKPOINTS` (kept across
the attempts of the stage); an attempt that finds one resumes from it, so a retry after a
lost rank loses at most an epoch. `EPOCHS` sets the epochs; `FAIL_AFTER_EPOCH=N` makes the
first attempt fail after epoch N (to show the resumed retry). Rank 0 writes `model.pt`
and `values.json` (loss, epochs, where it resumed, a digest of the weights); every rank
prints the digest of its own weights, which DDP keeps identical.
"""

import hashlib
import json
import os
import sys

import pyarrow.dataset as ds
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = ["speed_mps", "yaw_rate", "steering", "accel_y", "lane_confidence"]
TARGET = "lateral_offset_m"


def load(frames):
    table = ds.dataset(frames, format="parquet", partitioning="hive").to_table(columns=FEATURES + [TARGET])
    x = torch.tensor([table.column(c).to_pylist() for c in FEATURES], dtype=torch.float64).T
    y = torch.tensor(table.column(TARGET).to_pylist(), dtype=torch.float64)
    # Rows without a target are not examples; a missing signal counts as its mean.
    keep = ~torch.isnan(y)
    x, y = x[keep], y[keep]
    mean = torch.nanmean(x, dim=0)
    x = torch.where(torch.isnan(x), mean, x)
    std = x.std(dim=0).clamp(min=1e-6)
    return ((x - mean) / std).float(), y.float().unsqueeze(1)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        # The parameter's bytes as stored (torch's wheel does not bring NumPy along).
        h.update(bytes(p.detach().cpu().contiguous().flatten().view(torch.uint8).tolist()))
    return h.hexdigest()


def main():
    frames, out = sys.argv[1], sys.argv[2]
    epochs = int(os.environ.get("EPOCHS", "3"))
    fail_after = int(os.environ.get("FAIL_AFTER_EPOCH", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1)) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    torch.manual_seed(0)
    x, y = load(frames)
    # Each rank its own contiguous shard, all of one size (DDP steps in lockstep).
    n = len(x) // world
    x, y = x[rank * n:(rank + 1) * n].to(device), y[rank * n:(rank + 1) * n].to(device)
    model = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = os.path.join(os.environ["DRIVETRAIN_CHECKPOINTS"], "lanes.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
        print(f"rank {rank}: resuming after epoch {state['epoch']}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    loss_fn = torch.nn.MSELoss()
    loss = None
    for epoch in range(start, epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).to(device)
        for i in range(0, n, 256):
            batch = order[i:i + 256]
            opt.zero_grad()
            loss = loss_fn(ddp(x[batch]), y[batch])
            loss.backward()
            opt.step()
        if rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"epoch": epoch, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
            os.replace(tmp, ckpt)
            print(f"epoch {epoch}: loss {loss.item():.5f}, checkpoint written", flush=True)
        dist.barrier()
        if fail_after and epoch + 1 == fail_after and os.environ.get("DRIVETRAIN_ATTEMPT") == "1" and rank == 0:
            print(f"failing after epoch {epoch} as asked (FAIL_AFTER_EPOCH)", flush=True)
            sys.exit(3)
    weights = digest(model)
    print(f"rank {rank}: weights sha256 {weights}", flush=True)
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(out, "model.pt"))
        with open(os.environ["DRIVETRAIN_VALUES"], "w") as f:
            json.dump({"epochs": epochs, "resumed_after_epoch": start - 1 if start else None,
                       "loss": None if loss is None else loss.item(), "weights_sha256": weights,
                       "device": str(device), "world_size": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
