"""Run independent row blocks on all cores, with an optional progress bar (:mod:`hubless.progress`).

Each worker thread calls BLAS single-threaded on its own block (threadpoolctl limits BLAS to one
thread while the pool runs), so GEMM and the numpy post-processing of a block both use a full
core and no core idles while another block is being reduced. With fewer blocks than cores the
blocks run one after another with BLAS using every core instead, unless they are small
(fewer than :data:`SMALL_BATCH` rows, e.g. one query searched alone): those run on one BLAS
thread, as FAISS's search does on one OpenMP thread (:func:`small_batch_threads`).

Why: a thread team costs little on an idle machine, but when another process holds the other
core its worker waits a scheduler tick (4 ms at 250 Hz) before it runs. Measured on 2 shared
cores: one query x 10,000 x 256 took 8.0 ms on two BLAS threads and 0.24-0.48 ms on one; an
IVF256 FAISS search of 8 queries 8.0 ms on two OpenMP threads and 0.72 ms on one (16: 8.0 /
2.2 ms; 32: 11.3 / 5.9 ms). That fixed cost per call, not the search, was the single-query
latency of a Flat index (16-37 ms at 20,000 x 256 against 0.23 ms per query in a batch).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from threadpoolctl import ThreadpoolController

from hubless._validation import check_positive_int
from hubless.errors import InvalidInput
from hubless.progress import progress_bar

__all__ = ["SMALL_BATCH", "num_threads", "run_blocks", "small_batch_threads", "use_threads"]

#: Searches of fewer rows (queries) than this run their BLAS products and FAISS searches on the
#: calling thread alone (see the module docstring for the measurements).
SMALL_BATCH = 16


_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("hubless_threads", default=None)


@contextlib.contextmanager
def use_threads(threads: int | None) -> Iterator[None]:
    """Run the engine's blocks on ``threads`` worker threads inside the block (None keeps the
    surrounding setting): an explicit setting, so the process environment is never changed
    (e.g. a Ray task uses as many threads as it has CPUs)."""
    if threads is None:
        yield
        return
    token = _THREADS.set(check_positive_int(threads, "threads"))
    try:
        yield
    finally:
        _THREADS.reset(token)


def num_threads() -> int:
    """Worker threads: :func:`use_threads`'s, else ``HUBLESS_NUM_THREADS`` if set, else the
    number of usable cores."""
    chosen = _THREADS.get()
    if chosen is not None:
        return chosen
    env = os.environ.get("HUBLESS_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise InvalidInput(f"HUBLESS_NUM_THREADS must be an integer; got {env!r}") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_controller: tuple[int, ThreadpoolController] | None = None
_controller_lock = threading.Lock()


def one_blas_thread():
    """``threadpool_limits(limits=1, user_api="blas")`` without its scan of the loaded libraries
    on every call (a few ms: ``dl_iterate_phdr`` over every shared object, which a 1-row write
    would pay on each product): the scan is kept and done again only when modules were imported
    since (a BLAS is loaded by importing an extension module)."""
    global _controller
    modules = len(sys.modules)
    with _controller_lock:
        if _controller is None or _controller[0] != modules:
            _controller = (modules, ThreadpoolController())
        controller = _controller[1]
    return controller.limit(limits=1, user_api="blas")


class _NoBar:
    """The bar of work that shows none (a tqdm made only to be disabled costs ~0.1 ms a call)."""

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


_NO_BAR = _NoBar()


@contextlib.contextmanager
def small_batch_threads(rows: int) -> Iterator[None]:
    """Inside the block, a FAISS search of ``rows`` queries runs on the calling thread alone when
    ``rows`` < :data:`SMALL_BATCH` (the OpenMP team size is a per-thread setting: other threads'
    searches are not affected; each query is searched by one thread either way, so the results
    are the same)."""
    if rows >= SMALL_BATCH:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    if before <= 1:
        yield
        return
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def run_blocks(
    work: Callable[[int, int], None],
    bounds: Sequence[tuple[int, int]],
    *,
    progress: bool | None = None,
    desc: str = "",
    unit: str = "rows",
    single_threaded_blas: bool = False,
) -> None:
    """Call ``work(start, stop)`` for every block in ``bounds``, in parallel when worthwhile.

    ``work`` must only write to its own rows of shared outputs. Exceptions in a worker stop the
    remaining blocks and are re-raised here. The bar counts items (``stop - start``) and appears
    only after a second, so short runs stay quiet; a single block gets none unless
    ``progress=True``. ``single_threaded_blas``: BLAS stays at one thread even when the blocks
    run one after another (so a block's result never depends on how many there are).
    """
    total = bounds[-1][1] - bounds[0][0] if bounds else 0
    # one block has nothing to show before it is done: no bar unless asked for (a bar costs ms)
    show = progress if len(bounds) > 1 or progress else False
    bar = _NO_BAR if show is False else progress_bar(None, show, total=total, desc=desc, unit=unit, unit_scale=True)
    threads = min(num_threads(), len(bounds))
    single_threaded_blas = single_threaded_blas or total < SMALL_BATCH
    try:
        if threads <= 1:
            with one_blas_thread() if single_threaded_blas else contextlib.nullcontext():
                for start, stop in bounds:
                    work(start, stop)
                    bar.update(stop - start)
            return
        with one_blas_thread(), ThreadPoolExecutor(threads) as pool:
            futures = {pool.submit(work, start, stop): stop - start for start, stop in bounds}
            try:
                for future in as_completed(futures):
                    future.result()
                    bar.update(futures[future])
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    finally:
        bar.close()
