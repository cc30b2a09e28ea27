"""The Ray connection of the distributed jobs: where they run, and never somewhere else.

``address=None`` runs on the Ray this process is already connected to, else on a private local
Ray started here (no dashboard). ``address="ray://host:10001"`` (Ray Client), ``"host:port"``
(a cluster's GCS), ``"auto"`` (the cluster ``ray start`` runs on this machine) or ``"local"``
(a Ray of this process) names one. When this process is already connected, a job given an
``address`` checks that the connection is the one named and raises
:class:`~hubless.errors.Conflict` otherwise, before any work: Ray would keep the existing
connection and the job would silently run elsewhere (on the local Ray, say) than asked.
"""

from __future__ import annotations

import logging
import socket
import sys

from hubless.errors import Conflict, optional_import

__all__ = ["check_address", "connect"]

#: What this process connected to through :func:`connect`: {"address": ..., "gcs": ...}.
_CONNECTED: dict[str, str | None] = {}


def _ray():
    return optional_import("ray", "distributed fitting and index building", "distributed")


def connect(address: str | None = None, *, num_cpus: int | None = None):
    """The Ray module, connected: to the cluster at ``address``, else to a local Ray started
    here (``num_cpus``, no dashboard). An existing connection is reused when it is the one
    ``address`` names (or no address is given); another raises :class:`~hubless.errors.Conflict`."""
    ray = _ray()
    if ray.is_initialized():
        check_address(address)
        return ray
    if address:
        ray.init(address=address, log_to_driver=False)
    else:  # a private Ray for this process: its start-up notices are noise here
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    _CONNECTED.update(address=address, gcs=_current(ray))
    return ray


def check_address(address: str | None) -> None:
    """Raise :class:`~hubless.errors.Conflict` when this process is connected to a Ray other
    than the one ``address`` names (nothing to check without an address or a connection)."""
    ray = sys.modules.get("ray")
    if not address or ray is None or not ray.is_initialized():
        return
    current = _current(ray)
    if _CONNECTED.get("gcs") == current and _CONNECTED.get("address") == address:
        return  # connected by hubless to this very address
    if _names(ray, address, current):
        return
    raise Conflict(
        f"this process is already connected to Ray at {current}, not at address={address!r}: a job there would run on "
        "the connected Ray instead; pass the address it is connected to (or no address), or call ray.shutdown() first"
    )


def _current(ray) -> str:
    """Where this process's Ray connection goes: ``ray://host:port`` for Ray Client, else the
    GCS ``host:port`` of the cluster (or local Ray) it is attached to."""
    client = getattr(getattr(ray, "util", None), "client", None)
    if client is not None and client.ray.is_connected():
        worker = getattr(client.ray.get_context(), "client_worker", None)
        return f"ray://{getattr(worker, '_conn_str', '?')}"
    return str(ray.get_runtime_context().gcs_address)


def _normal(text: str) -> tuple[str, int] | None:
    """(ip, port) of ``host:port``, this machine's loopback names as Ray resolves them (to the
    node's address, which its GCS address uses)."""
    host, _, port = text.rpartition(":")
    try:
        from ray._private.services import resolve_ip_for_localhost

        host = resolve_ip_for_localhost(host or "127.0.0.1")
    except Exception:  # Ray changed its internals: plain name resolution
        pass
    try:
        return socket.gethostbyname(host), int(port)
    except (OSError, ValueError):
        return None


def _same(a: str, b: str) -> bool:
    na = _normal(a)
    return na is not None and na == _normal(b)


def _names(ray, address: str, current: str) -> bool:
    """Whether ``address`` names the connection ``current``."""
    if address.startswith("ray://") or current.startswith("ray://"):
        return address.startswith("ray://") and current.startswith("ray://") and _same(address[6:], current[6:])
    if address == "local":  # a Ray of this process
        node = getattr(getattr(ray, "_private", None), "worker", None)
        node = getattr(node, "_global_node", None)
        return bool(getattr(node, "head", False))
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            resolved = canonicalize_bootstrap_address("auto")
        except Exception:  # no cluster started with `ray start` here, or Ray changed its internals
            return False
        return resolved is not None and _same(resolved, current)
    return _same(address, current)


def run_tasks(ray, submit, items, on_done, *, window: int, bar=None, finish_running: bool = False) -> None:
    """Run ``submit(item)`` (a Ray task's ObjectRef) for every item, at most ``window`` at once,
    and ``on_done(item, result)`` as each finishes, in any order. A result is dropped once
    handled and later tasks are submitted only as earlier ones finish, so neither the driver nor
    the object store holds more than ``window`` results (or task arguments) at a time. A task's
    error stops the run and is raised as the task raised it. The tasks in flight (at most
    ``window``) are not cancelled: with ``finish_running`` (short tasks that keep their own
    output) they are waited for (their errors ignored) so a rerun finds their work done; without,
    they are left to finish in the background, their results dropped.

    Not cancelled because ``ray.cancel`` racing a task's completion aborts the whole driver
    process in Ray 2.60 (``Check failed: ... Tried to complete task that was not pending``,
    task_manager.cc), seen here when a failed part's siblings were cancelled: an error in one
    task must never take the caller's process down with it."""
    queue = list(items)
    queue.reverse()
    running: dict = {}
    try:
        while queue or running:
            while queue and len(running) < window:
                item = queue.pop()
                running[submit(item)] = item
            done, _ = ray.wait(list(running), num_returns=1)
            item = running.pop(done[0])
            on_done(item, _get(ray, done[0]))
            if bar is not None:
                bar.update(1)
    except BaseException:
        if finish_running and running:
            ray.wait(list(running), num_returns=len(running))
        raise


def _get(ray, ref):
    """``ray.get`` that re-raises a task's own error (not Ray's wrapper with its traceback)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
