"""The example spaces shipped with dse (package data), so ``dse run quickstart`` works from an
installed wheel as from a checkout; a path to a space file always works too.

A name is looked up as ``NAME.toml`` among the shipped spaces, then under their ``questions/``
folder (``dse run quickstart``, ``dse answer fast-mode``). The wheel carries a copy of the
repository's ``spaces/`` folder as ``dse/_spaces/`` (``setup.py``); a checkout or an editable
install reads ``spaces/`` itself.
"""

from __future__ import annotations

from pathlib import Path

from dse.errors import InputError, suggest

_PKG = Path(__file__).resolve().parents[1]     # the dse package


def spaces_dir() -> Path:
    """The folder of the shipped example spaces: the wheel's copy, else the checkout's."""
    for d in (_PKG / "_spaces", _PKG.parent / "spaces"):
        if (d / "quickstart.toml").is_file():
            return d
    return _PKG / "_spaces"


def names() -> list[str]:
    """The shipped spaces' names (``quickstart``, ..., the worked questions' names)."""
    d = spaces_dir()
    return sorted({p.stem for p in (*d.glob("*.toml"), *d.glob("questions/*.toml"))})


def space_path(arg: str) -> str:
    """``arg`` itself when it names an existing file (or is a path, not a bare name: the
    loader's own error names a missing one); else the shipped space of that name, ``quickstart``
    or ``quickstart.toml``. A bare name that is neither is refused naming the closest shipped
    spaces."""
    p = Path(arg)
    if p.exists() or len(p.parts) != 1:
        return arg
    stem = p.name.removesuffix(".toml")
    d = spaces_dir()
    for cand in (d / f"{stem}.toml", d / "questions" / f"{stem}.toml"):
        if cand.is_file():
            return str(cand)
    raise InputError("file not found", file=arg,
                     hint="give the path of a space file, or a shipped space's name: "
                          + suggest(stem, names(), "shipped spaces"))
