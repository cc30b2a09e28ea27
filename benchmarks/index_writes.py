"""Writes to a live index and loads, against the previous format (4), one run, one table.

    .venv/bin/python benchmarks/index_writes.py [--rows all|writes,metadata-adds,mapped-ivf] [--n 100000] [--big 1000000]
                                               [--bank 10000] [--previous bcbd699]

One function per group of rows (``ROWS``; ``--rows`` picks them), each returning its rows:

* writes (issue 27): batches of 1, 100 and 10,000 rows added to an ``--n`` x 512 index (NNN k=16 over a
  ``--bank`` query bank, Flat), in process (``Index.open(path).add(rows)``: the new rows'
  biases, one segment file, the CURRENT switch, fsyncs) and through the service (``hubless
  serve``, ``POST /items``); p50 latency over repeats and the bytes written to the index
  directory per write (files added or changed). The same with the previous format: in process
  ``with Index.update(path) as index: index.add(rows)``, through its service the same request.
  Each write's process CPU time is shown beside its wall time (the machine is shared: CPU time
  says what the write costs, wall time what it waited for: other processes, the disk's flushes).
  A 10k-row write goes into a fresh copy of the index each time (the second 10k would pass the
  compaction threshold, 1,000 + 10% of the base, and write a new base).
* Loads: a ``--big`` x 512 index (NNN k=16 over a 1,000-query bank, Flat) loaded in a fresh
  process, with and without ``mmap=True``: wall time and the bytes the load brought into the
  page cache (every file of the index evicted first with ``posix_fadvise(DONTNEED)``, then
  ``mincore`` counts what the load read or faulted in), against the size of the index.

The previous format is the hubless of commit ``--previous`` (format 4, before live indexes),
exported from git into a temporary directory and run in its own processes on the same data.
* metadata-adds (issue 38): 1-row adds with metadata into 20k x 64 opened live, the first ones
  against those after 2,000 earlier adds.
* mapped-ivf (issue 38): bytes read from disk per query by a search of a memory-mapped 100k x 256
  IVF256,Flat index (nprobe 16), against the pages the search touches, with and without the
  random-access hint (``MADV_RANDOM``).

* filters (issue 38): the rows of ``benchmarks/index_filters.py``: a filtered exact search
  matching 0.1% of ``--filter-n`` x ``--filter-dim`` against the unfiltered one, and the bytes a
  delete by filter of 1% of ``--n`` x ``--filter-dim`` items writes.

Floors: issue 27: a 1-row write into 100k x 512 writes < 1 MB and takes <= 20 ms p50 in process
and <= 50 ms through the service; a mmap load of 1M x 512 reads < 5% of the index's bytes.
Issue 38: a 1-row add with metadata after 2,000 adds <= 1.3x the first adds; a mapped IVF search
reads <= 2x the bytes of the pages it touches; a filtered search matching 0.1% of 1M x 128 costs
<= 0.05x the unfiltered exact search; a delete by filter of 1% of 100k items writes < 1% of the
index.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-write-key-0123456789"


def unit_rows(rng, n: int, d: int) -> np.ndarray:
    out = np.empty((n, d), np.float32)
    for s in range(0, n, 100_000):  # bounded temporaries
        x = rng.standard_normal((min(100_000, n - s), d)).astype(np.float32)
        out[s : s + x.shape[0]] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


# ---------------------------------------------------------------------------------- page cache
_libc = ctypes.CDLL(None, use_errno=True)


def evict(folder: Path) -> None:
    """Drop every file of ``folder`` from the page cache (clean pages: the files are fsynced)."""
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cached_bytes(folder: Path) -> int:
    """Bytes of ``folder``'s files (or of the file ``folder``) in the page cache (mincore over a
    private mapping of each)."""
    total, page = 0, mmap.PAGESIZE
    for f in [folder] if folder.is_file() else folder.rglob("*"):
        size = f.stat().st_size if f.is_file() else 0
        if not size:
            continue
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
            try:
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                anchor = ctypes.c_char.from_buffer(mm)
                if _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed")
                del anchor
                total += sum(1 for v in vec if v & 1) * page
            finally:
                mm.close()
    return min(total, folder_bytes(folder))


def folder_bytes(folder: Path) -> int:
    return folder.stat().st_size if folder.is_file() else sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def files_state(folder: Path) -> dict:
    return {str(f.relative_to(folder)): (f.stat().st_size, f.stat().st_mtime_ns) for f in folder.rglob("*") if f.is_file()}


def written_bytes(before: dict, after: dict) -> int:
    """Bytes of the files a write added or changed."""
    return sum(size for name, (size, mtime) in after.items() if before.get(name) != (size, mtime))


# ---------------------------------------------------------------------------------- processes
def run_python(src: Path, code: str, *args, timeout: float = 3600) -> dict:
    """Run ``code`` with hubless from ``src`` in a fresh process; its last stdout line as JSON."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"benchmark step failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


