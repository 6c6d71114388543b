"""Offline bundles: tritonserver and the gateway's wheels, carried to a machine without network.

``pack`` runs where pip can download and the ``engine`` extra is installed. It writes a folder
holding a slim tritonserver tree taken from the nvidia-pytriton wheel (the binary, the Python
backend, the stub built for the target Python, the shared libraries), the wheels of the
gateway's runtime dependencies for the target Python (minus those the target already has), and
numpy < 2 for the text models.

``install`` runs on the target with its own ``python3`` (standard library only). It makes two
virtual environments layered over that interpreter's packages (a CUDA build of torch, say):

- ``<prefix>/env``: the gateway, tritonserver and the engine, over the target's packages as
  they are (numpy 2 included);
- ``<prefix>/text-env``: numpy < 2 ahead of the same packages, for the Python-backend models
  that carry string tensors, which Triton 2.51's stub garbles under numpy 2. The deploy spec
  points at it with ``text_python_env``.

The project itself is installed from its source folder, so the target needs setuptools.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PROJECT = "triton-gateway"
SOURCE = Path(__file__).resolve().parents[2]
PACKAGES = ("adapters", "deploy", "gateway")
SERVER_ARCHIVE = "tritonserver.tar.xz"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


class OfflineError(RuntimeError):
    """A bundle that cannot be packed or installed."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions(paths: list[str] | None) -> dict[str, Any]:
    """Canonical name -> distribution; the first path holding a name wins, as on ``sys.path``."""
    from importlib.metadata import distributions

    found: dict[str, Any] = {}
    for dist in distributions() if paths is None else distributions(path=paths):
        found.setdefault(_canonical(dist.metadata["Name"]), dist)
    return found


def runtime_closure(python_version: str, paths: list[str] | None = None) -> dict[str, Any]:
    """Name -> installed distribution of every package the gateway needs at run time."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # an interpreter with pip but without packaging
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

    installed = _distributions(paths)
    marker_env = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    found: dict[str, Any] = {}
    pending: list[tuple[str, frozenset[str]]] = [(PROJECT, frozenset())]
    while pending:
        name, extras = pending.pop()
        for text in installed[_canonical(name)].requires or ():
            req = Requirement(text)
            wanted = req.marker is None or any(
                req.marker.evaluate(marker_env | {"extra": extra}) for extra in extras | {""}
            )
            key = _canonical(req.name)
            if wanted and key not in found and key in installed:
                found[key] = installed[key]
                pending.append((req.name, frozenset(req.extras)))
    return found


def _server_members(root: Path, python_version: str) -> Iterator[tuple[Path, str]]:
    """(file, name in the archive) of the slim tritonserver tree, in the wheel's layout."""
    server = root / "pytriton" / "tritonserver"
    stub = server / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.is_file():
        raise OfflineError(f"the pytriton wheel has no Python backend stub for {python_version}")
    python_backend = server / "backends" / "python"
    files = [server / "bin" / "tritonserver", stub]
    files += [
        python_backend / "libtriton_python.so",
        python_backend / "triton_python_backend_utils.py",
    ]
    for path in files:
        yield path, str(path.relative_to(root))
    for lib in sorted((root / "nvidia_pytriton.libs").iterdir()):
        # The stub links the target's own libpython; the wheel's copy serves PyTriton only.
        if not lib.name.startswith("libpython"):
            yield lib, str(lib.relative_to(root))


