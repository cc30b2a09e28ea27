"""Check a FAISS factory string before building anything: one clear line instead of an abort.

FAISS's ``index_factory`` accepts strings that then abort the whole process (``HNSW0``), raise raw
RuntimeErrors (``IDMap,Flat`` here, PQ codes wider than the vectors) or train for minutes on too
few items (``IVF4,PQ64`` on 300). hubless serves the forms below, whose structure it knows how
to keep free of the bias (see :mod:`hubless.index.faiss_build`), and checks their sizes:

    Flat                       exact
    IVF<nlist>,Flat            inverted lists, exact within a list
    IVF<nlist>,PQ<m>[x<bits>]  inverted lists with product-quantised codes
    IVF<nlist>,SQ<4|6|8|fp16>  inverted lists with scalar-quantised codes
    PQ<m>[x<bits>]             product quantisation alone
    HNSW<M>[,Flat]             graph (2 <= M <= 256)

Sizes: nlist <= items; PQ needs m <= the vector dimension, bits in 1..16 and at least FAISS's
39 training items per code centroid (39 x 2^bits), below which it trains for minutes to codes of
no use.
"""

from __future__ import annotations

import re

from hubless.errors import InvalidInput

__all__ = ["check_factory", "is_flat"]

_FORMS = re.compile(
    r"(?P<flat>Flat)"
    r"|IVF(?P<nlist>\d+),(?:Flat|PQ(?P<ivf_m>\d+)(?:x(?P<ivf_bits>\d+))?|SQ(?:4|6|8|fp16))"
    r"|PQ(?P<m>\d+)(?:x(?P<bits>\d+))?"
    r"|HNSW(?P<M>\d+)(?:,Flat)?"
)
#: FAISS's own guidance: fewer training points per centroid give useless centroids.
POINTS_PER_CENTROID = 39


def check_factory(factory: str, n_items: int, dim: int) -> str:
    """``factory`` stripped, if hubless can build it for ``n_items`` vectors of ``dim``
    dimensions (the augmented dimension); a ValueError saying what to use instead otherwise."""
    if not isinstance(factory, str) or not factory.strip():
        raise InvalidInput(f"factory must be a FAISS factory string such as 'Flat', 'IVF1024,Flat' or 'HNSW32'; got {factory!r}")
    text = "".join(factory.split())
    if text.startswith("IDMap"):
        raise InvalidInput(f"{factory!r}: hubless ids are gallery positions and need no IDMap; drop the 'IDMap,' prefix")
    match = _FORMS.fullmatch(text)
    if match is None:
        raise InvalidInput(
            f"unsupported FAISS factory {factory!r}: use Flat, IVF<nlist>,Flat, IVF<nlist>,PQ<m>[x<bits>], "
            "IVF<nlist>,SQ8, PQ<m>[x<bits>] or HNSW<M> (see hubless.index.factory)"
        )
    g = match.groupdict()
    if g["M"] is not None and not 2 <= int(g["M"]) <= 256:
        raise InvalidInput(f"{factory!r}: HNSW needs 2 <= M <= 256 links per node (M = {g['M']}); HNSW32 is a good default")
    if g["nlist"] is not None:
        nlist = int(g["nlist"])
        if not 1 <= nlist <= n_items:
            raise InvalidInput(
                f"{factory!r}: {nlist} lists need at least 1 and at most as many items as the gallery has ({n_items}); use fewer lists or Flat"
            )
    m, bits = (g["ivf_m"], g["ivf_bits"]) if g["ivf_m"] is not None else (g["m"], g["bits"])
    if m is not None:
        m, bits = int(m), int(bits or 8)
        if not 1 <= m <= dim:
            raise InvalidInput(
                f"{factory!r}: PQ{m} splits vectors into {m} parts but they have {dim} dimensions; use PQ{max(1, dim // 8)} or fewer"
            )
        if not 1 <= bits <= 16:
            raise InvalidInput(f"{factory!r}: PQ codes take 1 to 16 bits per part (got {bits})")
        need = POINTS_PER_CENTROID * 2**bits
        if n_items < need:
            raise InvalidInput(
                f"{factory!r}: {bits}-bit PQ codes ({2**bits} centroids per part) need at least {need:,} items to train "
                f"({POINTS_PER_CENTROID} per centroid); the gallery has {n_items:,}: use Flat or IVF<nlist>,Flat, or fewer bits (PQ{m}x4)"
            )
    return text


def is_flat(factory: str) -> bool:
    """Whether a factory string is the exact flat index (searched exactly, no FAISS structure)."""
    return "".join(factory.split()).lower() == "flat"
