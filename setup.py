"""Packaging hook: the wheel carries the repository's example spaces (``spaces/``) as package
data under ``dse/_spaces/``, so ``dse run quickstart`` works from an installed wheel
(``dse.spec.bundled``). Everything else is declared in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithSpaces(build_py):
    def run(self):
        super().run()
        src = Path(__file__).resolve().parent / "spaces"
        if not src.is_dir():
            return
        dst = Path(self.build_lib) / "dse" / "_spaces"
        for f in sorted(src.rglob("*")):
            if f.is_file() and f.suffix in (".toml", ".md"):
                t = dst / f.relative_to(src)
                t.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, t)


setup(cmdclass={"build_py": BuildPyWithSpaces})
