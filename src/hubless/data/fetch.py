"""Download the Karpathy caption splits of COCO / Flickr30k from their official source.

Karpathy's ``caption_datasets.zip`` (cs.stanford.edu) holds ``dataset_coco.json`` and
``dataset_flickr30k.json``: every image with its split and its (5 or more) sentences. ``fetch``
writes the caption files :mod:`hubless.data.karpathy` reads, 5 captions per image in the file's
image order: ``coco_karpathy/test5k_captions.txt`` and ``dev1k_captions.txt`` (COCO's 5,000
"val" images are the Karpathy dev split; the first 1,000 are kept, as in the shared data),
``flickr30k_karpathy/test1k_captions.txt`` and ``dev1k_captions.txt``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from hubless._atomic import write_text
from hubless.errors import InvalidInput

__all__ = ["KARPATHY_SPLIT_SIZES", "KARPATHY_URL", "download", "fetch"]

KARPATHY_URL = "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip"
_LAYOUT: dict[str, tuple[str, str, dict[str, tuple[str, int | None]]]] = {
    "coco": ("dataset_coco.json", "coco_karpathy", {"test": ("test5k_captions.txt", 5000), "val": ("dev1k_captions.txt", 1000)}),
    "flickr30k": (
        "dataset_flickr30k.json",
        "flickr30k_karpathy",
        {"test": ("test1k_captions.txt", 1000), "val": ("dev1k_captions.txt", None)},
    ),
}


def download(url: str, timeout: float, hint: str) -> bytes:
    """The bytes at ``url``; a ConnectionError saying "no network?" and ``hint`` (what to do
    instead) when it cannot be fetched."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"could not download {url} ({reason}): no network? {hint}") from None


#: Images per split in Karpathy's release (dataset -> split -> count): a fetched archive must match.
KARPATHY_SPLIT_SIZES = {"coco": {"test": 5000, "val": 5000}, "flickr30k": {"test": 1000, "val": 1014}}


def fetch(
    dataset: str,
    dest: str | os.PathLike,
    *,
    archive: str | os.PathLike | None = None,
    timeout: float = 60.0,
    verify: bool = True,
    sha256: str | None = None,
) -> list[Path]:
    """Write the caption files of ``dataset`` ('coco' or 'flickr30k') under ``dest``.

    ``archive``: a local copy of caption_datasets.zip (skips the download). Returns the files.
    With ``verify`` (default) the archive must hold Karpathy's split sizes
    (:data:`KARPATHY_SPLIT_SIZES`), and, when ``sha256`` is given, have that digest; nothing is
    written otherwise. (The release publishes no checksum, and none can be computed on a machine
    without network, so hubless cannot pin one: pass the digest you trust with ``sha256``.)
    """
    if dataset not in _LAYOUT:
        raise InvalidInput(f"unknown dataset {dataset!r}; choose coco or flickr30k")
    member, folder, splits = _LAYOUT[dataset]
    hint = "Download it by hand and pass --archive, or point HUBLESS_DATA_DIR at a folder that has the caption files"
    data = Path(archive).read_bytes() if archive else download(KARPATHY_URL, timeout, hint)
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256.strip().lower():
        raise InvalidInput(f"the archive's sha256 is {digest}, not the expected {sha256}; nothing was written")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            name = next((n for n in zf.namelist() if n.endswith(member)), None)
            if name is None:
                raise InvalidInput(f"the archive has no {member}")
            try:
                images = json.loads(zf.read(name))["images"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                raise InvalidInput(f"{name} in the archive is not a Karpathy split file (no 'images' list)") from None
            if not isinstance(images, list) or not all(isinstance(img, dict) for img in images):
                raise InvalidInput(f"{name} in the archive is not a Karpathy split file ('images' is not a list of records)")
    except zipfile.BadZipFile:
        raise InvalidInput("the downloaded archive is not a valid zip file (truncated download?)") from None
    chosen_by_split = {}
    for split, (_, limit) in splits.items():
        chosen = [img for img in images if img.get("split") == split]
        if not chosen:
            raise InvalidInput(f"the archive's {member} has no image of split {split!r}; nothing was written")
        expected = KARPATHY_SPLIT_SIZES[dataset][split]
        if verify and len(chosen) != expected:
            raise InvalidInput(
                f"the archive's {member} has {len(chosen)} {split} images, Karpathy's release has {expected}: not the release "
                "(truncated or altered?); nothing was written (--no-verify uses it anyway)"
            )
        chosen_by_split[split] = chosen if limit is None else chosen[:limit]
    contents = {}  # every file's text, built (and checked) before anything is written
    for split, (filename, _) in splits.items():
        chosen = chosen_by_split[split]
        lines = []
        for img in chosen:
            try:
                sentences = [s["raw"].strip().replace("\n", " ") for s in img["sentences"]][:5]
                image_name = str(img["filename"])
            except (KeyError, TypeError, AttributeError):
                raise InvalidInput(f"image {img.get('filename')} in the archive has malformed records") from None
            if len(sentences) < 5:
                raise InvalidInput(f"image {image_name} has fewer than 5 captions")
            lines.extend(sentences)
        contents[Path(dest) / folder / filename] = "\n".join(lines) + "\n"
        contents[Path(dest) / folder / filename.replace("_captions.txt", "_images.txt")] = (
            "\n".join(str(img["filename"]) for img in chosen) + "\n"
        )
    written = [write_text(file, text) for file, text in contents.items()]
    return written
