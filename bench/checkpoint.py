"""Checkpoint format benchmark: save and restore GB/s of a 1 GiB model against the raw disk.

    uv run python bench/checkpoint.py                          # ours + raw safetensors + disk
    uv run --with zarr --with tensorstore python bench/checkpoint.py   # + zarr, tensorstore
    uv run python bench/checkpoint.py --size 256M --runs 3 --dir /mnt/fast/tmp

zarr and tensorstore are benchmark-only: ``uv run --with ...`` puts them in a throwaway
environment layered over the project's for that one command (nothing is added to the project
or its lock file); without them their rows say "not installed".

The model: float32 tensors shaped like a GPT-style transformer with d_model 1024 (a 32000 x 1024
embedding, then per layer qkv 1024 x 3072, out 1024 x 1024, MLP 1024 x 4096 and 4096 x 1024,
biases and layer norms), layers added until the total reaches ``--size`` (1 GiB: 19 layers,
231 tensors). The values are random (weights do not compress; no format gets a free ride).

Rows, each saving the same tensors into a fresh directory of ``--dir`` and restoring them:

- ``cluster.checkpoint``: the public API, ``Checkpoint(model={...cluster.Variable}).write(path)``
  and ``.read(path)``: safetensors + JSON index, sha256 over the tensor file, fsync of the files
  and directories, atomic rename; read checks size, sha256 and header, then assigns the
  variables. What a user pays.
- ``safetensors``: ``safetensors.numpy.save_file`` + fsync of the file, ``load_file``; the
  format alone, no checksum, no atomicity.
- ``zarr``: zarr v3 (``zarr.open_group``), one array per tensor, no compressor (the weights are
  random; a compressor only costs CPU), default chunking, every file fsynced; read back with
  ``[...]``.
- ``tensorstore``: the ``zarr3`` driver on the ``file`` kvstore, one array per tensor, one chunk
  each, every file fsynced; read back with ``.read().result()``.
- ``raw disk``: the floor: the same bytes as one file, written with ``os.write`` in 64 MiB
  pieces, fsynced; read back with ``os.readv`` into a preallocated buffer.

Every restore is checked equal to what was saved (a row that reads back wrong fails). Before
every restore the page cache is dropped (``echo 3 > /proc/sys/vm/drop_caches``, root only), so
restores read the disk; when that is not possible the table says "cached" and restores measure
memory, not the disk. GB/s = 1e9 bytes of tensor data / seconds; ``x disk`` = the row's GB/s over
the raw disk's (1.00 = as fast as the disk allows). Medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import safetensors.numpy  # noqa: E402

import cluster  # noqa: E402
from cluster.checkpoint import Checkpoint  # noqa: E402

__all__ = ["main", "make_model"]

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_PIECE = 64 << 20  # raw disk write/read granularity


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def make_model(size: int, d_model: int = 1024, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 tensors shaped like a transformer of width ``d_model`` (vocabulary 32000 at
    1024, scaled with it), at least ``size`` bytes in all (whole layers; at least the embedding
    and one layer)."""
    rng = np.random.default_rng(seed)
    d = d_model

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    model = {"embed": t(32000 * d // 1024, d)}
    layer = 0
    while layer == 0 or sum(a.nbytes for a in model.values()) < size:
        p = f"h{layer}"
        model |= {f"{p}.ln1.g": t(d), f"{p}.ln1.b": t(d),
                  f"{p}.attn.qkv.w": t(d, 3 * d), f"{p}.attn.qkv.b": t(3 * d),
                  f"{p}.attn.out.w": t(d, d), f"{p}.attn.out.b": t(d),
                  f"{p}.ln2.g": t(d), f"{p}.ln2.b": t(d),
                  f"{p}.mlp.fc.w": t(d, 4 * d), f"{p}.mlp.fc.b": t(4 * d),
                  f"{p}.mlp.proj.w": t(4 * d, d), f"{p}.mlp.proj.b": t(d)}
        layer += 1
    model["ln_f.g"] = t(d)
    model["ln_f.b"] = t(d)
    return model


def _fsync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (for formats that do not fsync)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Each format: save(path, tensors) and load(path) -> {name: array}.

class Ours:
    name = "cluster.checkpoint"

    def __init__(self, model: dict[str, np.ndarray]) -> None:
        # Variables created once, outside the timing, as in training; write() reads them.
        self.variables = {k.replace(".", "_"): cluster.Variable(v, name=k)
                          for k, v in model.items()}
        self.ckpt = Checkpoint(model=self.variables)
        self.names = {k.replace(".", "_"): k for k in model}

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        self.ckpt.write(path)

    def reset(self) -> None:
        """Zero the variables (untimed), so a read that assigns nothing is caught."""
        for v in self.variables.values():
            v.assign(np.zeros(v.shape, v.dtype))

    def load(self, path: str) -> dict[str, np.ndarray]:
        self.ckpt.read(path)
        return {self.names[k]: np.asarray(v.numpy()) for k, v in self.variables.items()}


class RawSafetensors:
    name = "safetensors"

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        os.mkdir(path)
        safetensors.numpy.save_file(tensors, os.path.join(path, "model.safetensors"))
        _fsync_tree(path)

    def load(self, path: str) -> dict[str, np.ndarray]:
        return safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))


