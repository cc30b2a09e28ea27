"""Reading score matrices: memory-mapped .npy, .npz entries, and the QB-Norm authors' .pkl files.

* ``.npy``: memory-mapped, never loaded whole (passes read it in row blocks).
* ``.npz`` (``file.npz`` holding one array, or ``file.npz:KEY``): an entry stored uncompressed
  (``np.savez``) is memory-mapped in place; a compressed one (``np.savez_compressed``) is read
  into memory.
* ``.pkl`` / ``.pickle``: the authors publish their similarity matrices as pickled numpy arrays.
  Unpickling can run any code a file names, so :func:`read_pickled_array` admits only what a
  pickled numpy array is made of (``numpy.ndarray``, ``numpy.dtype`` and numpy's own array
  reconstructors) and refuses any other name *before* anything is called: a hostile pickle
  fails with :class:`~hubless.errors.InvalidInput` having executed nothing. A pickle is read into
  memory; for large matrices convert it once to .npy (docs/score-matrices.md shows the one line).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import tokenize
import zipfile
from pathlib import Path

import numpy as np

from hubless.engine.score_statistics import check_score_matrix
from hubless.errors import InvalidInput, MissingFile, NotFound

__all__ = ["PICKLE_SUFFIXES", "load_mask", "load_scores", "read_pickled_array"]

#: File suffixes read as pickles.
PICKLE_SUFFIXES = (".pkl", ".pickle")


def _numpy_core():
    return getattr(np, "_core", None) or np.core  # numpy >= 2 keeps it in numpy._core


def _allowed() -> dict[tuple[str, str], object]:
    """The only names a pickled numpy array needs (numpy 1 and 2 spell its module both ways)."""
    core = _numpy_core()
    import _codecs

    names = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _codecs.encode}
    for module in ("numpy.core", "numpy._core"):
        names[(f"{module}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        names[(f"{module}.numeric", "_frombuffer")] = core.numeric._frombuffer
    return names


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the names of :func:`_allowed` (nothing else is imported,
    let alone called) and no persistent ids."""

    def __init__(self, file, source: str) -> None:
        super().__init__(file)
        self.source = source
        self.names = _allowed()

    def find_class(self, module: str, name: str):
        try:
            return self.names[(module, name)]
        except KeyError:
            raise InvalidInput(
                f"{self.source}: this pickle would load {module}.{name}; only numpy arrays are read from pickles "
                "(nothing in it was executed). Save the matrix with numpy.save and pass the .npy"
            ) from None

    def persistent_load(self, pid):
        raise InvalidInput(f"{self.source}: this pickle refers to external objects; only numpy arrays are read from pickles")


def read_pickled_array(path: str | os.PathLike) -> np.ndarray:
    """The numpy array pickled in ``path``, read without running anything else (see the module
    docstring). Refuses a pickle of anything but one numeric numpy array."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"no such file: {path}")
    data = path.read_bytes()
    try:
        value = _ArrayUnpickler(io.BytesIO(data), str(path)).load()
    except InvalidInput:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, struct.error) as exc:
        raise InvalidInput(f"cannot read {path}: not a pickled numpy array, or a damaged one ({type(exc).__name__}: {exc})") from None
    if type(value) is not np.ndarray:
        raise InvalidInput(f"{path} holds a pickled {type(value).__name__}, not a numpy array")
    if value.dtype.hasobject:
        raise InvalidInput(f"{path} holds an array of Python objects; only numeric arrays are read")
    return value


def _npz_entry(file: Path, key: str | None) -> np.ndarray:
    """An .npz entry: memory-mapped when stored uncompressed, else read."""
    try:
        with zipfile.ZipFile(file) as archive:
            names = [n.removesuffix(".npy") for n in archive.namelist()]
            if key is None:
                if len(names) != 1:
                    raise InvalidInput(f"{file} holds {len(names)} arrays ({', '.join(names) or 'none'}); name one as {file}:KEY")
                key = names[0]
            if key not in names:
                raise NotFound(f"{file} has no array {key!r}; it holds: {', '.join(names)}")
            info = archive.getinfo(f"{key}.npy")
            readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if info.compress_type == zipfile.ZIP_STORED and version in readers:
                    shape, fortran, dtype = readers[version](member)
                    header = member.tell()
                else:
                    header = None
            if header is not None:
                with open(file, "rb") as fh:  # the local file header: 30 bytes + name + extra field
                    fh.seek(info.header_offset)
                    local = fh.read(30)
                    name_len, extra_len = struct.unpack("<HH", local[26:30])
                offset = info.header_offset + 30 + name_len + extra_len + header
                if dtype.hasobject:
                    raise InvalidInput(f"{file}:{key} holds Python objects; only numeric arrays are read (no pickles)")
                return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    except (zipfile.BadZipFile, OSError, ValueError, struct.error, SyntaxError, tokenize.TokenError) as exc:  # a damaged header too
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"cannot read {file}: the archive is truncated or corrupt ({exc})") from None
    from hubless.inputs import load_array

    return load_array(file, key, mmap=False)


def load_scores(path: str | os.PathLike, name: str = "scores", *, n_cols: int | None = None, cols_of: str = "the gallery"):
    """A score matrix from a file (see the module docstring), checked to be 2-D real scores
    with ``n_cols`` columns when given; memory-mapped where the format allows."""
    from hubless.inputs import load_array
    from hubless.storage.arrays import split_key

    file, key = split_key(path)
    suffix = file.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        if key is not None:
            raise InvalidInput(f"{file} is a pickle; a key ({key!r}) only applies to .npz archives")
        array = read_pickled_array(file)
    elif suffix == ".npz":
        if not file.is_file():
            raise MissingFile(f"no such file: {file}")
        array = _npz_entry(file, key)
    elif suffix == ".npy":
        array = load_array(file, key)
    else:
        raise InvalidInput(f"{name} ({file}): unsupported file type {suffix!r}; give a .npy, .npz or .pkl score matrix")
    return check_score_matrix(array, f"{name} ({os.fspath(path)})", n_cols=n_cols, cols_of=cols_of)


def load_mask(path: str | os.PathLike, n: int, name: str = "query mask") -> np.ndarray:
    """A boolean mask of ``n`` entries (any shape of that size: the authors' masks are
    (n_items, captions_per_item)) from .npy/.npz/.pkl; nonzero means present."""
    from hubless.inputs import load_array
    from hubless.storage.arrays import split_key

    file, key = split_key(path)
    array = read_pickled_array(file) if file.suffix.lower() in PICKLE_SUFFIXES else load_array(path, mmap=False)
    array = np.asarray(array)
    if array.dtype.kind not in "biuf" or array.size != n:
        raise InvalidInput(f"{name} ({path}) must hold {n} booleans (one per score row); got {array.dtype} of shape {array.shape}")
    mask = array.reshape(-1) != 0
    if not mask.any():
        raise InvalidInput(f"{name} ({path}) masks every row")
    return mask
