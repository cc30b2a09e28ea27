"""Choosing the torch engine's device (issue 51): a list of devices works wherever a device is
taken, a device torch cannot run here is an InvalidInput naming the available ones, TF32 is set
per pass without touching other threads or the program's own setting, and compiling falls back
to eager kernels only when the compiler fails."""

from __future__ import annotations

import contextvars
import threading
import time

import numpy as np
import pytest

import hubless
from hubless.corrections import make_correction
from hubless.engine import torch_arrays as ta
from hubless.engine import torch_reducers, use_device
from hubless.engine.device import resolve, tf32_choice, tf32_enabled, tf32_products
from hubless.errors import InvalidInput
from tests.conftest import unit_rows

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the models extra)")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return {name: unit_rows(rng, n, 16) for name, n in (("gallery", 120), ("query_bank", 200), ("gallery_bank", 90), ("queries", 30))}


# ---------------------------------------------------------------------- several devices as a list
@pytest.mark.parametrize("pair", [["cpu", "cpu"], ("cpu", "cpu"), "cpu,cpu", "cpu, cpu"])
def test_a_list_of_devices_works_wherever_a_device_is_taken(pair, data, monkeypatch):
    """docs/how-to/gpu.md: ``device=["cuda:0", "cuda:1"]`` as ``"cuda:0,cuda:1"``, on fit,
    search, evaluate, tune, the score-matrix fit and ``use_device``: the results equal numpy's."""
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 41))
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    assert resolve(pair) == ("cpu,cpu", "float32")
    want = make_correction("dualdis:k_activation=2").fit(g, qb, gb)
    got = make_correction("dualdis:k_activation=2").fit(g, qb, gb, device=pair)
    np.testing.assert_array_equal(got.activation_masks_, want.activation_masks_)
    np.testing.assert_allclose(got.bias_columns_, want.bias_columns_, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.search(q, 7, device=pair)[1], want.search(q, 7)[1])
    with use_device(pair):
        assert resolve() == ("cpu,cpu", "float32")
        inside = hubless.fit_many(["nnn:k=4", "gc"], g, qb)
    outside = hubless.fit_many(["nnn:k=4", "gc"], g, qb)
    np.testing.assert_allclose(inside[0].bias_, outside[0].bias_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inside[1].probes_, outside[1].probes_, atol=1e-6)
    truth = np.arange(len(q))
    runs = [hubless.evaluate(g, q, truth, qb, ["nnn:k=4", "gc"], bootstrap=0, progress=False, device=d) for d in (None, pair)]
    assert [r.metrics for r in runs[1].results] == [r.metrics for r in runs[0].results]
    tuned = [hubless.tune(g, q, truth, qb, ["nnn"], grids={"nnn": {"k": [3, 5]}}, progress=False, device=d) for d in (None, pair)]
    assert repr(tuned[1]) == repr(tuned[0])
    sb = qb @ g.T
    on_scores = [make_correction("is:beta=10.0").fit_scores(sb) for _ in range(2)]
    with use_device(pair):
        on_scores[1] = make_correction("is:beta=10.0").fit_scores(sb)
    np.testing.assert_allclose(on_scores[1].bias_, on_scores[0].bias_, rtol=1e-6)


# ---------------------------------------------------------------------- devices torch cannot run here
def _unavailable() -> list[str]:
    """Device names torch cannot compute on in this process (on this machine)."""
    from hubless._torch import available_devices

    here = set(available_devices())
    names = ["meta", "hpu", "ipu", "mtia", "xla", "vulkan", "garbage", "cuda:x", "cuda:-1", f"cuda:{torch.cuda.device_count()}"]
    names += [name for name in ("mps", "xpu", "cuda", "cuda:0", "mps:1") if name not in here and name.split(":")[0] not in here]
    return names


@pytest.mark.parametrize("name", _unavailable())
def test_a_device_torch_cannot_run_here_is_refused_naming_the_available_ones(name, data):
    """Every entry point that takes a device refuses it before any work, with one
    InvalidInput that names the devices available here (never torch's RuntimeError,
    AssertionError or ModuleNotFoundError, nor a meta tensor that cannot be read)."""
    from hubless._torch import available_devices, resolve_device

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    here = ", ".join(available_devices())
    fitted = hubless.NNN(k=3).fit(g, qb)
    calls = {
        "resolve": lambda d: resolve(d),
        "resolve_device": lambda d: resolve_device(d),
        "fit": lambda d: hubless.NNN(k=3).fit(g, qb, device=d),
        "search": lambda d: fitted.search(q, 3, device=d),
        "evaluate": lambda d: hubless.evaluate(g, q, np.arange(len(q)), qb, ["nnn:k=3"], bootstrap=0, progress=False, device=d),
        "use_device": lambda d: _fit_inside(d, g, qb),
        "one of two": lambda d: hubless.NNN(k=3).fit(g, qb, device=["cpu", d]),
    }
    for where, call in calls.items():
        with pytest.raises(InvalidInput) as caught:
            call(name)
        message = str(caught.value)
        assert repr(name) in message and f"available here: {here}" in message, (where, message)


