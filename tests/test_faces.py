"""Package faces: each public name is written once, in the face's `if TYPE_CHECKING:`
block, and `memd.lazy_face` derives the lazy `__getattr__` (and `__all__`) from it.

Importing a face stays free (no submodule loads until a name is used), every name in
`__all__` is the object its module defines, and a face line that is not a plain
`from <package>.<module> import <names>` fails on first use instead of exporting wrong.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from memd import lazy_face

ROOT = Path(__file__).resolve().parent.parent
FACES = sorted(
    f"memd.{p.parent.name}"
    for p in (ROOT / "memd").glob("*/__init__.py")
    if "lazy_face(__name__, __file__)" in p.read_text()
)


def test_the_faces_use_the_one_pattern() -> None:
    assert len(FACES) >= 14, FACES  # every face but indexing and recall (reorganised apart)


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_is_its_modules_object(face: str) -> None:
    package = importlib.import_module(face)
    assert package.__all__, face
    for name in package.__all__:
        value = getattr(package, name)
        home = importlib.import_module(f"{face}.{_module_of(face, name)}")
        assert value is getattr(home, name), f"{face}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'not_public'"):
        package.not_public  # noqa: B018


def test_importing_the_faces_loads_none_of_their_modules() -> None:
    code = (
        "import importlib, sys\n"
        f"faces = {FACES!r}\n"
        "for f in faces: importlib.import_module(f)\n"
        "print(sorted(m for m in sys.modules if any(m.startswith(f + '.') for f in faces)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_a_face_reads_its_names_from_the_type_checking_block(tmp_path: Path) -> None:
    face = _package(tmp_path, "facegood", "from facegood.mod import Beta, alpha")
    getattr_ = lazy_face("facegood", str(face))
    assert getattr_("__all__") == ["Beta", "alpha"]
    sys.path.insert(0, str(tmp_path))
    try:
        assert getattr_("alpha") == 1
        with pytest.raises(AttributeError):
            getattr_("gamma")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("facegood")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    "line",
    [
        "from facebad.mod import alpha as beta",  # a renamed name would be written twice
        "from other.mod import alpha",  # not this package's module
        "from facebad.mod.deep import alpha",  # not a direct submodule
        "import facebad.mod",  # not a name
    ],
)
def test_a_face_line_of_another_shape_fails_at_first_use(tmp_path: Path, line: str) -> None:
    getattr_ = lazy_face("facebad", str(_package(tmp_path, "facebad", line)))
    for name in ("__all__", "alpha"):
        with pytest.raises(ImportError, match="facebad"):
            getattr_(name)


def _package(tmp_path: Path, name: str, line: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "mod.py").write_text("alpha = 1\nBeta = 2\n")
    face = folder / "__init__.py"
    face.write_text(
        "from typing import TYPE_CHECKING\n\nfrom memd import lazy_face\n\n"
        f"if TYPE_CHECKING:\n    {line}\n"
        "else:\n    __getattr__ = lazy_face(__name__, __file__)\n"
    )
    return face


def _module_of(face: str, name: str) -> str:
    """The submodule the face's TYPE_CHECKING block imports `name` from."""
    text = (ROOT / face.replace(".", "/") / "__init__.py").read_text()
    block = text.split("if TYPE_CHECKING:", 1)[1].split("\nelse:", 1)[0]
    module = ""
    for word in block.replace("(", " ").replace(")", " ").replace(",", " ").split():
        if word.startswith(face + "."):
            module = word.removeprefix(face + ".")
        elif word == name:
            return module
    raise AssertionError(f"{name} is not in {face}'s face")


def test_no_public_name_is_shadowed_by_a_submodule_of_that_name() -> None:
    """Importing `pkg.name` sets `pkg.name` to the module: a face that exports a function
    `name` from a package holding a module `name` hands out the module once anything
    imported it (it happened: `memd.indexing.catch_up` became the catch-up loop module)."""
    code = (
        "import importlib, pkgutil, types, memd\n"
        f"faces = {FACES!r}\n"
        "for m in pkgutil.walk_packages(memd.__path__, 'memd.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "print(sorted(f'{f}.{n}' for f in faces for n in importlib.import_module(f).__all__\n"
        "             if isinstance(getattr(importlib.import_module(f), n), types.ModuleType)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
