"""A fitted correction read back from the file :meth:`Correction.save
<hubless.corrections.base.Correction.save>` wrote: :func:`load_correction`.

The file is an ``.npz`` (no pickles) holding a JSON head (format version, generator, the spec),
the gallery the correction was fitted with and the bank statistics it keeps; the correction is
rebuilt from its spec and fitted from those statistics, which is bitwise the fit that was saved
(a fit is a function of the gallery and the statistics alone). A file that is not one, is
damaged or names an unknown method is refused (:class:`~hubless.errors.Corrupt`,
:class:`~hubless.errors.InvalidInput`), before anything is built.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from hubless.corrections.base import SAVED_FORMAT_VERSION, SAVED_HEAD, STATISTICS_PREFIX, Correction
from hubless.corrections.spec import make_correction
from hubless.engine import BankStatistics
from hubless.errors import Corrupt, HublessError, MissingFile

__all__ = ["load_correction"]


def load_correction(path: str | os.PathLike) -> Correction:
    """The correction :meth:`Correction.save <hubless.corrections.base.Correction.save>` wrote
    to ``path``, fitted as it was: it searches and scores bitwise as the saved one did."""
    if not os.path.isfile(path):
        raise MissingFile(f"{path}: no such file (a correction saved with Correction.save)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        head = json.loads(str(arrays.pop(SAVED_HEAD)[()]))
        version = head.get("format_version")
        if version != SAVED_FORMAT_VERSION:
            raise Corrupt(f"{path} holds a saved correction of format {version!r}; this hubless reads {SAVED_FORMAT_VERSION}")
        gallery = np.asarray(arrays.pop("gallery"))
        statistics = BankStatistics.from_arrays({k.removeprefix(STATISTICS_PREFIX): v for k, v in arrays.items()})
    except HublessError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as exc:
        raise Corrupt(f"{path} is not a correction saved by hubless (Correction.save), or it is damaged: {exc}") from None
    corr = make_correction(head.get("spec", ""))
    if gallery.dtype != np.float32 or gallery.ndim != 2 or statistics.n_gallery != gallery.shape[0]:
        raise Corrupt(f"{path}: its gallery ({gallery.dtype}, {gallery.shape}) does not match its statistics")
    missing = statistics.missing(corr.statistics_request())
    if missing:
        raise Corrupt(f"{path}: its statistics lack " + "; ".join(missing))
    try:
        corr._fit_arrays(gallery, statistics)  # as saved: no renormalisation, no other pass
    except (ValueError, IndexError, TypeError) as exc:
        raise Corrupt(f"{path}: its statistics do not fit {corr.spec}: {exc}") from None
    return corr
