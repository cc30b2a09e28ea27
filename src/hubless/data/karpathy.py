"""COCO and Flickr30k captions of the Karpathy splits, read from a data directory.

The directory is ``$HUBLESS_DATA_DIR`` or, when unset, ``../shared/data`` beside the project
(the layout of ``shared/data/README.md``): ``coco_karpathy/test5k_captions.txt``,
``coco_karpathy/dev1k_captions.txt``, ``flickr30k_karpathy/test1k_captions.txt``,
``flickr30k_karpathy/dev1k_captions.txt``; 5 captions per image, lines 5i..5i+4 describe image i.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hubless.errors import InvalidInput, MissingFile
from hubless.metrics.truth import Truth, captions_per_item

__all__ = ["CaptionSplit", "data_dir", "load_captions", "SPLITS"]

#: (dataset, split) -> (file under the data directory, number of images, captions per image)
SPLITS: dict[tuple[str, str], tuple[str, int | None]] = {
    ("coco", "test5k"): ("coco_karpathy/test5k_captions.txt", 5000),
    ("coco", "test1k"): ("coco_karpathy/test5k_captions.txt", 1000),
    ("coco", "dev"): ("coco_karpathy/dev1k_captions.txt", None),
    ("flickr30k", "test1k"): ("flickr30k_karpathy/test1k_captions.txt", 1000),
    ("flickr30k", "dev"): ("flickr30k_karpathy/dev1k_captions.txt", None),
}
CAPTIONS_PER_IMAGE = 5


@dataclass(frozen=True)
class CaptionSplit:
    """Captions of one split: ``captions[j]`` describes image ``caption_image[j]`` (= j // 5)."""

    dataset: str
    split: str
    captions: list[str]

    @property
    def n_images(self) -> int:
        return len(self.captions) // CAPTIONS_PER_IMAGE

    @property
    def caption_image(self) -> np.ndarray:
        return np.arange(len(self.captions)) // CAPTIONS_PER_IMAGE

    def truth(self) -> tuple[Truth, Truth]:
        """(text->image, image->text) ground truth of the split."""
        return captions_per_item(self.n_images, CAPTIONS_PER_IMAGE)

    def image_paths(self, image_root: str | os.PathLike, root: str | os.PathLike | None = None) -> list[Path]:
        """Paths of the split's images under ``image_root``, in caption order, checked to exist.

        File names come from ``<split file stem minus _captions>_images.txt`` beside the caption
        file (written by ``hubless data fetch``) or, for COCO test splits, from the COCO ids of
        the ``eccv-caption`` package (``COCO_val2014_%012d.jpg``).
        """
        rel, _ = SPLITS[(self.dataset, self.split)]
        names_file = (Path(root) if root is not None else data_dir()) / rel.replace("_captions.txt", "_images.txt")
        if names_file.is_file():
            names = names_file.read_text(encoding="utf-8").split()[: self.n_images]
        elif self.dataset == "coco" and self.split.startswith("test"):
            from hubless.evaluation.eccv import coco5k_ids

            names = [f"COCO_val2014_{i:012d}.jpg" for i in coco5k_ids()[1][: self.n_images]]
        else:
            raise MissingFile(f"no image list {names_file}; run `hubless data fetch {self.dataset}` to write it")
        paths = [Path(image_root) / n for n in names]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise MissingFile(f"{len(missing)} of {len(paths)} images are missing under {image_root}, e.g. {missing[0]}")
        return paths


def data_dir() -> Path:
    """``$HUBLESS_DATA_DIR``, else ``../shared/data`` next to the project checkout when present."""
    env = os.environ.get("HUBLESS_DATA_DIR")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        candidate = parent.parent / "shared" / "data"
        if (parent / "pyproject.toml").exists() and candidate.is_dir():
            return candidate
    return Path.cwd() / "data"


def load_captions(dataset: str, split: str, root: str | os.PathLike | None = None) -> CaptionSplit:
    """Captions of ``dataset`` ('coco' or 'flickr30k') and ``split`` ('test5k', 'test1k', 'dev')."""
    key = (dataset.lower(), split.lower())
    if key not in SPLITS:
        raise InvalidInput(f"unknown split {dataset}/{split}; choose from {', '.join('/'.join(k) for k in SPLITS)}")
    rel, n_images = SPLITS[key]
    path = Path(root) if root is not None else data_dir()
    file = path / rel
    if not file.is_file():
        raise MissingFile(f"{file} not found: set HUBLESS_DATA_DIR to the folder holding {rel.split('/')[0]}/")
    lines = file.read_text(encoding="utf-8").splitlines()
    if n_images is not None:
        lines = lines[: n_images * CAPTIONS_PER_IMAGE]
    if len(lines) % CAPTIONS_PER_IMAGE:
        raise InvalidInput(f"{file} holds {len(lines)} captions, not a multiple of {CAPTIONS_PER_IMAGE}")
    if n_images is not None and len(lines) != n_images * CAPTIONS_PER_IMAGE:
        raise InvalidInput(f"{file} is truncated: {len(lines)} captions, expected {n_images * CAPTIONS_PER_IMAGE}")
    return CaptionSplit(key[0], key[1], lines)
