"""The supply-chain pins: hash-checked locks of the Python dependencies and base images by digest.

    python -m d2ops.pins constraints   # the locks' versions as pip constraints, for `make setup`
    python -m d2ops.pins dev-ceiling RESOLUTION   # what of the dev tools' resolution the locks must follow
    python -m d2ops.pins digests       # resolve each base image tag's current digest, rewrite FROM/ARG lines

``make pins`` recompiles the locks (uv) and runs ``digests``. The readers here are also what
tests/unit/test_pins_agree.py checks the repository with. Standard library only: ``make setup`` runs
it before the virtualenv has anything installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each lock and the input it is compiled from; the order is `make pins`' (each later lock is
# constrained by the earlier ones, so the three agree on every package they share).
LOCKS = {
    "src/requirements.lock": "src/requirements.txt",  # the Lambda layer (d2ops.layer_build)
    "functions/requirements.lock": "functions/requirements.in",  # every function, beside the layer
    "containers/serving/requirements.lock": "containers/serving/requirements.txt",
    "containers/training/requirements.lock": "containers/training/requirements.txt",
}
# `sam build` installs each function's requirements.txt: a copy of the functions' lock (`make locks`).
FUNCTIONS_LOCK = "functions/requirements.lock"
# Not constraints of the development environment: the functions' boto3 is the newest (it must match the
# tracer's botocore), the venv's is the one aws-sam-cli pins exactly.
NOT_DEV_CONSTRAINTS = frozenset({FUNCTIONS_LOCK})
DOCKERFILES = ("containers/training/Dockerfile", "containers/serving/Dockerfile")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# A base image reference where it is written: a FROM line or an ARG default that a FROM names.
_IMAGE_LINE = re.compile(r"^(?P<lead>FROM\s+|ARG\s+\w+=)(?P<ref>[\w.\-/:]+?(?::[\w.\-]+)?(?:@sha256:[0-9a-f]{64})?)"
                         r"(?P<tail>(?:\s+AS\s+\S+)?\s*)$", re.MULTILINE | re.IGNORECASE)
_MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"))


class PinError(Exception):
    """A lock or a base image reference that cannot be read or resolved."""


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]


def normalize(name: str) -> str:
    """PEP 503's form of a distribution name (``Pillow`` and ``pillow`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str, where: str = "lock") -> dict[str, Locked]:
    """The packages of a ``--generate-hashes`` lock; a requirement that is not ``name==version`` with a
    hash is an error naming the line."""
    packages: dict[str, Locked] = {}
    # One logical line per requirement: backslash continuations joined, comments dropped.
    logical = re.sub(r"\\\s*\n", " ", "\n".join(line.split(" #")[0] for line in text.splitlines()))
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][\w.\-]*)==([\w.+!\-]+)((?:\s+--hash=sha256:[0-9a-f]{64})*)\s*", line)
        if not match:
            raise PinError(f"{where}: {line.split()[0]!r} is not an exact pin followed by its hashes")
        name, version, hashes = match.groups()
        if not hashes:
            raise PinError(f"{where}: {name}=={version} has no --hash")
        packages[normalize(name)] = Locked(normalize(name), version, tuple(hashes.split()))
    return packages


def requirement_names(text: str) -> list[str]:
    """The distribution names a requirements input lists (its direct requirements)."""
    names = []
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.append(normalize(re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0]))
    return names


def constraints(root: Path = REPO_ROOT) -> str:
    """What `make setup` installs the development environment with: the layer lock whole (it is the d2ops
    library's runtime, as src/requirements.txt is) and each image lock's direct requirements. The rest of
    an image's lock (its transitive pins) stays free: the developer tools have requirements of their own."""
    chosen: dict[str, tuple[str, list[str]]] = {}
    for lock, source in LOCKS.items():
        if lock in NOT_DEV_CONSTRAINTS:
            continue
        packages = read_lock((root / lock).read_text(), lock)
        names = packages if lock == "src/requirements.lock" else requirement_names((root / source).read_text())
        for name in names:
            version, where = chosen.setdefault(name, (packages[name].version, []))
            if version != packages[name].version:
                raise PinError(f"{lock}: {name}=={packages[name].version}, but {where[0]} locks {version}")
            where.append(lock)
    return "".join(f"{name}=={version}  # {', '.join(where)}\n" for name, (version, where) in sorted(chosen.items()))


def constrained_names(root: Path = REPO_ROOT) -> set[str]:
    """The names `make setup` constrains: the layer lock's packages and every image input's requirements."""
    names = set(read_lock((root / "src/requirements.lock").read_text(), "src/requirements.lock"))
    names |= set(requirement_names((root / "src/requirements.txt").read_text()))
    for lock, source in LOCKS.items():
        if lock not in NOT_DEV_CONSTRAINTS:
            names |= set(requirement_names((root / source).read_text()))
    return names