BUILD = """
import json, sys, numpy as np, hubless
g = np.load(sys.argv[1], mmap_mode="r"); b = np.load(sys.argv[2])
hubless.Index.build(np.asarray(g), b, "nnn:alpha=0.75,k=16", "Flat").save(sys.argv[3])
print(json.dumps({"ok": True}))
"""

LOAD = """
import json, sys, time, hubless
t0 = time.perf_counter()
index = hubless.Index.load(sys.argv[1], mmap=sys.argv[2] == "1")
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "n": index.ntotal}))
"""

PREVIOUS_WRITES = """
import json, os, sys, time, numpy as np, hubless
path, rows_file, repeats, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = np.load(rows_file)
def state():
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f); st = os.stat(p); out[p] = (st.st_size, st.st_mtime_ns)
    return out
times, written = [], []
for r in range(repeats):
    before = state(); t0 = time.perf_counter()
    with hubless.Index.update(path) as index:
        index.add(rows[r * batch : (r + 1) * batch])
    times.append(time.perf_counter() - t0)
    after = state()
    written.append(sum(s for p, (s, m) in after.items() if before.get(p) != (s, m)))
print(json.dumps({"times": times, "written": written}))
"""


class Server:
    """``hubless serve`` from ``src`` on a free loopback port, writes allowed with a key file."""

    def __init__(self, src: Path, index: Path, workdir: Path, extra=()) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (workdir / "key").write_text(KEY + "\n")
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-m", "hubless", "serve", f"idx={index}", "--port", str(self.port),
                                      "--api-key-file", str(workdir / "key"), *extra], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(self.base + "/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def add(self, rows: np.ndarray, header: str) -> float:
        body = json.dumps({"embeddings": rows.tolist()}).encode()
        req = urllib.request.Request(
            self.base + "/items/idx", data=body, headers={"content-type": "application/json", **{header: self._auth(header)}}
        )
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
        return time.perf_counter() - t0

    @staticmethod
    def _auth(header: str) -> str:
        return KEY if header.lower() == "x-api-key" else "Bearer " + KEY

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def previous_source(rev: str, workdir: Path) -> Path:
    """hubless's source at ``rev`` (the previous format), exported from git."""
    out = workdir / "previous"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out / "src"


def p50(values) -> float:
    return float(np.median(values))


def load_average() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def writes_and_loads(args, work: Path) -> tuple[list[tuple[str, str, str]], bool]:
    """The issue-27 rows: 1, 100 and 10k-row writes into ``--n`` x ``--dim`` (in process, through
    the service), loads of ``--big`` x ``--dim`` with and without mmap, against the previous format."""
    import hubless

    src = ROOT / "src"
    rng = np.random.default_rng(0)
    old_src = previous_source(args.previous, work)
    gallery, bank = unit_rows(rng, args.n, args.dim), unit_rows(rng, args.bank, args.dim)
    new_rows = unit_rows(rng, 10_000 * 3 + 100 * args.repeats + args.repeats, args.dim)
    np.save(work / "gallery.npy", gallery)
    np.save(work / "bank.npy", bank)
    np.save(work / "new.npy", new_rows)
    print(f"gallery {args.n:,} x {args.dim}, query bank {args.bank:,}, NNN k=16, Flat; previous format: hubless {args.previous}")
    print(f"load average (1/5/15 min) at the start: {load_average()} on {os.cpu_count()} cores")

    # ------------------------------------------------------------------ writes, this format
    built = hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=16", "Flat")
    results: dict[str, dict] = {}
    for batch, repeats in ((1, args.repeats), (100, max(5, args.repeats // 2)), (10_000, 3)):
        path = work / f"live{batch}"
        built.save(path)
        live = hubless.Index.open(path)
        times, cpu, written = [], [], []
        for r in range(repeats):
            if batch >= 10_000 and r:  # each into 100k items (no compaction)
                shutil.rmtree(path)
                built.save(path)
                live = hubless.Index.open(path)
            rows = new_rows[r * batch : (r + 1) * batch]
            before = files_state(path)
            c0, t0 = time.process_time(), time.perf_counter()
            live.add(rows)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            written.append(written_bytes(before, files_state(path)))
        results[f"in process, {batch} rows"] = {
            "p50_ms": 1000 * p50(times), "max_ms": 1000 * max(times), "cpu_ms": 1000 * p50(cpu), "written": p50(written)
        }  # fmt: skip
        memory = hubless.Index.load(path)  # the same add without the commit: the write's own cost
        t_mem = []
        for r in range(min(repeats, 9)):
            t0 = time.perf_counter()
            memory.add(new_rows[r * batch : (r + 1) * batch])
            t_mem.append(time.perf_counter() - t0)
        results[f"in process, {batch} rows"]["in_memory_ms"] = 1000 * p50(t_mem)
        print(f"  in process, {batch:>6} rows: p50 {1000 * p50(times):8.1f} ms (max {1000 * max(times):.1f}; CPU {1000 * p50(cpu):.1f}; "
              f"in memory {1000 * p50(t_mem):.1f}), {p50(written) / 1e6:8.3f} MB written")  # fmt: skip
        if batch <= 100:
            shutil.rmtree(path)
            built.save(path)
            server = Server(src, path, work)
            try:
                svc = [server.add(new_rows[r * batch : (r + 1) * batch], "Authorization") for r in range(repeats)]
            finally:
                server.stop()
            results[f"service, {batch} rows"] = {"p50_ms": 1000 * p50(svc)}
            print(f"  service,    {batch:>6} rows: p50 {1000 * p50(svc):8.1f} ms")
        shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ writes, previous format
    run_python(old_src, BUILD, work / "gallery.npy", work / "bank.npy", work / "old")
    prev = run_python(old_src, PREVIOUS_WRITES, work / "old", work / "new.npy", 5, 1)
    results["previous, in process, 1 row"] = {"p50_ms": 1000 * p50(prev["times"]), "written": p50(prev["written"])}
    print(f"  previous in process, 1 row: p50 {1000 * p50(prev['times']):.1f} ms, {p50(prev['written']) / 1e6:.1f} MB written")
    prev = run_python(old_src, PREVIOUS_WRITES, work / "old", work / "new.npy", 3, 100)
    results["previous, in process, 100 rows"] = {"p50_ms": 1000 * p50(prev["times"]), "written": p50(prev["written"])}
    print(f"  previous in process, 100 rows: p50 {1000 * p50(prev['times']):.1f} ms, {p50(prev['written']) / 1e6:.1f} MB written")
    server = Server(old_src, work / "old", work)
    try:
        old_svc = [server.add(new_rows[r : r + 1], "X-API-Key") for r in range(3)]
    finally:
        server.stop()
    results["previous, service, 1 row"] = {"p50_ms": 1000 * p50(old_svc)}
    print(f"  previous service,    1 row: p50 {1000 * p50(old_svc):.1f} ms")
    shutil.rmtree(work / "old")

    # ------------------------------------------------------------------ loads
    del gallery, built
    big = unit_rows(np.random.default_rng(1), args.big, args.dim)
    np.save(work / "big.npy", big)
    np.save(work / "bank_small.npy", bank[:1000])
    del big
    loads = {}
    for label, code_src in (("this format", src), ("previous format", old_src)):
        path = work / ("big_new" if label == "this format" else "big_old")
        run_python(code_src, BUILD, work / "big.npy", work / "bank_small.npy", path)
        size = folder_bytes(path)
        for use_mmap in (False, True):
            evict(path)
            out = run_python(code_src, LOAD, path, int(use_mmap))
            read = cached_bytes(path)
            loads[(label, use_mmap)] = {"seconds": out["seconds"], "read": read, "size": size}
            print(
                f"  load {label}, mmap={use_mmap}: {out['seconds']:.2f} s, read {read / 1e6:,.0f} MB of {size / 1e6:,.0f} MB ({100 * read / size:.2f}%)"
            )
        shutil.rmtree(path)
    print(f"load average at the end: {load_average()}")

    one, svc_one = results["in process, 1 rows"], results["service, 1 rows"]
    prev_one, prev_svc = results["previous, in process, 1 row"], results["previous, service, 1 row"]
    mm_new, mm_old = loads[("this format", True)], loads[("previous format", True)]
    full = (args.n, args.big, args.dim) == (100_000, 1_000_000, 512)
    rows = [
        ("1-row write in process: p50 (ms)", f"{one['p50_ms']:.1f}", "<= 20"),
        ("1-row write in process: CPU time p50 (ms)", f"{one['cpu_ms']:.1f}", ""),
        ("1-row write in process: bytes written", f"{one['written'] / 1e6:.4f} MB", "< 1 MB"),
        ("1-row write through the service: p50 (ms)", f"{svc_one['p50_ms']:.1f}", "<= 50"),
        ("100-row write in process / service: p50 (ms)",
         f"{results['in process, 100 rows']['p50_ms']:.1f} / {results['service, 100 rows']['p50_ms']:.1f}", ""),
        ("10k-row write in process: p50 (ms), MB written",
         f"{results['in process, 10000 rows']['p50_ms']:.0f}, {results['in process, 10000 rows']['written'] / 1e6:.1f}", ""),
        ("1-row write in process: previous format / this (time)", f"{prev_one['p50_ms'] / one['p50_ms']:.0f}x", ""),
        ("100-row write in process: previous format / this (time)",
         f"{results['previous, in process, 100 rows']['p50_ms'] / results['in process, 100 rows']['p50_ms']:.0f}x", ""),
        ("1-row write: previous format / this (bytes written)", f"{prev_one['written'] / max(one['written'], 1):,.0f}x", ""),
        ("1-row write through the service: previous / this", f"{prev_svc['p50_ms'] / svc_one['p50_ms']:.0f}x", ""),
        ("mmap load of the big index: share of its bytes read", f"{100 * mm_new['read'] / mm_new['size']:.2f}%", "< 5%"),
        ("mmap load: previous format / this (bytes read)", f"{mm_old['read'] / max(mm_new['read'], 1):,.0f}x", ""),
        ("mmap load: previous format / this (time)", f"{mm_old['seconds'] / mm_new['seconds']:.1f}x", ""),
        ("plain load: previous format / this (time)",
         f"{loads[('previous format', False)]['seconds'] / loads[('this format', False)]['seconds']:.1f}x", ""),
    ]  # fmt: skip
    return rows, full


def metadata_adds(args, work: Path) -> tuple[list[tuple[str, str, str]], bool]:
    """Issue 38's floor: 1-row adds with metadata into ``--meta-n`` x ``--meta-dim`` (NNN k=16 over a
    2,000-query bank, Flat, opened live: each add committed): two copies of one index, one fresh
    and one after 2,000 earlier adds, written to in turns (so both see the same machine: the
    load of a shared machine drifts by more than the floor), p50 of ``--repeats`` adds each. A
    write must cost O(batch), not O(writes so far)."""
    import hubless

    rng = np.random.default_rng(38)
    n, dim, repeats = args.meta_n, args.meta_dim, args.repeats
    gallery, bank = unit_rows(rng, n, dim), unit_rows(rng, 2000, dim)
    meta = [{"split": "train" if i % 5 else "test", "year": 2000 + i % 25} for i in range(n)]
    built = hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=16", "Flat", metadata=meta)
    fresh, grown = (built.save(work / "metadata-fresh"), built.save(work / "metadata-grown"))
    fresh, grown = hubless.Index.open(fresh), hubless.Index.open(grown)
    rows = unit_rows(rng, 2000 + 2 * repeats, dim)

    def add(index, i: int) -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        index.add(rows[i : i + 1], [{"split": "new", "year": 2026, "note": f"item {i}"}])
        return time.perf_counter() - t0, time.process_time() - c0

    for i in range(2000):
        add(grown, i)
    first_both, later_both = [], []
    for r in range(repeats):  # in turns
        first_both.append(add(fresh, 2000 + repeats + r))
        later_both.append(add(grown, 2000 + r))
    (first, first_cpu), (later, later_cpu) = zip(*first_both), zip(*later_both)
    storage = grown.storage()
    shutil.rmtree(work / "metadata-fresh", ignore_errors=True)
    shutil.rmtree(work / "metadata-grown", ignore_errors=True)
    ratio = p50(later) / p50(first)
    print(f"  1-row adds with metadata, {n:,} x {dim}: first p50 {1000 * p50(first):.1f} ms, after 2,000 adds "
          f"{1000 * p50(later):.1f} ms ({ratio:.2f}x; CPU {1000 * p50(first_cpu):.1f} -> {1000 * p50(later_cpu):.1f} ms); then "
          f"{storage['segments']} segments, {storage['rows_since_base']} rows since the base")  # fmt: skip
    return [
        ("1-row add with metadata: first adds, p50 (ms)", f"{1000 * p50(first):.1f}", ""),
        ("1-row add with metadata after 2,000 adds, p50 (ms)", f"{1000 * p50(later):.1f}", ""),
        ("1-row add with metadata after 2,000 adds / first adds", f"{ratio:.2f}x", "<= 1.3x"),
        ("the same in CPU time (without the waits for fsync)", f"{p50(later_cpu) / p50(first_cpu):.2f}x", ""),
    ], (n, dim) == (20_000, 64)


def _mapped_bytes(files: list[Path]) -> int:
    """Bytes of ``files`` this process has mapped in (the pages a search touched: the Rss of
    their mappings in /proc/self/smaps)."""
    names, total, current = {str(f.resolve()) for f in files}, 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and len(parts[1]) == 4:  # a mapping's header line
                current = len(parts) >= 6 and parts[5] in names
            elif current and parts[:1] == ["Rss:"]:
                total += int(parts[1]) * 1024
    return total


def _advise_mappings(files: list[Path], advice: int) -> None:
    """``madvise(advice)`` on every mapping of ``files`` in this process (to measure without the
    random-access hint hubless and FAISS give)."""
    names = {str(f.resolve()) for f in files}
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 6 and parts[-1] in names:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(advice))


def mapped_ivf_reads(args, work: Path) -> tuple[list[tuple[str, str, str]], bool]:
    """Issue 38 (build 5): bytes a search of a memory-mapped IVF index reads from disk, against the
    pages it touches: ``--ivf-n`` x ``--ivf-dim``, IVF256,Flat, nprobe 16, one query per fresh
    mapped load (every file of the index evicted from the page cache first with
    ``posix_fadvise(DONTNEED)``; read: the index.faiss and gallery.npy pages in the page cache after
    the search (``mincore``); touched: the pages the search mapped in (Rss of their mappings)), with
    the random-access hint hubless and FAISS give (``MADV_RANDOM``) and without it (``MADV_NORMAL``
    applied to the same mappings: the kernel's read-ahead)."""
    import hubless

    rng = np.random.default_rng(256)
    n, dim = args.ivf_n, args.ivf_dim
    path = work / "mapped-ivf"
    hubless.Index.build(unit_rows(rng, n, dim), unit_rows(rng, 2000, dim), "nnn:alpha=0.75,k=16", "IVF256,Flat", nprobe=16).save(path)
    base = path / json.loads((path / "CURRENT").read_text().split("\n", 1)[1])["base"]["name"]
    files = [base / "index.faiss", base / "gallery.npy"]
    queries = unit_rows(rng, args.ivf_queries, dim)
    results = {}
    for label, advice in (("MADV_RANDOM", None), ("MADV_NORMAL", mmap.MADV_NORMAL)):
        read, touched = [], []
        for q in queries:
            index = hubless.Index.load(path, mmap=True)
            if advice is not None:
                _advise_mappings(files, advice)
            evict(path)
            before_read, before_touched = sum(cached_bytes(f) for f in files), _mapped_bytes(files)
            index.search(q[None], 10)
            read.append(sum(cached_bytes(f) for f in files) - before_read)
            touched.append(_mapped_bytes(files) - before_touched)
            del index
        results[label] = (float(np.mean(read)), float(np.mean(touched)))
        print(f"  mapped IVF search, {label}: {results[label][0] / 1e6:.2f} MB read, {results[label][1] / 1e6:.2f} MB touched per query")
    shutil.rmtree(path, ignore_errors=True)
    (read, touched), (read_n, _) = results["MADV_RANDOM"], results["MADV_NORMAL"]
    return [
        ("mapped IVF search: MB read from disk / MB of pages touched per query",
         f"{read / 1e6:.2f} / {touched / 1e6:.2f} ({read / max(touched, 1):.2f}x)", "<= 2x"),
        ("mapped IVF search without the random-access hint: MB read per query", f"{read_n / 1e6:.2f} ({read_n / max(touched, 1):.2f}x)", ""),
    ], (n, dim) == (100_000, 256)  # fmt: skip


#: The measured rows by name (``--rows``): each function returns its (measure, value, floor) rows
#: and whether it ran at the size its floors are set for.
def filters(args, work: Path) -> tuple[list[tuple[str, str, str]], bool]:
    """The rows of ``benchmarks/index_filters.py``: a selective filter's cost, and what a delete
    by filter writes."""
    from index_filters import filter_rows

    (work / "filters").mkdir(exist_ok=True)
    rows = filter_rows(args.filter_n, args.filter_dim, args.n, 100, 9, work / "filters")
    return rows, (args.filter_n, args.filter_dim, args.n) == (1_000_000, 128, 100_000)


ROWS = {"writes": writes_and_loads, "metadata-adds": metadata_adds, "mapped-ivf": mapped_ivf_reads, "filters": filters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--bank", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--previous", default="bcbd699", help="git revision of the previous format (4)")
    parser.add_argument("--meta-n", type=int, default=20_000, help="items of the metadata-adds index")
    parser.add_argument("--meta-dim", type=int, default=64)
    parser.add_argument("--ivf-n", type=int, default=100_000, help="items of the mapped IVF index")
    parser.add_argument("--ivf-dim", type=int, default=256)
    parser.add_argument("--ivf-queries", type=int, default=10, help="queries measured (one per fresh load)")
    parser.add_argument("--filter-n", type=int, default=1_000_000, help="items of the filtered-search index (benchmarks/index_filters.py)")
    parser.add_argument("--filter-dim", type=int, default=128)
    parser.add_argument("--rows", default="all", help=f"which rows: all or a comma-separated list of {', '.join(ROWS)}")
    parser.add_argument("--workdir", default=None, help="where to write the indexes (default: a temporary directory)")
    args = parser.parse_args()
    names = list(ROWS) if args.rows == "all" else [name.strip() for name in args.rows.split(",")]
    unknown = [name for name in names if name not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    work = Path(tempfile.mkdtemp(prefix="index-writes-", dir=args.workdir))
    table: list[tuple[str, str, str]] = []
    try:
        for name in names:
            rows, full = ROWS[name](args, work)
            table += [(label, value, floor if full or not floor else "n/a at this size") for label, value, floor in rows]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(table, full_size=True, size="the defaults")


if __name__ == "__main__":
    main()