def _fit_inside(device, g, qb):
    with use_device(device):
        return hubless.NNN(k=3).fit(g, qb)


@pytest.mark.parametrize("empty", ["", " ", [], ",", "cpu,", ["cpu", ""]])
def test_an_empty_device_name_is_refused(empty, data, monkeypatch):
    """``device=""`` used to run numpy silently: an empty name (or an empty one among several)
    is an InvalidInput; an empty HUBLESS_DEVICE is unset, as an empty variable usually is."""
    g, qb = data["gallery"], data["query_bank"]
    for call in (lambda: resolve(empty), lambda: hubless.NNN(k=3).fit(g, qb, device=empty), lambda: _fit_inside(empty, g, qb)):
        with pytest.raises(InvalidInput, match="names no device|an empty name between its commas"):
            call()
    monkeypatch.setenv("HUBLESS_DEVICE", "")
    assert resolve() == ("numpy", "float32")


def test_numpy_is_not_one_of_several_devices():
    with pytest.raises(InvalidInput, match="numpy cannot be one of several devices"):
        resolve(["numpy", "cpu"])
    assert resolve("numpy") == ("numpy", "float32")


def test_cpu_and_its_index_run_here():
    assert resolve("cpu") == ("cpu", "float32") and resolve(" cpu:0 ") == ("cpu:0", "float32")


# ---------------------------------------------------------------------- TF32, one pass at a time
@pytest.fixture
def tf32_flag(monkeypatch):
    """torch's legacy TF32 flag (CPU torch holds it too), put back after the test."""
    monkeypatch.delenv("HUBLESS_TF32", raising=False)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    yield matmul
    matmul.allow_tf32 = before


def _in_thread(fn):
    """``fn`` in a thread, with this thread's context (as the engine's device threads run)."""
    context = contextvars.copy_context()
    thread = threading.Thread(target=lambda: context.run(fn), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("own", [False, True])
def test_a_pass_that_did_not_ask_never_touches_torchs_flag(own, tf32_flag):
    """Not asked (no tf32=, no HUBLESS_TF32), a pass follows the program's own setting and never
    writes the flag: a program that allowed TF32 keeps it allowed during and after the pass."""
    tf32_flag.allow_tf32 = own
    assert tf32_choice() is None and tf32_enabled() is own
    with tf32_products("cuda:0"):
        assert tf32_flag.allow_tf32 is own
    assert tf32_flag.allow_tf32 is own


@pytest.mark.parametrize("own", [False, True])
def test_a_pass_that_asked_sets_the_flag_and_puts_the_programs_back(own, tf32_flag, monkeypatch):
    tf32_flag.allow_tf32 = own
    for asked in (True, False):
        with use_device(None, tf32=asked), tf32_products("cuda:0"):
            assert tf32_flag.allow_tf32 is asked
        assert tf32_flag.allow_tf32 is own
    monkeypatch.setenv("HUBLESS_TF32", "0" if own else "1")
    assert tf32_choice() is (not own)
    with tf32_products("cuda:0"):
        assert tf32_flag.allow_tf32 is (not own)
    assert tf32_flag.allow_tf32 is own
    with use_device(None, tf32=not own), tf32_products("cpu"):
        assert tf32_flag.allow_tf32 is own  # not a CUDA device: nothing changes


def test_threads_never_see_another_pass_s_tf32_setting(tf32_flag):
    """One thread's pass asked for TF32 while the program's own setting is off: a pass of
    another thread that did not ask waits until it has left and then runs with the program's
    setting (never TF32); a pass that asked for the same setting runs beside it; the flag is
    the program's again once both have left."""
    tf32_flag.allow_tf32 = False
    inside, release, seen, order = threading.Event(), threading.Event(), {}, []

    def asked_for_tf32():
        with use_device(None, tf32=True), tf32_products("cuda:0"):
            seen["asked"] = tf32_flag.allow_tf32
            order.append("asked in")
            inside.set()
            release.wait(20)
            order.append("asked out")

    def not_asked():
        with tf32_products("cuda:1"):
            order.append("default in")
            seen["default"] = tf32_flag.allow_tf32

    def same_setting():
        with use_device(None, tf32=True), tf32_products("cuda:1"):
            order.append("same in")
            seen["same"] = tf32_flag.allow_tf32

    first = _in_thread(asked_for_tf32)
    assert inside.wait(20)
    waiting = _in_thread(not_asked)
    beside = _in_thread(same_setting)
    beside.join(20)
    time.sleep(0.2)  # the pass that did not ask is still waiting
    assert "default in" not in order and order[-1] == "same in"
    release.set()
    first.join(20)
    waiting.join(20)
    assert order.index("default in") > order.index("asked out")
    assert seen == {"asked": True, "same": True, "default": False}
    assert tf32_flag.allow_tf32 is False


def test_passes_of_several_devices_share_the_setting_and_the_last_restores_it(tf32_flag):
    """The threads of several devices (one setting) hold the flag together: it stays set until
    the last has left. A program on torch's newer fp32_precision API (reading allow_tf32 then
    raises) gets that API set and restored."""
    tf32_flag.allow_tf32 = False
    outer_done, inner_in, seen = threading.Event(), threading.Event(), []
    with use_device(None, tf32=True):

        def other_device():
            with tf32_products("cuda:1"):
                inner_in.set()
                outer_done.wait(20)
                seen.append(tf32_flag.allow_tf32)

        with tf32_products("cuda:0"):
            worker = _in_thread(other_device)
            assert inner_in.wait(20)
        outer_done.set()
        worker.join(20)
        assert seen == [True] and tf32_flag.allow_tf32 is False
        precision = tf32_flag.fp32_precision
        try:
            tf32_flag.fp32_precision = "ieee"
            with tf32_products("cuda:0"):
                assert tf32_flag.fp32_precision == "tf32"
            assert tf32_flag.fp32_precision == "ieee"
        finally:
            tf32_flag.fp32_precision = precision
            tf32_flag.allow_tf32 = False  # back to the legacy API for the other tests


def test_a_pass_nested_in_one_of_its_thread_runs_with_the_outer_setting(tf32_flag):
    tf32_flag.allow_tf32 = False
    with use_device(None, tf32=True), tf32_products("cuda:0"):
        with use_device(None, tf32=False), tf32_products("cuda:0"):  # never waits for itself
            assert tf32_flag.allow_tf32 is True
    assert tf32_flag.allow_tf32 is False


# ---------------------------------------------------------------------- compiled kernels
@pytest.fixture
def fresh_compile(monkeypatch):
    from hubless.engine import torch_fused

    monkeypatch.setattr(torch_fused, "_STATE", {})
    return torch_fused


@pytest.mark.slow
def test_a_failing_compiler_warns_once_and_the_eager_pass_ranks(data, fresh_compile, monkeypatch):
    """A real compiler failure (inductor pointed at a C++ compiler that does not exist) is
    reported once; the ranks are the eager pass's, and later passes do not try again."""
    import torch._inductor.config as inductor

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    methods = ["nnn:k=5", "is:beta=20.0"]
    want = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, bootstrap=0, progress=False)
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))
    # torch's own patch, not monkeypatch: undoing a setattr on a config proxy deletes the key
    # (torch._inductor.config.cpp.cxx "does not exist" for every later compilation)
    with pytest.warns(fresh_compile.CompileFallbackWarning, match="torch.compile failed .InductorError: InvalidCxxCompiler") as caught:
        with inductor.patch({"cpp.cxx": ("/nonexistent/c++",)}), use_device("cpu", compiled=True):
            got = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, bootstrap=0, progress=False)
            again = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, bootstrap=0, progress=False)
    assert sum(isinstance(w.message, fresh_compile.CompileFallbackWarning) for w in caught) == 1
    for w, o, a in zip(want.results, got.results, again.results):
        assert o.metrics == w.metrics == a.metrics, w.method