def dev_ceiling(resolution: str, root: Path = REPO_ROOT) -> str:
    """The lines of a resolution of the development environment (`uv pip compile pyproject.toml --extra
    dev`) that the locks must follow: the packages `make setup` constrains. The developer tools cap some of
    them (aws-sam-cli's translator pins pydantic ~=2.13.3); a lock past such a cap would leave `make setup`
    unresolvable, so the locks take the version the tools allow instead."""
    names = constrained_names(root)
    lines = []
    for line in resolution.splitlines():
        match = re.match(r"([A-Za-z0-9][\w.\-]*)==(\S+)", line)
        if match and normalize(match[1]) in names:
            lines.append(f"{normalize(match[1])}=={match[2]}\n")
    return "".join(lines)


# ------------------------------------------------------------------------------------- base images
def base_images(dockerfile: str) -> list[str]:
    """Every base image reference a Dockerfile builds FROM, with ``${ARG}`` defaults substituted."""
    args: dict[str, str] = {}
    refs = []
    for line in dockerfile.splitlines():
        if arg := re.match(r"^ARG\s+(\w+)=(\S+)\s*$", line):
            args[arg[1]] = arg[2]
        elif frm := re.match(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", line, re.IGNORECASE):
            refs.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), frm[1]))
    return refs


def unpinned(dockerfile: str) -> list[str]:
    """The base image references of a Dockerfile that name no tag or no digest."""
    return [ref for ref in base_images(dockerfile)
            if not _DIGEST.search(ref) or ":" not in _DIGEST.sub("", ref).rsplit("/", 1)[-1]]


def _registry_and_path(ref: str) -> tuple[str, str, str]:
    """(registry host, repository path, tag) of an image reference; Docker Hub's defaults applied."""
    name, _, tag = _DIGEST.sub("", ref).rpartition(":")
    first = name.split("/", 1)[0]
    if "." in first or ":" in first or first == "localhost":
        return first, name.split("/", 1)[1], tag
    return "registry-1.docker.io", name if "/" in name else f"library/{name}", tag


def _bearer(challenge: str, timeout: float) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in params:
        raise PinError(f"registry answered 401 without a token realm: {challenge!r}")
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    with urllib.request.urlopen(f"{params['realm']}?{query}", timeout=timeout) as answer:
        body = json.load(answer)
    return str(body.get("token") or body["access_token"])


def resolve_digest(ref: str, timeout: float = 20.0) -> str:
    """The digest the registry serves today for ``ref``'s tag (the multi-platform index where there is one)."""
    host, path, tag = _registry_and_path(ref)
    url = f"https://{host}/v2/{path}/manifests/{tag}"
    headers = {"Accept": _MANIFEST_TYPES}
    try:
        for _ in range(2):
            request = urllib.request.Request(url, method="HEAD", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as answer:
                    digest = answer.headers.get("Docker-Content-Digest", "")
                    break
            except urllib.error.HTTPError as exc:
                if exc.code != 401 or "Authorization" in headers:
                    raise
                headers["Authorization"] = f"Bearer {_bearer(exc.headers.get('WWW-Authenticate', ''), timeout)}"
        else:  # pragma: no cover - the loop always breaks or raises
            digest = ""
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise PinError(f"{host}: cannot resolve {path}:{tag} ({exc}); is the registry reachable?") from exc
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise PinError(f"{url}: no Docker-Content-Digest in the answer ({digest!r})")
    return digest


def repin(dockerfile: str, resolve: Callable[[str], str] = resolve_digest) -> str:
    """``dockerfile`` with every base image reference (a FROM line, or the ARG default a FROM names)
    pinned to the digest ``resolve`` gives for its tag. Other ARGs (versions, URLs) stay as they are."""
    images = {_DIGEST.sub("", ref) for ref in base_images(dockerfile)}

    def pin(match: re.Match[str]) -> str:
        tagged = _DIGEST.sub("", match["ref"])
        if tagged not in images:
            return match[0]
        return f"{match['lead']}{tagged}@{resolve(tagged)}{match['tail']}"

    return _IMAGE_LINE.sub(pin, dockerfile)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.pins", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("constraints", "dev-ceiling", "digests"))
    parser.add_argument("resolution", nargs="?", type=Path, help="dev-ceiling: the dev environment's resolution")
    parser.add_argument("--root", type=Path, default=REPO_ROOT)
    args = parser.parse_args(argv)
    try:
        if args.command == "constraints":
            sys.stdout.write(constraints(args.root))
            return 0
        if args.command == "dev-ceiling":
            if args.resolution is None:
                parser.error("dev-ceiling needs the resolution file")
            sys.stdout.write(dev_ceiling(args.resolution.read_text(), args.root))
            return 0
        for name in DOCKERFILES:
            path = args.root / name
            text = path.read_text()
            pinned = repin(text)
            if pinned != text:
                path.write_text(pinned)
            print(f"{name}: {', '.join(base_images(pinned))}")
    except PinError as exc:
        parser.exit(1, f"pins: error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
