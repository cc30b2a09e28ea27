"""Commands that take one of several kinds of input: one options object per mode, the
exclusions declared once.

``hubless eval`` measures embeddings, score matrices (``--scores``), an attached collection
(``--attached``) or embeddings with several named query banks; ``hubless tune`` the first two.
Each mode is a frozen dataclass subclassing :class:`Mode`: its fields are the options that apply
in it (named as the command's parameters), ``what`` names it in messages, ``needs`` lists the
options it cannot run without, ``chosen`` says when the command's values select it, and ``run``
does its work. :func:`choose_mode` picks the first mode a command's values select and refuses,
in one line naming where they belong, the options given on the command line that the mode does
not take: no per-mode table of refusals to keep in step with the options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import typer

from hubless.errors import InvalidInput


@dataclasses.dataclass(frozen=True)
class Mode:
    """One mode of a command: subclass it as a frozen dataclass of the options it takes."""

    #: The mode in messages ("score matrices") and the option that selects it ("--scores"; none
    #: for the mode run when no other is selected).
    what: ClassVar[str] = ""
    selector: ClassVar[str] = ""
    #: The options it cannot run without.
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        """Whether the command's ``values`` select this mode (the last mode listed: always)."""
        return True

    @classmethod
    def options(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def run(self) -> None:
        raise NotImplementedError


def _flag(ctx: typer.Context, name: str) -> str:
    param = next(p for p in ctx.command.params if p.name == name)
    return max(param.opts, key=len)  # --method, not -m


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _listed(items: list[str], last: str = "and") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def _named(mode: type[Mode]) -> str:
    return f"{mode.what} ({mode.selector})" if mode.selector else mode.what


def choose_mode(ctx: typer.Context, modes: Sequence[type[Mode]], values: dict[str, Any]) -> Mode:
    """The first of ``modes`` that ``values`` (the command's parameters by name) select, made
    from them; an option given on the command line that it does not take, or a missing one it
    needs, is refused naming the modes it belongs to."""
    mode = next(m for m in modes if m.chosen(values))
    foreign = [name for name in values if name in {p.name for p in ctx.command.params} - mode.options() and _given(ctx, name)]
    if foreign:
        flags = _listed([_flag(ctx, n) for n in foreign])
        homes = [_named(m) for m in modes if m is not mode and any(n in m.options() for n in foreign)]
        belong = f"; {'it belongs' if len(foreign) == 1 else 'they belong'} to {_listed(homes, 'or')}" if homes else ""
        raise InvalidInput(f"{flags} {'does' if len(foreign) == 1 else 'do'} not apply to {mode.what}{belong}")
    missing = [name for name in mode.needs if values[name] is None]
    if missing:
        if mode is modes[-1] and not any(_given(ctx, n) for n in mode.needs):  # nothing of the default mode given either
            others = [m for m in modes[:-1] if m.needs and not set(mode.needs) <= set(m.needs)]  # not a variant of the default
            ways = [f"{_listed([_flag(ctx, n) for n in m.needs])} ({m.what})" for m in (mode, *others)]
            raise typer.BadParameter(f"give {_listed(ways, 'or')}")
        raise typer.BadParameter(f"{mode.what}: give {_listed([_flag(ctx, n) for n in missing])} too")
    return mode(**{name: values[name] for name in mode.options()})
