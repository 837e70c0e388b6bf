"""The wheels the GPU check carries: the pinned list, whether it covers what the carried packages need, and a
stand-in for the GPU image on a CPU machine.

    python -m benchmarks.gpu.wheelset check benchmarks/gpu/wheels       # after `make gpu-wheels`
    python -m benchmarks.gpu.wheelset image-site --venv VENV --out DIR  # the image's packages, linked from VENV

`check` reads each downloaded wheel's METADATA and follows its Requires-Dist (skyrl's `tinker` and `jax`
extras too; extras of a requirement, such as httpx[http2], are named in wheels.txt by hand): every name must
be carried, in the image (image-packages.txt), or listed in NOT_CARRIED with the reason it is not needed.
A requirement that the image meets only with another version is reported (KNOWN_CONFLICTS says which are
expected), since the carried wheels install with --no-deps.

`image-site` links, from a venv's site-packages, the distributions whose names image-packages.txt lists
into one folder: on PYTHONPATH in front of a bare Python 3.12 it stands in for the GPU image, so that a dry
run on CPU finds no package the image would lack (README.md, "Dry run on CPU"). Standard library and
`packaging` only.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "wheels.txt"
IMAGE = HERE / "image-packages.txt"
WHEELS = HERE / "wheels"
FALLBACK = "fallback"  # wheels.txt marker, and the wheels/ subfolder such wheels go to

# The extras of carried packages the check uses: SkyRL's Tinker API server with its jax backend.
EXTRAS = {"skyrl": {"tinker", "jax"}}
# The GPU image's own builds: carrying any of these would shadow its CUDA packages.
NEVER_CARRY = {"jax", "jaxlib", "torch", "transformers", "jax-cuda13-plugin", "jax-cuda13-pjrt", "triton"}
# Carried although the image has them: the version there is unknown or too old for a carried package.
SHADOWS = {"typing-extensions": "pydantic 2.14 needs >= 4.16; the image's version is not known"}
NOT_CARRIED = {
    "datasets": "imported only by skyrl.tx.loaders (SkyRL's training scripts), never by the API, engine or jax "
                "backend",
    "hf-transfer": "speeds up hub downloads; the model is a local folder",
    "asyncpg": "PostgreSQL driver; the server's database is sqlite (aiosqlite)",
    "psycopg2-binary": "PostgreSQL driver; the server's database is sqlite (aiosqlite)",
}
# Requirements the image meets with another version than asked; the check runs with the image's.
KNOWN_CONFLICTS = {"transformers": "skyrl 0.4.0 asks transformers <=5.16.1; the image has 5.17.0"}
# Where the requirement markers are evaluated: the GPU machine.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    fallback: bool = False  # installed only when the image's own copy is too old


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = PINS) -> list[Pin]:
    pins = []
    for raw in path.read_text().splitlines():
        line, _, comment = raw.partition("#")
        if not line.strip():
            continue
        name, sep, version = line.strip().partition("==")
        if not sep or not version:
            raise ValueError(f"{path.name}: {raw.strip()!r} is not NAME==VERSION")
        pins.append(Pin(canonical(name), version.strip(), comment.strip() == FALLBACK))
    return pins


def read_image(path: Path = IMAGE) -> dict[str, str | None]:
    """{canonical name: version or None} of the image's packages."""
    image: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            image[canonical(name)] = version or None
    return image


def plan_problems(pins: list[Pin], image: dict[str, str | None]) -> list[str]:
    """What is wrong with the pinned list itself (no wheel needed): duplicates, forbidden or redundant names."""
    problems = []
    seen: dict[str, str] = {}
    for pin in pins:
        if pin.name in seen:
            problems.append(f"{pin.name} pinned twice ({seen[pin.name]} and {pin.version}): keep one version")
        seen[pin.name] = pin.version
        if pin.name in NEVER_CARRY:
            problems.append(f"{pin.name} must not be carried: the image's own CUDA build must run")
        if pin.name in image and not pin.fallback and pin.name not in SHADOWS:
            problems.append(f"{pin.name} is in the image already: carry it only as a fallback or name it in SHADOWS")
        if pin.name in NOT_CARRIED:
            problems.append(f"{pin.name} is both carried and listed as not needed")
    return problems


