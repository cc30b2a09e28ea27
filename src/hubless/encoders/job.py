"""Embed a large set of images or texts to one ``.npy``, in resumable chunks.

    embed_to_file(encoder, out="emb.npy", images=paths)        # or texts=[...]

Items are encoded ``chunk_size`` at a time; each finished chunk is written atomically to
``emb.npy.parts/`` together with its record (which items it holds, its chunk and job, the
sha256 of its embeddings), so an interrupted job started again with the same inputs and model
skips the finished chunks, and redoes, saying so, a chunk that is damaged or not its own. Unreadable or corrupt images are
skipped and listed (never crash the job); when none can be read, nothing is written and
:class:`NothingEmbeddedError` lists them. At the end ``emb.npy`` holds one row per embedded
item and ``emb.meta.json`` the matching metadata, row for row: the item's index in the input,
its path or text, the model, the dimension, and the skipped items with their errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hubless._atomic import file_sha256, save_npy, write_json
from hubless._validation import exactly_one
from hubless.encoders.base import Encoder, open_image
from hubless.errors import AlreadyExists, Corrupt, Incomplete, InvalidInput, MissingFile
from hubless.progress import progress_bar

__all__ = [
    "EmbedResult",
    "NothingEmbeddedError",
    "chunk_is_done",
    "embed_chunk",
    "embed_to_file",
    "list_images",
    "write_chunk",
    "meta_path",
    "IMAGE_SUFFIXES",
]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


class NothingEmbeddedError(InvalidInput):
    """No item of a job could be read; nothing was written. ``skipped`` lists each item and its error."""

    def __init__(self, skipped: list[dict]) -> None:
        self.skipped = skipped
        shown = "; ".join(f"{s['path']}: {s['error']}" for s in skipped[:5])
        more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
        super().__init__(f"none of the {len(skipped)} images could be read, nothing was written: {shown}{more}")


@dataclass
class EmbedResult:
    out: Path
    meta: Path
    n_embedded: int
    skipped: list[dict]
    reused_chunks: int


def meta_path(out: str | os.PathLike) -> Path:
    """``emb.npy`` -> ``emb.meta.json``."""
    out = Path(out)
    return out.with_name(out.stem + ".meta.json")


def list_images(source: str | os.PathLike) -> list[str]:
    """Every file under a folder (sorted, recursive; non-images are kept so they are reported as
    skipped), or the paths listed one per line in a text file."""
    source = Path(source)
    if source.is_dir():
        return sorted(str(p) for p in source.rglob("*") if p.is_file())
    if source.is_file():
        base = source.parent
        lines = [line.strip() for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [line if os.path.isabs(line) else str(base / line) for line in lines]
    raise MissingFile(f"no such folder or list file: {source}")


def _job_key(encoder: Encoder, modality: str, items: list[str], chunk_size: int) -> str:
    h = hashlib.sha256()
    h.update(f"{encoder.name}\0{encoder.dim}\0{modality}\0{chunk_size}\0".encode())
    for item in items:
        h.update(item.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def embed_to_file(
    encoder: Encoder,
    out: str | os.PathLike,
    *,
    images: list[str] | None = None,
    texts: list[str] | None = None,
    chunk_size: int = 4096,
    batch_size: int = 32,
    progress: bool | None = None,
    overwrite: bool = False,
    run_chunks=None,
) -> EmbedResult:
    """Encode ``images`` (paths) or ``texts`` with ``encoder`` into ``out`` (.npy) + metadata.

    ``run_chunks(parts, chunks, items, modality, chunk_size, batch_size)``: computes the missing
    ``chunks`` elsewhere (each with :func:`embed_chunk`, e.g. on Ray workers:
    :func:`hubless.distributed.embed`); by default they are computed here, one after another.
    """
    exactly_one({"images=": images, "texts=": texts})
    modality = "image" if images is not None else "text"
    chosen = images if images is not None else texts
    assert chosen is not None  # exactly one was given
    items = [str(x) for x in chosen]
    if not items:
        raise InvalidInput(f"no {modality}s to embed")
    if chunk_size < 1:
        raise InvalidInput(f"chunk_size must be >= 1; got {chunk_size}")
    out = Path(out)
    if out.suffix != ".npy":
        raise InvalidInput(f"--out must be a .npy file; got {out}")
    if out.exists() and not overwrite:
        raise AlreadyExists(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    parts = out.with_name(out.name + ".parts")
    key = _job_key(encoder, modality, items, chunk_size)
    job_file = parts / "job.json"
    if parts.exists():
        try:
            same = json.loads(job_file.read_text()).get("key") == key
        except (OSError, ValueError):
            same = False
        if not same:  # leftovers of a different job: start over
            shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    write_json(job_file, {"key": key, "model": encoder.name, "modality": modality, "n_items": len(items)})

    starts = range(0, len(items), chunk_size)
    missing = [chunk for chunk in range(len(starts)) if not chunk_is_done(parts, chunk)]
    reused = len(starts) - len(missing)
    if run_chunks is None:
        for chunk in progress_bar(missing, progress, desc=f"embed {modality}s", unit="chunk"):
            embed_chunk(encoder, parts, chunk, items, modality, chunk_size, batch_size)
    else:
        run_chunks(parts, missing, items, modality, chunk_size, batch_size)
        undone = [chunk for chunk in missing if not chunk_is_done(parts, chunk)]
        if undone:
            raise Incomplete(f"{len(undone)} chunk(s) were not written (first: {undone[0]}); run the job again to finish them")

    embeddings, index, skipped = [], [], []
    for chunk in range(len(starts)):
        ids = json.loads((parts / f"chunk-{chunk:06d}.json").read_text())
        embeddings.append(np.load(parts / f"chunk-{chunk:06d}.npy"))
        index.extend(ids["ok"])
        skipped.extend(ids["skipped"])
    matrix = np.concatenate(embeddings) if embeddings else np.empty((0, encoder.dim), np.float32)
    if matrix.shape[0] == 0:  # every image unreadable: an empty (0, d) file would only fail later
        shutil.rmtree(parts)
        raise NothingEmbeddedError(skipped)
    if matrix.shape[0] != len(index):  # pragma: no cover - guarded by the chunk files
        raise Corrupt("embeddings and metadata are out of step; delete the .parts folder and rerun")
    field = "path" if modality == "image" else "text"
    meta = {
        "model": encoder.name,
        "modality": modality,
        "dim": int(encoder.dim),
        "count": int(matrix.shape[0]),
        "embeddings": out.name,
        "items": [{"index": i, field: items[i]} for i in index],
        "skipped": skipped,
    }
    save_npy(out, matrix)
    # The pair is one unit: the metadata names the embeddings' checksum, so a crash between the
    # two writes (new embeddings, old metadata) is detected wherever they are read together.
    meta["embeddings_sha256"] = file_sha256(out)
    write_json(meta_path(out), meta)
    shutil.rmtree(parts)
    return EmbedResult(out, meta_path(out), int(matrix.shape[0]), skipped, reused)


def chunk_is_done(parts: Path, chunk: int) -> bool:
    """Whether chunk ``chunk`` of a job is on disk, intact and this job's: its record (the
    ``.json``) names the chunk and the job and holds the sha256 of its embeddings, and the rows
    match its item list. A chunk that fails is redone, with one warning line saying why
    (:class:`hubless.storage.workfiles.RecomputedWarning`); a missing one silently."""
    from hubless.storage.workfiles import describe, file_problem, recomputing

    emb_file, ids_file = parts / f"chunk-{chunk:06d}.npy", parts / f"chunk-{chunk:06d}.json"
    if not (emb_file.exists() or ids_file.exists()):
        return False
    try:
        record = json.loads(ids_file.read_text())
        ok, key, digest = record["ok"], record["key"], record["sha256"]
        job = json.loads((parts / "job.json").read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        recomputing(emb_file, "has no readable record of what it holds")
        return False
    want = {"chunk": chunk, "job": job}
    why = f"is recorded as {describe(key)}, not {describe(want)}" if key != want else file_problem(emb_file, digest)
    if why is None:
        try:
            rows = np.load(emb_file, mmap_mode="r").shape[0]
        except (OSError, ValueError) as exc:  # pragma: no cover - the checksum matched: the file is as written
            why = f"cannot be read ({exc})"
        else:
            why = None if rows == len(ok) else f"holds {rows} rows for {len(ok)} items"
    if why:
        recomputing(emb_file, why)
    return why is None


def write_chunk(parts: Path, chunk: int, embeddings: np.ndarray, ok: list[int], skipped: list[dict]) -> None:
    """Write chunk ``chunk``'s embeddings, then its record (which items they are, the chunk and
    the job it belongs to, their sha256), each atomically: a chunk counts as done once both are."""
    emb_file = parts / f"chunk-{chunk:06d}.npy"
    save_npy(emb_file, np.asarray(embeddings, dtype=np.float32))
    job = json.loads((parts / "job.json").read_text())["key"]
    record = {"ok": ok, "skipped": skipped, "key": {"chunk": chunk, "job": job}, "sha256": file_sha256(emb_file)}
    write_json(parts / f"chunk-{chunk:06d}.json", record)


def embed_chunk(encoder: Encoder, parts: Path, chunk: int, items: list[str], modality: str, chunk_size: int, batch_size: int) -> None:
    """Encode chunk ``chunk`` (items ``chunk * chunk_size`` onwards) and write its two files
    atomically: the embeddings and which items they are (unreadable images listed, not fatal)."""
    start = chunk * chunk_size
    batch = items[start : start + chunk_size]
    skipped: list[dict] = []
    if modality == "text":
        emb, ok = encoder.encode_texts(batch, batch_size=batch_size, progress=False), list(range(len(batch)))
    else:
        loaded, ok = [], []
        for i, path in enumerate(batch):
            try:
                loaded.append(open_image(path))
                ok.append(i)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is reported, not fatal
                skipped.append({"index": start + i, "path": path, "error": f"{type(exc).__name__}: {exc}"})
        emb = encoder.encode_images(loaded, batch_size=batch_size, progress=False) if loaded else np.empty((0, encoder.dim), np.float32)
    write_chunk(parts, chunk, emb, [start + i for i in ok], skipped)
