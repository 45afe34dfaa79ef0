"""One rank of torch.distributed gloo on an emulated host (``bench/allreduce.py --netns-hosts``),
beside ours on the same hosts: the same sizes, barriers and timing as the loopback gloo column,
over the hosts' ``eth0`` (``GLOO_SOCKET_IFNAME``); prints ``TIMES {"size": [[wall seconds,
process CPU seconds], ...]}``.

Usage: python bench/_netns_gloo.py RANK N MASTER_ADDRESS PORT SIZES ITERS WARMUP
"""

import json
import sys
import time


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    rank, n, address, port = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    sizes = [int(s) for s in argv[4].split(",")]
    iters, warmup = int(argv[5]), int(argv[6])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=n)
    times = {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        per_iter = []
        for i in range(warmup + iters):
            y = x.clone()
            dist.barrier()
            cpu, start = time.process_time(), time.perf_counter()
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
            if i >= warmup:
                per_iter.append((time.perf_counter() - start, time.process_time() - cpu))
        if float(y[0]) != n:
            raise AssertionError(f"gloo all-reduce gave {float(y[0])}, expected {n}")
        times[size] = per_iter
    dist.destroy_process_group()
    print("TIMES " + json.dumps(times), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
