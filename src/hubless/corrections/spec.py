"""Method specs: ``"nnn:alpha=0.5,k=16"`` <-> correction objects (used by the CLI and reports)."""

from __future__ import annotations

import re
from typing import Literal

from hubless._registry import Registry
from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.base import Correction
from hubless.corrections.serving import check_additive
from hubless.errors import InvalidInput

#: The built-in methods' names (a spec may add parameters: ``"nnn:alpha=0.5,k=16"``); a method
#: registered elsewhere is accepted as any ``str``.
MethodName = Literal["baseline", "nnn", "dn", "csls", "is", "dis", "dualis", "dualdis", "gc"]

__all__ = ["METHODS", "MethodName", "make_additive", "make_correction", "method_help"]

#: Registry: spec name -> correction class, in :attr:`Correction.order`. A correction registers
#: itself with ``@METHODS.register`` in its own module of this package (every module is imported
#: on the first lookup), so a new method is added in one file; it then works in specs, tuning,
#: the CLI and the contract tests (``tests/corrections/test_contract.py``).
METHODS: Registry[type[Correction]] = Registry("method", "hubless.corrections", sort_key=lambda cls: cls.order)

_INT = re.compile(r"[+-]?\d+")


def _parse_value(text: str):
    text = text.strip()
    low = text.lower()
    if low in {"true", "false"}:
        return low == "true"
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def make_additive(spec: str | Correction) -> AdditiveCorrection:
    """:func:`make_correction`, refusing a method that is not a per-candidate bias (GC ranks by
    probes): what a vector index or store can serve (:func:`~hubless.corrections.serving.check_additive`)."""
    return check_additive(make_correction(spec))


def make_correction(spec: MethodName | str | Correction) -> Correction:
    """Build a correction from a spec ``name[:param=value,...]`` (a Correction passes through).

    Names: baseline, nnn, dn, csls, is, dis, dualis, dualdis, gc. Example:
    ``make_correction("nnn:alpha=0.5,k=16")`` is ``NNN(alpha=0.5, k=16)``.
    """
    if isinstance(spec, Correction):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput(f"a method spec must be a non-empty string like 'nnn:alpha=0.5,k=16'; got {spec!r}")
    name, _, body = spec.strip().partition(":")
    cls = METHODS.get_class(name.strip())
    params = {}
    for item in body.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InvalidInput(f"bad parameter {item!r} in {spec!r}; write name=value, e.g. alpha=0.5")
        params[key.strip()] = _parse_value(value)
    allowed = cls.param_names()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidInput(f"{name} has no parameter(s) {', '.join(unknown)}; valid: {', '.join(allowed)}")
    return cls(**params)


def method_help() -> str:
    """One line per method for help texts: its spec at the defaults and what it is."""
    return "\n".join(f"{cls().spec}: {cls.summary}" for cls in METHODS.values())
