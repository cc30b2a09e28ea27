"""The description of an index besides its arrays: :class:`IndexConfig`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from hubless._validation import check_positive_int
from hubless.errors import InvalidInput, InvalidType

__all__ = ["IndexConfig"]


@dataclass
class IndexConfig:
    """Everything that describes an index besides its arrays: how it was built and how it is
    searched by default. Saved as one block of the manifest and shown by :meth:`Index.info`."""

    factory: str
    model: str | None = None
    nprobe: int = 16
    ef_search: int = 64
    rescore: bool = True
    rescore_factor: int = 4
    build_seconds: float = 0.0
    bias_error: dict[str, float] | None = None
    #: IVF: share of items (lowest bias) also stored in their second list, and the summed bias at
    #: or below which an item is (see hubless.index.faiss_build); None/0 for other indexes.
    spill: float = 0.0
    spill_below: float | None = None
    #: The column the bias starts at in the FAISS rows (None: right after the unit part, as
    #: indexes built before PQ codes got a bias sub-vector of their own).
    bias_offset: int | None = None
    #: What `hubless index build --target-recall` chose and measured (hubless.index.tuner).
    tuning: dict[str, Any] | None = None
    #: Versions of a saved index kept after they are replaced (the current one included; 0:
    #: only the current one and, for a moment, the previous one): see hubless.index.disk.
    keep_versions: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.factory, str) or not self.factory.strip():
            raise InvalidInput(f"factory must be a FAISS factory string such as 'Flat' or 'IVF1024,Flat'; got {self.factory!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise InvalidType(f"model must be a name (str) or None; got {self.model!r}")
        self.nprobe = check_positive_int(self.nprobe, "nprobe")
        self.ef_search = check_positive_int(self.ef_search, "ef_search")
        self.rescore_factor = check_positive_int(self.rescore_factor, "rescore_factor")
        if not isinstance(self.rescore, (bool, np.bool_)):
            raise InvalidType(f"rescore must be True or False; got {self.rescore!r}")
        self.rescore = bool(self.rescore)
        if isinstance(self.build_seconds, bool) or not isinstance(self.build_seconds, (int, float)) or not self.build_seconds >= 0:
            raise InvalidInput(f"build_seconds must be a number of seconds >= 0; got {self.build_seconds!r}")
        self.build_seconds = float(self.build_seconds)
        if self.bias_error is not None and (
            not isinstance(self.bias_error, dict)
            or not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in self.bias_error.items())
        ):
            raise InvalidInput(f"bias_error must be None or a mapping of names to numbers; got {self.bias_error!r}")
        if isinstance(self.spill, bool) or not isinstance(self.spill, (int, float)) or not 0.0 <= self.spill < 1.0:
            raise InvalidInput(f"spill must be a share in [0, 1); got {self.spill!r}")
        self.spill = float(self.spill)
        if self.spill_below is not None and (isinstance(self.spill_below, bool) or not isinstance(self.spill_below, (int, float))):
            raise InvalidInput(f"spill_below must be None or a number; got {self.spill_below!r}")
        if self.bias_offset is not None:
            self.bias_offset = check_positive_int(self.bias_offset, "bias_offset")
        if self.tuning is not None and not isinstance(self.tuning, dict):
            raise InvalidInput(f"tuning must be None or a mapping; got {self.tuning!r}")
        if (
            isinstance(self.keep_versions, bool)
            or not isinstance(self.keep_versions, (int, np.integer))
            or not 0 <= self.keep_versions <= 10_000
        ):
            raise InvalidInput(f"keep_versions must be a number of versions from 0 to 10000; got {self.keep_versions!r}")
        self.keep_versions = int(self.keep_versions)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["keep_versions"]:  # the manifests of indexes that keep no versions stay as they were
            del out["keep_versions"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexConfig:
        """Inverse of :meth:`to_dict`; unknown keys are refused (validated like the constructor)."""
        if not isinstance(data, dict):
            raise InvalidInput(f"an index config must be a JSON object; got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"unknown index config field(s): {', '.join(unknown)}")
        return cls(**data)
