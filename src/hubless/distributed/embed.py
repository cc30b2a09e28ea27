"""Embed images or texts on Ray: the single-machine job's chunks, computed by Ray Data workers.

    hubless embed --model openai/clip-vit-base-patch32 --images photos/ --out emb.npy --ray
    hubless.distributed.embed("openai/clip-vit-base-patch32", "emb.npy", images=paths, workers=8)

The job is :func:`hubless.encoders.job.embed_to_file`'s: the same chunk files in
``emb.npy.parts/`` (so a rerun after a crash computes only the missing chunks, with or without
Ray), the same output and metadata. Ray Data maps the missing chunk numbers over ``workers``
actors (``map_batches`` with a callable class), each loading the model once and writing the
chunks it encodes; an actor gets a GPU when the cluster has them. On a cluster, ``out`` and the
images must be on a file system every node reads.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hubless.distributed.cluster import check_address, connect

__all__ = ["embed"]


class ChunkEmbedder:
    """A Ray Data worker: loads the model once, then encodes and writes the chunks it is given."""

    def __init__(
        self,
        model: str,
        kind: str | None,
        device: str | None,
        parts: str,
        items: list[str],
        modality: str,
        chunk_size: int,
        batch_size: int,
    ) -> None:
        from pathlib import Path

        from hubless.encoders import load_encoder

        self.encoder = load_encoder(model, kind=kind, device=device)
        self.parts, self.items, self.modality = Path(parts), items, modality
        self.chunk_size, self.batch_size = chunk_size, batch_size

    def __call__(self, batch: dict) -> dict:
        from hubless.encoders.job import embed_chunk

        for chunk in batch["chunk"]:
            embed_chunk(self.encoder, self.parts, int(chunk), self.items, self.modality, self.chunk_size, self.batch_size)
        return {"chunk": np.asarray(batch["chunk"])}


def embed(
    model: str | os.PathLike,
    out: str | os.PathLike,
    *,
    images: list[str] | None = None,
    texts: list[str] | None = None,
    kind: str | None = None,
    device: str | None = None,
    workers: int | None = None,
    address: str | None = None,
    chunk_size: int = 4096,
    batch_size: int = 32,
    progress: bool | None = None,
    overwrite: bool = False,
):
    """Embed ``images`` (paths) or ``texts`` with ``model`` into ``out`` on Ray; returns the
    :class:`~hubless.encoders.job.EmbedResult` of the single-machine job (same files).

    ``workers``: Ray Data actors, each loading the model once (default: one per GPU of the
    cluster, else one per CPU); ``address``: a Ray cluster (``ray://host:10001``), default a
    local Ray started without a dashboard. Raises :class:`~hubless.errors.MissingDependency`
    (the ``distributed`` extra) when Ray is not installed.
    """
    from hubless.encoders import load_encoder
    from hubless.encoders.job import embed_to_file
    from hubless.errors import check_available

    check_available("ray", "embedding on Ray (--ray)", "distributed")  # before the model is loaded
    check_address(address)
    encoder = load_encoder(model, kind=kind, device="cpu" if device is None else device)  # name and dim for the job key
    ray = connect(address)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    n_workers = workers or (gpus or max(1, int(ray.cluster_resources().get("CPU", 1))))

    def run_chunks(parts, chunks, items, modality, chunk_size_, batch_size_):
        if not chunks:
            return
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = bool(progress)
        args = (os.fspath(model), kind, device, os.fspath(parts), items, modality, chunk_size_, batch_size_)
        ds: Any = ray.data.from_items([{"chunk": c} for c in chunks], override_num_blocks=len(chunks))
        ds = ds.map_batches(
            ChunkEmbedder,
            fn_constructor_args=args,
            batch_size=1,
            concurrency=min(n_workers, len(chunks)),
            num_gpus=1 if gpus else 0,
            num_cpus=1,
        )
        ds.materialize()

    return embed_to_file(
        encoder,
        out,
        images=images,
        texts=texts,
        chunk_size=chunk_size,
        batch_size=batch_size,
        progress=progress,
        overwrite=overwrite,
        run_chunks=run_chunks,
    )
