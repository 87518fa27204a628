"""One rank of the distributed tests (tests/test_distributed.py), run under ``torchrun``
or as plain processes with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. (The DDP
run is the shipped example, ``layerscope.examples.ddp_train``.)

    python tests/dist_worker.py trainer OUT                  # HF Trainer with the callback
    python tests/dist_worker.py die OUT                      # rank 1 raises in its second cycle
    python tests/dist_worker.py rank0 OUT                    # only rank 0 profiles
    python tests/dist_worker.py fsdp OUT                     # FSDP2 (fully_shard), 3 steps

Every mode uses the gloo backend and one thread per rank.
"""

from __future__ import annotations

import argparse
import gc

import torch
import torch.distributed as dist
from torch import nn

import layerscope
from layerscope.examples.ddp_train import SCHEDULE, STEPS, model


def die(out: str) -> None:
    """No collectives in the loop (a dead peer would make them raise): each rank trains
    its own copy, and rank 1 raises in step 6, the second cycle's warm-up step."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    save, gather = layerscope.handlers.save_json(out), layerscope.handlers.gather(f"{out}/merged", timeout=3)
    with layerscope.Profiler(
        net, schedule=layerscope.schedule(**SCHEDULE), on_ready=lambda p: (save(p), gather(p))
    ) as prof:
        for step in range(STEPS):
            if step == 6 and dist.get_rank() == 1:
                raise RuntimeError("rank 1 fails on purpose in step 6")
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def rank0(out: str) -> None:
    """Only rank 0 profiles (``if rank == 0: with Profiler(...)``); then every rank meets
    at a barrier. Nothing in the profiler may wait for the other ranks."""
    net = model()
    x = torch.randn(16, 64)
    if dist.get_rank() == 0:
        with layerscope.Profiler(net) as prof:
            net(x)
        prof.profile.save(f"{out}/rank0.json")
    dist.barrier()


def fsdp(out: str) -> None:
    """The example's model sharded with FSDP2: its two Linear layers, then the whole."""
    from torch.distributed.fsdp import fully_shard

    net = model()
    fully_shard(net[0])
    fully_shard(net[3])
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    with layerscope.Profiler(net) as prof:
        for _ in range(3):
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    prof.profile.save(f"{out}/fsdp_rank{dist.get_rank()}.json")


def trainer(out: str) -> None:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from layerscope.integrations.transformers import LayerscopeTrainerCallback

    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(32)]
    args = TrainingArguments(
        output_dir=out, max_steps=5, per_device_train_batch_size=2, use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )
    with LayerscopeTrainerCallback(output_dir=f"{out}/layerscope") as callback:
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["die", "fsdp", "rank0", "trainer"])
    parser.add_argument("out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "trainer":
        try:
            trainer(args.out)  # the Trainer sets up the process group itself ...
        finally:
            # ... and leaves it up: torn down at exit with gloo's threads running, a
            # rank can abort ("terminate called without an active exception").
            if dist.is_initialized():
                gc.collect()  # the Trainer's DDP before its process group (see the example)
                dist.destroy_process_group()
        return
    dist.init_process_group("gloo")
    try:
        {"die": die, "fsdp": fsdp, "rank0": rank0}[args.mode](args.out)
    finally:
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