def _pytriton_site() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise OfflineError("pack needs the nvidia-pytriton wheel (pip install '.[engine]')")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _download(requirements: list[str], python_version: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", "-d", str(out)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *requirements], check=True)


def pack(out: Path, python_version: str, exclude: set[str]) -> Path:
    """Write the bundle for a target running ``python_version`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / SERVER_ARCHIVE, "w:xz", preset=6) as archive:
        for path, name in _server_members(_pytriton_site(), python_version):
            archive.add(path, arcname=name)
    closure = {name: dist.version for name, dist in runtime_closure(python_version).items()}
    numpy_version = closure.pop("numpy", "1.26.4")
    wanted = sorted(
        f"{name}=={version}" for name, version in closure.items() if name not in exclude
    )
    for folder in ("wheels", "text-wheels"):
        shutil.rmtree(out / folder, ignore_errors=True)
    _download(wanted, python_version, out / "wheels")
    _download([f"numpy=={numpy_version}"], python_version, out / "text-wheels")
    return out


def _site_packages(env: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return env / "lib" / version / "site-packages"


def _layer(env: Path, below: Iterable[str]) -> Path:
    """A venv whose ``sys.path`` continues into ``below`` after its own site-packages."""
    venv.EnvBuilder(clear=True, with_pip=False, symlinks=True).create(env)
    site = _site_packages(env)
    (site / "_layered.pth").write_text("".join(f"{path}\n" for path in below))
    return site


def _pip(env: Path, *args: str) -> None:
    command = [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index"]
    command += ["--no-deps", "--no-build-isolation", "--disable-pip-version-check"]
    subprocess.run([*command, *args], check=True)


def _base_paths() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def install(bundle: Path, prefix: Path) -> None:
    """Make ``<prefix>/env`` and ``<prefix>/text-env`` from a bundle, over this interpreter."""
    base = _base_paths()
    env, text_env = prefix / "env", prefix / "text-env"
    site = _layer(env, base)
    _pip(env, *map(str, sorted((bundle / "wheels").glob("*.whl"))), str(SOURCE))
    with tarfile.open(bundle / SERVER_ARCHIVE) as archive:
        archive.extractall(site, filter="tar")
    server = site / "pytriton" / "tritonserver"
    for binary in [server / "bin" / "tritonserver", *server.glob("python_backend_stubs/*/*stub")]:
        binary.chmod(0o755)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    closure = runtime_closure(version, [str(site), *base])
    view = _text_view(prefix / "text-view", closure, site)
    text_site = _layer(text_env, [str(view)])
    # The text environment has no pip of its own: this interpreter's installs into it.
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    command += ["--disable-pip-version-check", "--target", str(text_site)]
    subprocess.run(
        [*command, *map(str, sorted((bundle / "text-wheels").glob("*.whl")))], check=True
    )
    check = "import numpy, transformers; print('text-env numpy', numpy.__version__)"
    subprocess.run([str(text_env / "bin" / "python"), "-c", check], check=True)


def link_distribution(dist: Any, folder: Path) -> None:
    """Link each top-level entry of an installed distribution (packages, modules, metadata)."""
    root = Path(dist.locate_file(""))
    tops = {Path(str(file)).parts[0] for file in dist.files or ()}
    for top in sorted(tops - {"..", "__pycache__"}):
        if (root / top).exists():
            _link(root / top, folder / top)


def _link(source: Path, link: Path) -> None:
    """Link ``source`` at ``link``. A namespace folder (no ``__init__.py``) that several
    distributions fill, as protobuf and googleapis-common-protos fill ``google``, becomes a
    folder of links to what each of them holds; elsewhere the first distribution's entry stays."""
    if not link.is_symlink() and not link.exists():
        link.symlink_to(source)
        return
    regular = (source / "__init__.py").exists() or (link / "__init__.py").exists()
    if not source.is_dir() or not link.is_dir() or regular:
        return
    if link.is_symlink():
        first = link.resolve()
        if first == source.resolve():
            return
        link.unlink()
        link.mkdir()
        for child in first.iterdir():
            (link / child.name).symlink_to(child)
    for child in source.iterdir():
        _link(child, link / child.name)


def _text_view(view: Path, closure: dict[str, Any], project: Path = SOURCE) -> Path:
    """A folder of links to the gateway's runtime packages alone, numpy excepted.

    The text environment sees only these: packages of the base built for numpy 2 (SciPy and
    scikit-learn, which transformers imports whenever they are installed) stay out of it.
    """
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for name, dist in closure.items():
        if name != "numpy":
            link_distribution(dist, view)
    for package in PACKAGES:
        # The project is not in its own closure: its installed copy (or the source tree).
        if not (view / package).exists():
            (view / package).symlink_to(project / package)
    return view


def _names(values: Iterable[str]) -> set[str]:
    names = set()
    for value in values:
        path = Path(value)
        text = path.read_text() if path.is_file() else value
        lines = re.split(r"[,\s]+", text)
        names |= {_canonical(re.split(r"[=<>~! ]", line, maxsplit=1)[0]) for line in lines if line}
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.devtools.offline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    pack_cmd = sub.add_parser("pack", help="write a bundle for an offline target")
    pack_cmd.add_argument("out", type=Path)
    pack_cmd.add_argument("--python", default="3.12", help="the target's Python version")
    pack_cmd.add_argument(
        "--exclude",
        action="append",
        default=[],
        help="packages the target has: names separated by commas, or a `pip freeze` file",
    )
    install_cmd = sub.add_parser("install", help="make the environments on the target")
    install_cmd.add_argument("bundle", type=Path)
    install_cmd.add_argument("--prefix", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            pack(args.out, args.python, _names(args.exclude))
        else:
            install(args.bundle, args.prefix)
    except (OfflineError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
