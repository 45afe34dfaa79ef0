"""Checkpoint format benchmark: save and restore GB/s of a 64 MiB and a 1 GiB model against dd.

    uv run python bench/checkpoint.py                  # 64M and 1G: ours, safetensors, disk, dd
    uv run --with zarr --with tensorstore python bench/checkpoint.py   # + zarr, tensorstore
    uv run python bench/checkpoint.py --sizes 256M --runs 3 --dir /mnt/fast/tmp

zarr and tensorstore are benchmark-only: ``uv run --with ...`` puts them in a throwaway
environment layered over the project's for that one command (nothing is added to the project
or its lock file); without them their rows say "not installed".

The model: float32 tensors shaped like a GPT-style transformer with d_model 1024 (a 32000 x 1024
embedding, then per layer qkv 1024 x 3072, out 1024 x 1024, MLP 1024 x 4096 and 4096 x 1024,
biases and layer norms), layers added until the total reaches each of ``--sizes`` (1 GiB: 19
layers, 231 tensors). A size too small for the embedding and one layer at width 1024 halves the
width until they fit (64 MiB: d_model 512, 3 layers, 39 tensors, 67 MiB). The values are random
(weights do not compress; no format gets a free ride).

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
- ``raw disk``: the same bytes as one file, written with ``os.write`` in 64 MiB pieces,
  fsynced; read back with ``os.readv`` into a preallocated buffer (what Python can do at best).
- ``dd``: the floor: ``dd if=/dev/zero of=F bs=64M count=<bytes> iflag=count_bytes
  conv=fsync``, then ``dd if=F of=/dev/null bs=64M`` after the cache drop; the same number of
  bytes in one file of the same directory. ``conv=fsync`` (buffered writes, one fsync at the
  end) rather than ``oflag=direct``: every row writes through the page cache and fsyncs, so
  that is the path whose speed the disk sets for them; ``oflag=direct`` would time the device
  without the page cache, at queue depth one (a synchronous 64 MiB write at a time), which is
  neither what a checkpoint writer can do nor always faster (both gave 0.62-0.72 GB/s on the CI
  machine).

Every restore is checked equal to what was saved (a row that reads back wrong fails). Before
every restore the page cache is dropped (``echo 3 > /proc/sys/vm/drop_caches``, root only), so
restores read the disk; when that is not possible the table says "cached" and restores measure
memory, not the disk. GB/s = 1e9 bytes of tensor data / seconds; ``/ dd`` = the row's seconds
over dd's (1.00 = as fast as dd; 1.30 = 30% slower). Medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import safetensors.numpy  # noqa: E402

import cluster  # noqa: E402
from bench.record import Column, Figure, Plot, Table, write_result  # noqa: E402
from cluster.checkpoint import Checkpoint  # noqa: E402

__all__ = ["main", "make_model", "width_for"]

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


def width_for(size: int) -> int:
    """1024, halved while the embedding and one layer at that width exceed ``size`` (min 64)."""
    d = 1024
    while d > 64 and (32000 * d // 1024) * d * 4 + (12 * d * d + 13 * d) * 4 > size:
        d //= 2
    return d


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
        # value() is a view: copying 1 GiB out here would be timed as part of the restore.
        return {self.names[k]: np.asarray(v.value()) for k, v in self.variables.items()}


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


class Dd:
    name = "dd"

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def _dd(self, *args: str) -> None:
        # A deadline, as for every blocking call: 1 GiB takes seconds; 10 minutes is a stuck disk.
        subprocess.run(["dd", *args, "status=none"], check=True, timeout=600)

    def save(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        os.mkdir(path)
        self._dd("if=/dev/zero", f"of={os.path.join(path, 'blob')}", "bs=64M",
                 f"count={self.nbytes}", "iflag=count_bytes", "conv=fsync")
        _fsync_tree(path)  # the directory entry, as every other row

    def load(self, path: str) -> dict[str, np.ndarray]:
        file = os.path.join(path, "blob")
        self._dd(f"if={file}", "of=/dev/null", "bs=64M")
        return {"blob": np.array(os.path.getsize(file))}


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
    if fmt == Dd.name:  # dd wrote zeros: check it wrote them all
        ok = int(got["blob"]) == sum(a.nbytes for a in model.values())
    elif fmt == RawDisk.name:
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


def _run_size(size: int, args: argparse.Namespace, wanted: list[str]) -> tuple[
        int, dict[str, tuple[float, float, tuple[int, int], bool] | None]]:
    """``(tensor bytes, {format: (save s, restore s, footprint, cold) or None})`` at one size."""
    model = make_model(size, args.d_model or width_for(size))
    nbytes = sum(a.nbytes for a in model.values())
    print(f"model: {len(model)} float32 tensors, {nbytes / (1 << 30):.3f} GiB "
          f"({nbytes} bytes); {args.runs} runs per row; medians", flush=True)
    factories: dict[str, Callable[[], object | None]] = {
        "cluster.checkpoint": lambda: Ours(model),
        "safetensors": RawSafetensors,
        "zarr": lambda: _optional(Zarr, "zarr"),
        "tensorstore": lambda: _optional(TensorStore, "tensorstore"),
        "raw disk": RawDisk,
        "dd": lambda: Dd(nbytes),
    }
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
            print(f"  {name}: save {[round(s, 3) for s in saves]} s, "
                  f"restore {[round(s, 3) for s in loads]} s", flush=True)
            del fmt
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return nbytes, results


FORMATS = ["cluster.checkpoint", "safetensors", "zarr", "tensorstore", "raw disk", "dd"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64M,1G",
                        help="comma-separated model sizes (default 64M,1G: 64 MiB and 1 GiB)")
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median shown)")
    parser.add_argument("--dir", default=None,
                        help="where to write (default: a temporary directory under $TMPDIR)")
    parser.add_argument("--d-model", type=int, default=None,
                        help="model width (default: 1024, halved until a layer fits the size; "
                        "small values for a smoke test)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="do not drop the page cache before restores (they then read memory)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated rows")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    wanted = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(wanted) - set(FORMATS))
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {FORMATS}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    tables = [_run_size(size, args, wanted) for size in sizes]
    print("\n| model | format | save s | save GB/s | save / dd | restore s | restore GB/s "
          "| restore / dd | files | on disk MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    all_cold = True
    for nbytes, results in tables:
        dd = results.get("dd")
        label = _size_label(nbytes)
        for name in wanted:
            row = results[name]
            if row is None:
                print(f"| {label} | {name} | not installed | | | | | | | |")
                continue
            save, load, (files, size), cold = row
            all_cold = all_cold and cold
            sx = f"{save / dd[0]:.2f}" if dd else "-"
            lx = f"{load / dd[1]:.2f}" if dd else "-"
            cached = "" if cold else " (cached)"
            print(f"| {label} | {name} | {save:.3f} | {nbytes / save / 1e9:.2f} | {sx} "
                  f"| {load:.3f}{cached} | {nbytes / load / 1e9:.2f} | {lx} | {files} "
                  f"| {size / (1 << 20):.1f} |")
    if not all_cold:
        print("\n(cached): the page cache was not dropped (--keep-cache, or not root): those "
              "restores read memory, not the disk.")
    if args.json:
        table = result_table(tables, wanted)
        write_result(args.json, name=args.json.stem, title="Checkpoint save and restore",
                     summary=("Save and restore through the public API beside other formats, "
                              "one raw write and dd of the same bytes to the same disk, in one "
                              "run; medians of --runs. `/ dd` is the row's seconds over dd's "
                              "(below 1: faster than dd)."),
                     script="checkpoint.py", argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[table], figures=result_figures(table),
                     plots=[Plot(title="Save and restore rate", table=0, kind="bar",
                                 x=("model", "format"), y=("save rate", "restore rate"),
                                 ylabel="GB/s")])
    return 0


def _size_label(nbytes: int) -> str:
    """A model size as the table prints it: whole MiB from 1 MiB up, else KiB."""
    return f"{nbytes / (1 << 20):.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / (1 << 10):.0f} KiB"


def result_table(tables: list[tuple[int, dict]], wanted: list[str]) -> Table:
    """One row per (model size, format): seconds, GB/s and the ratio to dd of save and restore,
    and whether the restore read the disk (page cache dropped) or memory."""
    rows = []
    for nbytes, results in tables:
        dd = results.get("dd")
        label = _size_label(nbytes)
        for name in wanted:
            row = results[name]
            if row is None:  # not installed
                rows.append((label, name, None, None, None, None, None, None, None, None, None))
                continue
            save, load, (files, size), cold = row
            rows.append((label, name, round(save, 3), round(nbytes / save / 1e9, 2),
                         round(save / dd[0], 2) if dd else None, round(load, 3),
                         round(nbytes / load / 1e9, 2), round(load / dd[1], 2) if dd else None,
                         "disk" if cold else "page cache", files, round(size / (1 << 20), 1)))
    return Table(title="Medians of the runs", rows=tuple(rows), columns=(
        Column("model"), Column("format"), Column("save", "s", 3),
        Column("save rate", "GB/s", 2), Column("save / dd", "x", 2), Column("restore", "s", 3),
        Column("restore rate", "GB/s", 2), Column("restore / dd", "x", 2),
        Column("restore read"), Column("files", "count"), Column("on disk", "MiB", 1)))


def result_figures(table: Table) -> list[Figure]:
    """``cluster.checkpoint``'s save and restore over dd's at the last model size."""
    ours = [row for row in table.rows if row[1] == "cluster.checkpoint"]
    if not ours:
        return []
    row = ours[-1]
    return [Figure(f"cluster.checkpoint {what} {row[0]} / dd", row[table.column(f"{what} / dd")],
                   "x") for what in ("save", "restore")
            if row[table.column(f"{what} / dd")] is not None]


if __name__ == "__main__":
    raise SystemExit(main())