class Zarr:
    name = "zarr"

    def __init__(self) -> None:
        import zarr
        self.zarr = zarr

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        group = self.zarr.open_group(path, mode="w")
        for k, v in tensors.items():
            array = group.create_array(k, shape=v.shape, dtype=v.dtype, compressors=None)
            array[...] = v
        _fsync_tree(path)

    def load(self, path: str) -> dict[str, np.ndarray]:
        group = self.zarr.open_group(path, mode="r")
        return {k: a[...] for k, a in group.arrays()}


class TensorStore:
    name = "tensorstore"

    def __init__(self) -> None:
        import tensorstore
        self.ts = tensorstore

    def _spec(self, path: str, key: str) -> dict:
        return {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, key)}}

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        os.mkdir(path)
        futures = []
        for k, v in tensors.items():
            store = self.ts.open(self._spec(path, k), create=True, dtype=self.ts.float32,
                                 shape=v.shape,
                                 chunk_layout=self.ts.ChunkLayout(chunk_shape=v.shape)).result()
            futures.append(store.write(v))
        for f in futures:  # tensorstore writes concurrently; wait for all
            f.result()
        _fsync_tree(path)

    def load(self, path: str) -> dict[str, np.ndarray]:
        names = sorted(os.listdir(path))
        stores = {k: self.ts.open(self._spec(path, k), open=True).result() for k in names}
        futures = {k: s.read() for k, s in stores.items()}
        return {k: f.result() for k, f in futures.items()}