def wheel_files(folder: Path) -> dict[str, Path]:
    """{canonical name: wheel} of the wheels in folder (not its subfolders)."""
    return {canonical(p.name.split("-", 1)[0]): p for p in sorted(folder.glob("*.whl"))}


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """(version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = zf.read(name).decode()
    headers = text.split("\n\n", 1)[0].splitlines()
    version = next(h.split(":", 1)[1].strip() for h in headers if h.startswith("Version:"))
    return version, [h.split(":", 1)[1].strip() for h in headers if h.startswith("Requires-Dist:")]


def needed(requirements: list[str], extras: set[str]) -> list:
    """The requirements that apply on the GPU machine for these extras (packaging Requirement objects)."""
    from packaging.requirements import Requirement

    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**TARGET, "extra": e}) for e in ({""} | extras)):
            out.append(req)
    return out


def closure_report(pins: list[Pin], image: dict[str, str | None], requires: dict[str, tuple[str, list[str]]]) -> dict:
    """Check the carried set against what its packages require.

    requires: {canonical name: (version, Requires-Dist lines)} of each carried wheel.
    Returns {"missing": [...], "conflicts": [(name, text)...], "not_carried": {...}, "wrong_version": [...]}.
    """
    carried = {p.name: p.version for p in pins if not p.fallback}
    report: dict = {"missing": [], "conflicts": [], "not_carried": {}, "wrong_version": []}
    for name, version in carried.items():
        if name not in requires:
            report["missing"].append(f"{name}=={version}: no wheel")
            continue
        if requires[name][0] != version:
            report["wrong_version"].append(f"{name}: wheel {requires[name][0]}, pinned {version}")
        for req in needed(requires[name][1], EXTRAS.get(name, set())):
            dep = canonical(req.name)
            if dep in carried:
                if req.specifier and not req.specifier.contains(carried[dep], prereleases=True):
                    report["missing"].append(f"{name} needs {req}; carried {dep}=={carried[dep]}")
            elif dep in image:
                have = image[dep]
                if have and req.specifier and not req.specifier.contains(have, prereleases=True):
                    report["conflicts"].append((dep, f"{name} asks {req}; the image has {dep}=={have}"))
            elif dep in NOT_CARRIED:
                report["not_carried"].setdefault(dep, NOT_CARRIED[dep])
            else:
                report["missing"].append(f"{name} needs {req}: neither carried nor in the image")
    return report


def check(folder: Path = WHEELS) -> int:
    pins, image = read_pins(), read_image()
    problems = plan_problems(pins, image)
    found = wheel_files(folder)
    fallback = wheel_files(folder / FALLBACK) if (folder / FALLBACK).is_dir() else {}
    want = {p.name for p in pins if not p.fallback}
    problems += [f"unexpected wheel {found[n].name}: not in {PINS.name}" for n in sorted(set(found) - want)]
    problems += [f"fallback {p.name}=={p.version} not downloaded" for p in pins
                 if p.fallback and p.name not in fallback]
    report = closure_report(pins, image, {n: wheel_metadata(w) for n, w in found.items() if n in want})
    problems += report["missing"] + report["wrong_version"]
    problems += [f"version conflict not in KNOWN_CONFLICTS: {text}" for dep, text in report["conflicts"]
                 if dep not in KNOWN_CONFLICTS]
    size = sum(w.stat().st_size for w in [*found.values(), *fallback.values()])
    for _, text in report["conflicts"]:
        print(f"wheelset: runs with the image's version: {text}")
    for name, why in report["not_carried"].items():
        print(f"wheelset: not carried: {name} ({why})")
    if problems:
        for line in problems:
            print(f"wheelset: {line}", file=sys.stderr)
        return 1
    print(f"wheelset: {len(found)} wheels + {len(fallback)} fallback, {size / 2**20:.1f} MiB, complete for the image")
    return 0


def build_image_site(site_packages: Path, names: set[str], dest: Path, skip: set[str] = frozenset()) -> list[str]:
    """Link the top-level entries of every distribution in site_packages named in `names` into dest."""
    from importlib import metadata

    dest.mkdir(parents=True, exist_ok=True)
    linked = []
    for dist in metadata.distributions(path=[str(site_packages)]):
        name = canonical(dist.metadata["Name"])
        if name not in names or name in skip:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            if top.endswith(".pth") or not (site_packages / top).exists():
                continue
            target = dest / top
            if not target.exists() and not target.is_symlink():
                target.symlink_to(site_packages / top)
        linked.append(f"{name}=={dist.version}")
    return sorted(linked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="is the downloaded set complete?").add_argument("folder", type=Path, nargs="?",
                                                                                  default=WHEELS)
    site = sub.add_parser("image-site", help="link a venv's image packages into one folder")
    site.add_argument("--venv", type=Path, required=True)
    site.add_argument("--out", type=Path, required=True)
    site.add_argument("--skip", default="", help="comma-separated names to leave out (e.g. jax,jaxlib)")
    args = parser.parse_args()
    if args.command == "check":
        return check(args.folder)
    site_packages = next(args.venv.glob("lib/python3*/site-packages"))
    skip = {canonical(n) for n in args.skip.split(",") if n}
    linked = build_image_site(site_packages, set(read_image()), args.out, skip)
    print(f"wheelset: {len(linked)} distributions linked into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