@pytest.mark.parametrize("error", ["oom", "runtime"])
def test_an_error_at_run_time_propagates_and_leaves_compiling_on(error, data, fresh_compile, monkeypatch):
    """Out of memory (or any other error) while the compiled kernels run is the pass's own: it
    propagates as it is, no fallback warning, and the next pass runs compiled again (it used
    to switch compiling off for the whole process)."""
    import warnings

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    truth = np.arange(len(q))
    want = hubless.evaluate(g, q, truth, qb, ["nnn:k=5"], bootstrap=0, progress=False)
    failure = (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB") if error == "oom" else RuntimeError("device-side assert")
    )
    calls = []

    def kernels(fn, **kwargs):
        def run(*args):
            calls.append(len(calls))
            if len(calls) == 1:
                raise failure
            return fn(*args)  # the same arithmetic the compiled kernels run

        return run

    monkeypatch.setattr(fresh_compile.torch, "compile", kernels)
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))  # a gallery wide enough for the compiled top ids
    with warnings.catch_warnings():
        warnings.simplefilter("error", fresh_compile.CompileFallbackWarning)
        with use_device("cpu", compiled=True):
            with pytest.raises(type(failure), match=str(failure)):
                hubless.evaluate(g, q, truth, qb, ["nnn:k=5"], bootstrap=0, progress=False)
            assert "failed" not in fresh_compile._STATE
            got = hubless.evaluate(g, q, truth, qb, ["nnn:k=5"], bootstrap=0, progress=False)
    assert len(calls) > 1
    assert [r.metrics for r in got.results] == [r.metrics for r in want.results]


def test_compile_failures_are_told_from_errors_at_run_time():
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import CppCompileError

    from hubless.engine.torch_fused import compile_failure

    assert compile_failure(CppCompileError(["c++"], "no compiler"))
    assert compile_failure(BackendCompilerFailed(lambda *a: None, RuntimeError("Cannot find a working triton installation"), None))
    try:
        try:
            raise torch.OutOfMemoryError("out of memory while autotuning")
        except torch.OutOfMemoryError as oom:
            raise BackendCompilerFailed(lambda *a: None, oom, None) from oom
    except BackendCompilerFailed as wrapped:
        assert not compile_failure(wrapped)
    assert not compile_failure(torch.OutOfMemoryError("CUDA out of memory"))
    assert not compile_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
