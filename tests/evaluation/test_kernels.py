"""The same numbers on every BLAS kernel and on torch's CPU device (issue 51).

numpy's OpenBLAS picks its kernel by CPU, and each kernel rounds the product of a row with a
block differently in the last bit depending on where the row falls in its blocking: the exact
copies of a gallery item used to tie on one CPU and not on another, and ``evaluate`` gave other
metrics there. Here ``evaluate`` runs on a gallery where 10% of the items have an exact copy (the
copies relevant to the same queries, banks with copies too), for the baseline and every method
under the three tie rules, in subprocesses forced onto OpenBLAS's Haswell, Zen and Sandybridge
kernels (``OPENBLAS_CORETYPE``) and the CPU's own, and on torch's CPU device: every number is the
same to the last digit. The subprocesses report which kernel they ran and a fingerprint of a raw
product, so the test knows the kernels really differed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hubless
from hubless.engine import use_device
from tests.conftest import unit_rows

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("Haswell", "Zen", "Sandybridge")
METHODS = ["nnn:k=5", "csls:k=4", "dn", "is:beta=20.0", "dis:k_activation=3", "dualis", "dualdis:k_activation=2", "gc"]
TIES = ("index", "average", "optimistic")


def benchmark():
    """A gallery of 360 items where 36 have an exact copy (placed anywhere), queries near the
    items with the item and its copy relevant, and banks where 10% of the rows repeat."""
    rng = np.random.default_rng(51)
    d = 48
    items = unit_rows(rng, 360, d)
    copied = rng.choice(360, 36, replace=False)
    order = rng.permutation(396)
    gallery = np.concatenate([items, items[copied]])[order]
    position = np.argsort(order)  # row of each (item, then copy) in the gallery
    item_of_query = rng.integers(0, 360, 240)
    queries = items[item_of_query] + 0.9 * unit_rows(rng, 240, d)
    copy_of = dict(zip(copied.tolist(), range(360, 396)))
    truth = [sorted({int(position[i]), int(position[copy_of.get(i, i)])}) for i in item_of_query.tolist()]

    def bank(n):
        rows = unit_rows(rng, n, d)
        return np.concatenate([rows, rows[rng.choice(n, n // 10, replace=False)]])[rng.permutation(n + n // 10)]

    return gallery, queries / np.linalg.norm(queries, axis=1, keepdims=True), truth, bank(300), bank(200)


def numbers() -> dict[str, dict]:
    """Every metric and hubness figure of every method under every tie rule: {"ties/method": {...}}."""
    gallery, queries, truth, query_bank, gallery_bank = benchmark()
    out = {}
    for ties in TIES:
        ev = hubless.evaluate(
            gallery, queries, truth, query_bank, METHODS, gallery_bank=gallery_bank, ties=ties, bootstrap=0, progress=False
        )
        for result in ev.results:
            out[f"{ties}/{result.method}"] = {**result.metrics, **{f"hubness {k}": v for k, v in result.hubness.items()}}
    return out


def report() -> None:
    """What a subprocess prints: its OpenBLAS kernel, a fingerprint of a raw product, the numbers."""
    import threadpoolctl

    gallery, queries, *_ = benchmark()
    cores = sorted({str(i.get("architecture")) for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"})
    raw = hashlib.sha256((queries @ gallery.T).tobytes()).hexdigest()
    print(json.dumps({"cores": cores, "raw": raw, "numbers": numbers()}))


def _run(kernel: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "HUBLESS_DEVICE": "numpy"}
    env.pop("OPENBLAS_CORETYPE", None)
    if kernel is not None:
        env["OPENBLAS_CORETYPE"] = kernel
    code = "from tests.evaluation.test_kernels import report; report()"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _mismatches(got: dict, want: dict) -> list[str]:
    """Every number of ``got`` that is not bitwise ``want``'s (a repr round trip is exact)."""
    assert got.keys() == want.keys()
    return [
        f"{key} {name}: {got[key][name]!r} != {value!r}"
        for key, values in want.items()
        for name, value in values.items()
        if got[key][name] != value
    ]


@pytest.mark.slow
def test_evaluate_gives_the_same_numbers_on_every_kernel_and_on_torch():
    runs = {kernel or "the CPU's own": _run(kernel) for kernel in (*KERNELS, None)}
    want = runs["Haswell"]["numbers"]
    for name, run in runs.items():
        assert not _mismatches(run["numbers"], want), (name, run["cores"], _mismatches(run["numbers"], want)[:10])
    # the kernels really differed: Haswell's and Sandybridge's rounded the raw products otherwise
    assert runs["Haswell"]["cores"] == ["Haswell"] and runs["Sandybridge"]["cores"] == ["Sandybridge"], {
        k: r["cores"] for k, r in runs.items()
    }
    assert runs["Haswell"]["raw"] != runs["Sandybridge"]["raw"]
    with use_device("cpu"):  # torch's CPU device: its own BLAS, its own ranking pass
        on_torch = numbers()
    assert not _mismatches(on_torch, want), _mismatches(on_torch, want)[:10]


def test_the_benchmark_has_copies_that_tie_and_relevant_copies():
    """What the test above runs on: 10% of the items copied (and in the banks), queries with a
    relevant copy, and, here, every copy with its first copy's numbers."""
    from hubless.engine.duplicates import find_duplicates

    gallery, queries, truth, query_bank, gallery_bank = benchmark()
    assert len(find_duplicates(gallery)) == 36 and len(find_duplicates(query_bank)) == 30 and len(find_duplicates(gallery_bank)) == 20
    assert sum(len(t) == 2 for t in truth) >= 15
    ev = hubless.evaluate(gallery, queries, truth, query_bank, ["dualis"], gallery_bank=gallery_bank, bootstrap=0, progress=False)
    assert 0 < ev.results[1].metrics["R@1"] <= 100