class RawDisk:
    name = "raw disk"

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        os.mkdir(path)
        fd = os.open(os.path.join(path, "blob"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for array in tensors.values():
                view = memoryview(array.reshape(-1)).cast("B")
                for start in range(0, len(view), _PIECE):
                    piece = view[start:start + _PIECE]
                    while piece:  # os.write may write less than asked
                        piece = piece[os.write(fd, piece):]
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_tree(path)

    def load(self, path: str) -> dict[str, np.ndarray]:
        file = os.path.join(path, "blob")
        out = np.empty(os.path.getsize(file), np.uint8)
        view = memoryview(out)
        fd = os.open(file, os.O_RDONLY)
        try:
            done = 0
            while done < len(view):
                n = os.readv(fd, [view[done:done + _PIECE]])
                if n == 0:
                    raise OSError(f"{file}: short read at {done}")
                done += n
        finally:
            os.close(fd)
        return {"blob": out}


def drop_caches() -> bool:
    """Evict the page cache (root only); False when not possible."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _check(fmt: str, model: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    if fmt == RawDisk.name:
        expected = np.concatenate([a.reshape(-1).view(np.uint8) for a in model.values()])
        ok = np.array_equal(got["blob"], expected)
    else:
        ok = set(got) == set(model) and all(
            np.asarray(got[k]).dtype == v.dtype and np.array_equal(got[k], v)
            for k, v in model.items())
    if not ok:
        raise RuntimeError(f"bench/checkpoint.py: {fmt} restored different tensors")


def _du(path: str) -> tuple[int, int]:
    files = total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            files += 1
            total += os.path.getsize(os.path.join(dirpath, name))
    return files, total


def measure(fmt: object, model: dict[str, np.ndarray], root: str, runs: int,
            drop: bool = True) -> tuple[list[float], list[float], tuple[int, int], bool]:
    """(save seconds, restore seconds, (files, bytes) on disk, caches dropped) over ``runs``."""
    saves, loads, cold = [], [], True
    footprint = (0, 0)
    for run in range(runs):
        path = os.path.join(root, f"{fmt.name.replace(' ', '_')}-{run}")
        os.sync()  # earlier rows' dirty pages are not this row's cost
        t0 = time.perf_counter()
        fmt.save(path, model)
        saves.append(time.perf_counter() - t0)
        footprint = _du(path)
        if hasattr(fmt, "reset"):
            fmt.reset()
        cold = drop and drop_caches() and cold
        t0 = time.perf_counter()
        got = fmt.load(path)
        loads.append(time.perf_counter() - t0)
        _check(fmt.name, model, got)
        del got
        shutil.rmtree(path)
    return saves, loads, footprint, cold


def _optional(factory: Callable[[], object], module: str) -> object | None:
    return factory() if importlib.util.find_spec(module) is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1G", help="model size (default 1G = 1 GiB)")
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median shown)")
    parser.add_argument("--dir", default=None,
                        help="where to write (default: a temporary directory under $TMPDIR)")
    parser.add_argument("--d-model", type=int, default=1024,
                        help="model width (tensor shapes; small values for a smoke test)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="do not drop the page cache before restores (they then read memory)")
    parser.add_argument("--formats", default="cluster.checkpoint,safetensors,zarr,tensorstore,"
                        "raw disk", help="comma-separated rows")
    args = parser.parse_args(argv)

    model = make_model(parse_size(args.size), args.d_model)
    nbytes = sum(a.nbytes for a in model.values())
    print(f"model: {len(model)} float32 tensors, {nbytes / (1 << 30):.3f} GiB "
          f"({nbytes} bytes); {args.runs} runs per row; medians\n")

    factories: dict[str, Callable[[], object | None]] = {
        "cluster.checkpoint": lambda: Ours(model),
        "safetensors": RawSafetensors,
        "zarr": lambda: _optional(Zarr, "zarr"),
        "tensorstore": lambda: _optional(TensorStore, "tensorstore"),
        "raw disk": RawDisk,
    }
    wanted = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(wanted) - set(factories))
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {sorted(factories)}")

    results: dict[str, tuple[float, float, tuple[int, int], bool] | None] = {}
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    try:
        for name in wanted:
            fmt = factories[name]()
            if fmt is None:
                results[name] = None
                continue
            saves, loads, footprint, cold = measure(fmt, model, root, args.runs,
                                                     drop=not args.keep_cache)
            results[name] = (statistics.median(saves), statistics.median(loads), footprint, cold)
            print(f"  {name}: save {[round(s, 2) for s in saves]} s, "
                  f"restore {[round(s, 2) for s in loads]} s", flush=True)
            del fmt
    finally:
        shutil.rmtree(root, ignore_errors=True)

    disk = results.get("raw disk")
    print("\n| format | save s | save GB/s | save x disk | restore s | restore GB/s "
          "| restore x disk | files | on disk MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in wanted:
        row = results[name]
        if row is None:
            print(f"| {name} | not installed | | | | | | | |")
            continue
        save, load, (files, size), cold = row
        sx = f"{disk[0] / save:.2f}" if disk else "-"
        lx = f"{disk[1] / load:.2f}" if disk else "-"
        cached = "" if cold else " (cached)"
        print(f"| {name} | {save:.2f} | {nbytes / save / 1e9:.2f} | {sx} | {load:.2f}{cached} "
              f"| {nbytes / load / 1e9:.2f} | {lx} | {files} | {size / (1 << 20):.1f} |")
    if not all(r[3] for r in results.values() if r is not None):
        print("\n(cached): the page cache was not dropped (--keep-cache, or not root): those "
              "restores read memory, not the disk.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
