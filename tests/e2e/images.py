"""Offline container images for the e2e suite's real node (kubelet + containerd), built from this repository.

Nothing can be pulled from a container registry on these machines, so every image a test node runs is made
here and handed to containerd as an OCI image archive (`oci-layout`, `index.json`, `blobs/sha256/...` in
one tar) that `ctr -n k8s.io images import` takes. Each image is named `localhost/...`: a pull that slips
through could only go to loopback.

The images:

`localhost/pause:3.10`
    The pod sandbox. `pause.c` beside this file (sleep until SIGTERM/SIGINT, reap re-parented children),
    compiled with `gcc -static -Os`: one static binary at /pause, entrypoint ["/pause"]. Our own source,
    because the upstream pause image lives in a registry.
`localhost/busybox:e2e`
    The test pods' image: Debian's busybox-static as /bin/busybox and a symlink per applet (in /bin and
    where busybox places it, e.g. /usr/bin/env), cmd ["sh"], no entrypoint. A static binary needs no
    libraries, so one file and its links make a working userland of ~2 MB.
`localhost/kube-scheduler:<version>`
    The scheduler of the Deployment in manifests/: the kube-scheduler the suite builds (a static Go
    binary) at /usr/local/bin/kube-scheduler, root-owned and world-executable so any uid runs it, on
    PATH=/usr/local/bin:/usr/bin:/bin for `command: [kube-scheduler]`; no entrypoint.
`localhost/gpupack:<tag>` (default tag: the version in pyproject.toml)
    The image the Dockerfile defines, built from the Dockerfile itself by `buildah bud` (Debian's buildah,
    `--isolation chroot`, its storage under the cache folder). The Dockerfile's base, python:3.11-slim,
    lives in a registry; its `ARG BASE` takes `localhost/python-base:<key>` instead: Debian bookworm
    (`debootstrap --variant=minbase`) with Debian's python3.11 and a venv at /usr/local made from it, so
    `python`, `pip` are /usr/local/bin/python, pip, as in python:3.11-slim, and pip may install there
    (no PEP 668 refusal: it is a venv). Every other line of the Dockerfile runs unchanged: pip wheel,
    pip install, compileall, the numba warm-up into the seed cache, USER/ENTRYPOINT/CMD/ENV.
    The base stays in buildah's storage under a key of its recipe and is made once.
    pip in the build reaches PyPI through the host's network; on machines whose egress re-signs TLS,
    the host's CA bundle is bind-mounted (read-only, during RUN only, nothing left in the image) over the
    bundle the base's pip reads, so pip trusts what the host trusts.

Caching: archives go to $GPUPACK_IMAGE_CACHE (default ~/.cache/gpupack/images), outside the clone, named
`<name>-<key>.tar` where key is a hash of the image's inputs (pause.c; the busybox binary; the
kube-scheduler binary; for gpupack the Dockerfile, every file its COPY lines take, and the base's key).
An archive whose key matches is reused; a changed input gives a new key, a rebuild, and the old archive
of that name is deleted. Builds take a lock on the cache folder, so two runs never build one image twice.

    python -m tests.e2e.images [--kube-scheduler PATH --kube-version V] [--only NAME ...] [--check]
        [--import CONTAINERD_ADDRESS]

Needs root (debootstrap, buildah, chroot), gcc with static libc, and the Debian packages busybox-static,
buildah, debootstrap (installed with apt-get when missing and running as root, as in CI).

Time on the 2-core machine (measured while a Go build shared it): pause, busybox < 1 s; kube-scheduler
~5-8 s (hashing and gzipping 80 MB); gpupack cold ~5.5 min = base ~100 s (debootstrap, apt) + build ~3 min
(pip wheel ~30 s, pip install + compileall ~30 s, numba warm-up ~65 s, commit + push ~40 s); with the
base kept, ~3 min; unchanged inputs: reused in ~0.1 s. `ctr images import`: ~20 s for gpupack, < 2 s
for the others.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RECIPES = 1  # raise to rebuild every image after a change of this module's recipes
PAUSE_REF = "localhost/pause:3.10"
BUSYBOX_REF = "localhost/busybox:e2e"
BASE_NAME = "localhost/python-base"
PLATFORM = {"architecture": "amd64", "os": "linux"}
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_MIRROR = os.environ.get("GPUPACK_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3.11-venv", "ca-certificates")
# where the base's pip reads its CA bundle (Debian's pip: the system's; BASE_SETUP checks), the host's goes over it
BASE_PIP_CA = "/etc/ssl/certs/ca-certificates.crt"
# run in the debootstrapped root (buildah run): the venv at /usr/local is python:3.11-slim's layout
BASE_SETUP = f"""set -eu
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {" ".join(BASE_PACKAGES)}
python3.11 -m venv /usr/local
/usr/local/bin/python -c 'import sys, sysconfig; assert sys.prefix == "/usr/local", sys.prefix
print(sysconfig.get_paths()["purelib"])'
/usr/local/bin/pip --version
/usr/local/bin/python -c 'from pip._vendor import certifi; assert certifi.where() == "{BASE_PIP_CA}", certifi.where()'
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /usr/share/doc/* /usr/share/man/*
echo localhost > /etc/hostname; printf '127.0.0.1 localhost\\n' > /etc/hosts; : > /etc/resolv.conf
"""
BASE_CONFIG = (
    "--env",
    PATH_ENV.replace("/usr/local/sbin:/usr/local/bin", "/usr/local/bin:/usr/local/sbin"),
    "--env",
    "LANG=C.UTF-8",
    "--cmd",
    '["python3"]',
)
HOST_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


class BuildError(RuntimeError):
    """A build step failed; the message names the command and ends with the tail of its output."""


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"images: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ cache, keys, commands, tools


def cache_dir() -> Path:
    """$GPUPACK_IMAGE_CACHE or ~/.cache/gpupack/images, created; never inside the clone."""
    folder = Path(os.environ.get("GPUPACK_IMAGE_CACHE") or Path.home() / ".cache/gpupack/images").resolve()
    if folder == REPO or REPO in folder.parents:
        raise ValueError(f"the image cache {folder} must be outside the clone {REPO}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def digest(*parts: bytes | str | int) -> str:
    """A 16-hex-digit key of the parts (each length-prefixed, so no two sequences collide)."""
    sha = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        sha.update(len(data).to_bytes(8, "big") + data)
    return sha.hexdigest()[:16]


def file_sha(path: Path) -> str:
    """sha256 of a file's content."""
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def run(cmd: Sequence[str | os.PathLike[str]], logfile: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run cmd and return its stdout; with logfile, its output goes there instead. BuildError on failure."""
    args = [os.fspath(part) for part in cmd]
    if logfile is not None:
        run_logged(args, logfile, env)
        return ""
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
        raise BuildError(f"{shlex.join(args)} exited {proc.returncode}:\n" + "\n".join(tail))
    return proc.stdout


def run_logged(args: list[str], logfile: Path, env: dict[str, str] | None) -> None:
    """Run args with each line of its output appended to logfile after the seconds since the start."""
    started = time.monotonic()
    with logfile.open("a") as fh:
        fh.write(f"$ {shlex.join(args)}\n")
        with subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace"
        ) as proc:
            for line in proc.stdout or ():
                fh.write(f"{time.monotonic() - started:7.1f}s {line}")
        fh.write(f"{time.monotonic() - started:7.1f}s (exit {proc.returncode})\n")
    if proc.returncode:
        tail = logfile.read_text(errors="replace").splitlines()[-40:]
        raise BuildError(f"{shlex.join(args)} exited {proc.returncode} (log: {logfile}):\n" + "\n".join(tail))


def apt_install(package: str, why: str) -> None:
    """`apt-get install -y package` (again after `apt-get update` if that fails); only as root, else BuildError."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BuildError(f"{why}: install the Debian package {package} (apt-get install -y {package})")
    log(f"installing the Debian package {package} ({why})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "install", "-y", "-q", package], env=env)
    except BuildError:
        run(["apt-get", "update", "-q"], env=env)
        run(["apt-get", "install", "-y", "-q", package], env=env)


def require(program: str, package: str) -> str:
    """The path of program, after installing the Debian package that has it when it is missing (as root)."""
    if not shutil.which(program):
        apt_install(package, f"{program} is missing")
    found = shutil.which(program)
    if not found:
        raise BuildError(f"the Debian package {package} did not bring {program}")
    return found


def is_static_elf(path: Path) -> bool:
    """Whether path is a 64-bit little-endian ELF file without a program interpreter (statically linked)."""
    with path.open("rb") as fh:
        head = fh.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            return False
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    kinds = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)]
    return 3 not in kinds  # PT_INTERP


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """Hold the cache folder's lock (one build at a time across processes)."""
    with (cache / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached(cache: Path, stem: str, key: str, make: Callable[[Path], None]) -> Path:
    """cache/stem-key.tar, made by make(temporary path) unless it is there; older keys of stem are deleted."""
    out = cache / f"{stem}-{key}.tar"
    with locked(cache):
        if out.is_file():
            log(f"{out.name}: reused")
            return out
        started = time.monotonic()
        partial = out.with_name(out.name + ".partial")
        try:
            make(partial)
            partial.replace(out)
        finally:
            partial.unlink(missing_ok=True)
        log(f"{out.name}: built in {time.monotonic() - started:.1f} s")
        for old in cache.glob(f"{stem}-*.tar"):
            if old != out and re.fullmatch(re.escape(stem) + r"-[0-9a-f]{16}\.tar", old.name):
                old.unlink()
    return out


# ------------------------------------------------------------------ OCI archives


class Layer:
    """A layer tar being written in memory: root-owned entries, mtime 0, parent folders made on demand."""

    def __init__(self) -> None:
        self._raw = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._raw, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (close())
        self._dirs: set[str] = set()

    def _entry(self, path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        path = path.strip("/")
        if "/" in path:
            self.dir(path.rsplit("/", 1)[0])
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
        info.uname = info.gname = "root"
        return info

    def dir(self, path: str, mode: int = 0o755) -> None:
        """A folder (and its parents)."""
        if path.strip("/") not in self._dirs:
            info = self._entry(path, tarfile.DIRTYPE, mode)
            self._dirs.add(info.name)
            self._tar.addfile(info)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """A regular file with this content."""
        info = self._entry(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def symlink(self, path: str, target: str) -> None:
        """A symbolic link path -> target."""
        info = self._entry(path, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)

    def close(self) -> bytes:
        """The finished, uncompressed layer tar."""
        self._tar.close()
        return self._raw.getvalue()


def base_layer() -> Layer:
    """A layer with the folders every container expects, /tmp world-writable, and root/nobody accounts."""
    layer = Layer()
    for folder in ("dev", "proc", "sys", "etc", "root", "var", "usr/bin", "bin"):
        layer.dir(folder)
    layer.dir("tmp", 0o1777)
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    return layer


def blob(data: bytes | dict[str, Any]) -> tuple[bytes, str]:
    """The bytes of a blob (a dict as compact JSON) and its sha256 digest."""
    raw = data if isinstance(data, bytes) else json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return raw, "sha256:" + hashlib.sha256(raw).hexdigest()


def write_oci_archive(out: Path, ref: str, layer: bytes, config: dict[str, Any]) -> None:
    """A one-layer OCI image archive at out, named ref (the annotations `ctr images import` reads)."""
    layer_gz, layer_digest = blob(gzip.compress(layer, compresslevel=6, mtime=0))
    image = {
        **PLATFORM,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [blob(layer)[1]]},
        "created": "1970-01-01T00:00:00Z",
        "history": [{"created_by": "tests/e2e/images.py"}],
    }
    config_raw, config_digest = blob(image)
    manifest_raw, manifest_digest = blob(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_raw),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": len(layer_gz),
                }
            ],
        }
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_raw),
                "platform": PLATFORM,
                "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref},
            }
        ],
    }
    members = {"oci-layout": blob({"imageLayoutVersion": "1.0.0"})[0], "index.json": blob(index)[0]}
    for raw, dig in ((layer_gz, layer_digest), (config_raw, config_digest), (manifest_raw, manifest_digest)):
        members["blobs/sha256/" + dig.removeprefix("sha256:")] = raw
    with tarfile.open(out, "w") as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(raw), 0o644, 0
            tar.addfile(info, io.BytesIO(raw))


def read_manifest(archive: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """An archive's (single) image: its name, its manifest and its image config (`config` holds User, Env...)."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> Any:
            handle = tar.extractfile(name)
            if handle is None:
                raise BuildError(f"{archive}: no {name}")
            return json.load(handle)

        entry = member("index.json")["manifests"][0]
        annotations = entry.get("annotations", {})
        name = annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name", "")
        manifest = member("blobs/sha256/" + entry["digest"].removeprefix("sha256:"))
        config = member("blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
    return name, manifest, config


def image_config(archive: Path) -> dict[str, Any]:
    """The `config` part of an archive's image config: User, Entrypoint, Cmd, Env, WorkingDir..."""
    config: dict[str, Any] = read_manifest(archive)[2].get("config", {})
    return config


def unpack_rootfs(archive: Path, dest: Path) -> None:
    """Apply an archive's layers in order into dest (as root: owners and modes kept), OCI whiteouts honoured."""
    _, manifest, _ = read_manifest(archive)
    with tarfile.open(archive) as outer:
        for layer in manifest["layers"]:
            handle = outer.extractfile("blobs/sha256/" + layer["digest"].removeprefix("sha256:"))
            if handle is None:
                raise BuildError(f"{archive}: layer {layer['digest']} missing")
            with tarfile.open(fileobj=handle, mode="r|*") as tar:
                for member in tar:
                    apply_member(tar, member, dest)


def apply_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """One layer entry: a whiteout deletes from the layers below, anything else is extracted over them."""
    folder, _, base = member.name.strip("/").rpartition("/")
    if base == ".wh..wh..opq":
        for child in (dest / folder).iterdir():
            remove(child)
    elif base.startswith(".wh."):
        remove(dest / folder / base.removeprefix(".wh."))
    else:
        target = dest / member.name
        if target.is_symlink() or (target.exists() and not (member.isdir() and target.is_dir())):
            remove(target)
        tar.extract(member, dest, numeric_owner=True, filter="fully_trusted")


def remove(path: Path) -> None:
    """Delete a file, link or folder tree if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------ the small images


def build_pause(cache: Path) -> Path:
    """localhost/pause:3.10: pause.c compiled with `gcc -static -Os`, the only file, entrypoint /pause."""
    source = HERE / "pause.c"
    gcc = require("gcc", "gcc")
    key = digest(RECIPES, source.read_bytes(), run([gcc, "--version"]).splitlines()[0])

    def make(out: Path) -> None:
        with tempfile.TemporaryDirectory(dir=cache) as work:
            binary = Path(work) / "pause"
            run([gcc, "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o", binary, source])
            layer = Layer()
            for folder in ("dev", "proc", "sys", "etc"):
                layer.dir(folder)
            layer.file("pause", binary.read_bytes(), 0o755)
            write_oci_archive(out, PAUSE_REF, layer.close(), {"Entrypoint": ["/pause"], "Env": [PATH_ENV]})

    return cached(cache, "pause", key, make)


def busybox_binary() -> Path:
    """Debian busybox-static's /bin/busybox (the package is installed when missing and running as root)."""
    binary = Path("/bin/busybox")
    if not (binary.is_file() and is_static_elf(binary)):
        apt_install("busybox-static", "a static /bin/busybox is missing")
    if not is_static_elf(binary):
        raise BuildError(f"{binary} is not statically linked: install the Debian package busybox-static")
    return binary


# Debian's busybox (1.35) has no printenv applet; the tests' pods print their variables with it
PRINTENV = rb"""#!/bin/sh
# printenv [NAME...]: each variable's value (all of them without a name); exit 1 if one is unset
[ $# -eq 0 ] && exec env
status=0
for name in "$@"; do
    case $name in ''|[!A-Za-z_]*|*[!A-Za-z0-9_]*) status=1; continue ;; esac
    eval "isset=\${$name+set} value=\${$name-}"
    if [ "$isset" = set ]; then printf '%s\n' "$value"; else status=1; fi
done
exit $status
"""


def build_busybox(cache: Path) -> Path:
    """localhost/busybox:e2e: static busybox as /bin/busybox, each applet linked in /bin and its usual place."""
    binary = busybox_binary()
    applets = run([binary, "--list-full"]).split()
    key = digest(RECIPES, file_sha(binary), PRINTENV, *applets)

    def make(out: Path) -> None:
        layer = base_layer()
        layer.file("bin/busybox", binary.read_bytes(), 0o755)
        places = {place for applet in applets for place in (applet, "bin/" + applet.rsplit("/", 1)[-1])}
        for place in sorted(places - {"bin/busybox"}):
            layer.symlink(place, "/bin/busybox")
        if "bin/printenv" not in places:
            layer.file("bin/printenv", PRINTENV, 0o755)
            layer.symlink("usr/bin/printenv", "/bin/printenv")
        write_oci_archive(out, BUSYBOX_REF, layer.close(), {"Env": [PATH_ENV], "Cmd": ["sh"]})

    return cached(cache, "busybox", key, make)


def build_kube_scheduler(cache: Path, binary: Path, version: str) -> Path:
    """localhost/kube-scheduler:VERSION with binary (a file, or a folder holding kube-scheduler) on PATH."""
    if binary.is_dir():
        binary = binary / "kube-scheduler"
    if not binary.is_file():
        raise BuildError(f"no kube-scheduler binary at {binary}")
    if not is_static_elf(binary):
        raise BuildError(f"{binary} is not a static binary (build it with CGO_ENABLED=0)")
    ref = f"localhost/kube-scheduler:{version}"

    def make(out: Path) -> None:
        layer = base_layer()
        layer.file("usr/local/bin/kube-scheduler", binary.read_bytes(), 0o755)
        config = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["kube-scheduler"]}
        write_oci_archive(out, ref, layer.close(), config)

    return cached(cache, f"kube-scheduler-{version}", digest(RECIPES, version, file_sha(binary)), make)


# ------------------------------------------------------------------ the Dockerfile


def dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments): continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def exec_form(arguments: str) -> list[str]:
    """ENTRYPOINT/CMD arguments as the image config holds them (the shell form runs under /bin/sh -c)."""
    if arguments.startswith("["):
        words: list[str] = json.loads(arguments)
        return words
    return ["/bin/sh", "-c", arguments]


def parse_env(arguments: str) -> dict[str, str]:
    """An ENV line's variables: `K=V K2="V 2"`, or the old `K value` form."""
    words = shlex.split(arguments)
    if words and "=" not in words[0]:
        return {words[0]: arguments.split(None, 1)[1] if len(words) > 1 else ""}
    return dict(word.split("=", 1) for word in words)


def dockerfile_config(dockerfile: Path) -> dict[str, Any]:
    """What the last stage sets in the image config: User, Entrypoint, Cmd, WorkingDir, ExposedPorts, Env (a dict)."""
    config: dict[str, Any] = {"Env": {}}
    for keyword, arguments in dockerfile_instructions(dockerfile):
        if keyword == "FROM":
            config = {"Env": {}}
        elif keyword == "ENV":
            config["Env"].update(parse_env(arguments))
        elif keyword in ("ENTRYPOINT", "CMD"):
            config[keyword.title()] = exec_form(arguments)
        elif keyword in ("USER", "WORKDIR"):
            config["User" if keyword == "USER" else "WorkingDir"] = arguments
        elif keyword == "EXPOSE":
            ports: dict[str, dict[str, Any]] = config.setdefault("ExposedPorts", {})
            ports.update({port if "/" in port else f"{port}/tcp": {} for port in arguments.split()})
    return config


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths (glob patterns) read by the Dockerfile's COPY/ADD lines, not those from a stage."""
    sources: list[str] = []
    for keyword, arguments in dockerfile_instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        flags = re.findall(r"--\S+", arguments)
        if any(flag.startswith("--from") for flag in flags):
            continue
        rest = re.sub(r"--\S+\s*", "", arguments).strip()
        words: list[str] = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        sources += words[:-1]
    return sources


def context_files(dockerfile: Path) -> list[str]:
    """Every file the Dockerfile copies from its folder, relative and sorted (__pycache__ and *.pyc left out)."""
    root = dockerfile.parent
    found: set[str] = set()
    for pattern in copy_sources(dockerfile):
        source = pattern.strip("/")
        for match in [root] if source in ("", ".") else root.glob(source):
            for path in match.rglob("*") if match.is_dir() else [match]:
                relative = path.relative_to(root)
                if path.is_file() and "__pycache__" not in relative.parts and path.suffix not in (".pyc", ".pyo"):
                    found.add(relative.as_posix())
    return sorted(found)


def project_version() -> str:
    """The version in pyproject.toml (the gpupack image's default tag)."""
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


# ------------------------------------------------------------------ the gpupack image (buildah)


@dataclass
class Buildah:
    """buildah on the cache's own storage (driver overlay, or $GPUPACK_BUILDAH_DRIVER) and a run root of its own."""

    storage: Path
    runroot: Path
    logfile: Path

    def command(self, *args: str | os.PathLike[str]) -> list[str | os.PathLike[str]]:
        """The buildah command line for args."""
        driver = os.environ.get("GPUPACK_BUILDAH_DRIVER", "overlay")
        return ["buildah", "--root", self.storage, "--runroot", self.runroot, "--storage-driver", driver, *args]

    def __call__(self, *args: str | os.PathLike[str]) -> None:
        """Run a buildah command, its output to the log."""
        run(self.command(*args), self.logfile)

    def output(self, *args: str | os.PathLike[str]) -> str:
        """Run a buildah command and return its stdout, stripped."""
        return run(self.command(*args)).strip()

    def has_image(self, ref: str) -> bool:
        """Whether the storage holds the image ref."""
        return subprocess.run(self.command("inspect", "--type", "image", ref), capture_output=True).returncode == 0


@contextlib.contextmanager
def buildah_session(cache: Path, logfile: Path) -> Iterator[Buildah]:
    """A Buildah on cache/buildah; on the way out its working containers are removed and its run root too."""
    require("buildah", "buildah")
    logfile.parent.mkdir(exist_ok=True)
    logfile.write_text("")
    runroot = Path(tempfile.mkdtemp(prefix="gpupack-buildah-run-"))
    buildah = Buildah(cache / "buildah", runroot, logfile)
    try:
        yield buildah
    finally:
        with contextlib.suppress(BuildError):
            buildah("rm", "--all")
        shutil.rmtree(runroot, ignore_errors=True)


def base_key() -> str:
    """The key of the base image's recipe (a changed recipe makes a new base)."""
    return digest(RECIPES, BASE_SUITE, *BASE_PACKAGES, BASE_SETUP, *BASE_CONFIG)


def ensure_base(buildah: Buildah) -> str:
    """localhost/python-base:<key> in buildah's storage: Debian minbase + python3.11 venv at /usr/local."""
    ref = f"{BASE_NAME}:{base_key()}"
    if buildah.has_image(ref):
        return ref
    debootstrap = require("debootstrap", "debootstrap")
    started = time.monotonic()
    container = buildah.output("from", "scratch")
    root = buildah.output("mount", container)
    run([debootstrap, "--variant=minbase", BASE_SUITE, root, DEBIAN_MIRROR], buildah.logfile)
    buildah("run", "--isolation", "chroot", container, "--", "/bin/sh", "-c", BASE_SETUP)
    buildah("config", *BASE_CONFIG, container)
    buildah("commit", "--rm", container, ref)
    for old in buildah.output("images", "--format", "{{.Name}}:{{.Tag}}").split():
        if old.startswith(BASE_NAME + ":") and old != ref:
            buildah("rmi", old)
    log(f"{ref}: made in {time.monotonic() - started:.1f} s")
    return ref


def ca_volume() -> list[str]:
    """`--volume` that shows pip in the build the host's CA bundle where the base's pip reads its own."""
    for bundle in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), *HOST_CA_BUNDLES):
        if bundle and Path(bundle).is_file():
            return ["--volume", f"{Path(bundle).resolve()}:{BASE_PIP_CA}:ro"]
    return []


def gpupack_inputs() -> tuple[list[str], str]:
    """The context files the Dockerfile copies, and the key of them, the Dockerfile and the base's recipe."""
    dockerfile = REPO / "Dockerfile"
    files = context_files(dockerfile)
    stamps = [f"{name}:{(REPO / name).stat().st_mode & 0o111:o}:{file_sha(REPO / name)}" for name in files]
    return files, digest(RECIPES, base_key(), dockerfile.read_bytes(), *stamps)


def build_gpupack(cache: Path, tag: str | None = None) -> Path:
    """localhost/gpupack:TAG, built from the Dockerfile by buildah on the local base (see the module docstring)."""
    tag = tag or project_version()
    ref = f"localhost/gpupack:{tag}"
    files, key = gpupack_inputs()

    def make(out: Path) -> None:
        with buildah_session(cache, cache / "logs" / f"gpupack-{tag}.log") as buildah:
            base = ensure_base(buildah)
            with tempfile.TemporaryDirectory(dir=cache) as work:
                context = Path(work)
                for name in ["Dockerfile", *files]:
                    (context / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / name, context / name)
                buildah(
                    "bud",
                    "--isolation",
                    "chroot",
                    "--pull=never",
                    "--build-arg",
                    f"BASE={base}",
                    *ca_volume(),
                    "-f",
                    context / "Dockerfile",
                    "-t",
                    ref,
                    context,
                )
            buildah("push", ref, f"oci-archive:{out}:{ref}")
            buildah("rmi", ref)

    return cached(cache, f"gpupack-{tag}", key, make)


CHECK_SCRIPT = """
import importlib.util, os, sys
import gpupack.extender.state as state
seed = os.environ["GPUPACK_NUMBA_CACHE_SEED"]
kernels = [name for _, _, names in os.walk(seed) for name in names if name.endswith(".nbc")]
assert kernels, f"the numba seed cache {seed} holds no compiled kernel"
assert os.path.isfile(importlib.util.cache_from_source(state.__file__)), "site-packages is not byte-compiled"
assert not os.access(os.path.dirname(state.__file__), os.W_OK), "site-packages is writable by the image's user"
print(f"uid {os.getuid()}, python {sys.version.split()[0]}, {len(kernels)} compiled kernels in {seed}")
"""


def check_gpupack(archive: Path, cache: Path | None = None) -> str:
    """Unpack the image and run it as its user in a chroot: the entrypoint's --help, then CHECK_SCRIPT.

    Returns both outputs; a BuildError says what failed.
    """
    config = image_config(archive)
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    with tempfile.TemporaryDirectory(dir=cache or cache_dir()) as work:
        root = Path(work)
        root.chmod(0o755)  # a temporary folder is 0700: the image's user could not reach its own /
        unpack_rootfs(archive, root)
        chroot = [require("chroot", "coreutils"), f"--userspec={config.get('User') or '0:0'}", "--groups=", str(root)]
        help_text = run([*chroot, *config["Entrypoint"], "--help"], env=env)
        checked = run([*chroot, "python", "-c", CHECK_SCRIPT], env=env)
    return help_text + checked


# ------------------------------------------------------------------ all of them, and containerd


def build_all(kube_scheduler_bin: Path, version: str) -> dict[str, Path]:
    """Every image of the e2e node, built or reused: image name -> OCI archive."""
    cache = cache_dir()
    return {
        PAUSE_REF: build_pause(cache),
        BUSYBOX_REF: build_busybox(cache),
        f"localhost/kube-scheduler:{version}": build_kube_scheduler(cache, kube_scheduler_bin, version),
        f"localhost/gpupack:{project_version()}": build_gpupack(cache),
    }


def import_images(ctr_address: str, archives: Iterable[Path]) -> list[str]:
    """Import OCI archives into containerd's k8s.io namespace (the kubelet's) and return the image names.

    Each archive names its image by annotation (io.containerd.image.name); ctr 1.6 keeps a full name as
    it is. `--all-platforms` imports an index whose entry names no platform, too.
    """
    ctr = [require("ctr", "containerd"), "--address", ctr_address, "-n", "k8s.io"]
    archives = list(archives)
    for archive in archives:
        run([*ctr, "images", "import", "--all-platforms", archive])
    listed = set(run([*ctr, "images", "ls", "-q"]).split())
    names = [read_manifest(archive)[0] for archive in archives]
    missing = [name for name in names if name not in listed]
    if missing:
        raise BuildError(f"containerd at {ctr_address} lacks {missing} after the import")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.images", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=["pause", "busybox", "kube-scheduler", "gpupack"],
        help="build only these (repeatable); default: all, kube-scheduler only with --kube-scheduler",
    )
    parser.add_argument("--kube-scheduler", type=Path, help="a static kube-scheduler binary, or its folder")
    parser.add_argument("--kube-version", help="the kube-scheduler image's tag (default: its folder's name)")
    parser.add_argument("--tag", help="the gpupack image's tag (default: the version in pyproject.toml)")
    parser.add_argument("--check", action="store_true", help="run the gpupack image's checks in a chroot")
    parser.add_argument(
        "--import",
        dest="address",
        metavar="CONTAINERD_ADDRESS",
        help="then import the archives into this containerd's k8s.io namespace",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or reuse) the images asked for and print one line per image: name, seconds, archive."""
    args = parse_args(argv)
    cache = cache_dir()
    wanted = args.only or ["pause", "busybox", "gpupack"] + (["kube-scheduler"] if args.kube_scheduler else [])
    builders: dict[str, Callable[[], Path]] = {
        "pause": lambda: build_pause(cache),
        "busybox": lambda: build_busybox(cache),
        "kube-scheduler": lambda: build_kube_scheduler(cache, kube_binary(args), kube_version(args)),
        "gpupack": lambda: build_gpupack(cache, args.tag),
    }
    archives: list[Path] = []
    for name in wanted:
        started = time.monotonic()
        archives.append(builders[name]())
        print(f"{read_manifest(archives[-1])[0]}\t{time.monotonic() - started:.1f} s\t{archives[-1]}")
        if name == "gpupack" and args.check:
            print(check_gpupack(archives[-1], cache).rstrip())
    if args.address:
        print("imported:", " ".join(import_images(args.address, archives)))
    return 0


def kube_binary(args: argparse.Namespace) -> Path:
    """--kube-scheduler, required when the kube-scheduler image is asked for."""
    if args.kube_scheduler is None:
        raise SystemExit("the kube-scheduler image needs --kube-scheduler PATH")
    binary: Path = args.kube_scheduler
    return binary


def kube_version(args: argparse.Namespace) -> str:
    """--kube-version, or the name of the binary's folder (build-kube.sh's cache: .../kube/v1.37.2/)."""
    if args.kube_version:
        version: str = args.kube_version
        return version
    folder = kube_binary(args)
    return (folder if folder.is_dir() else folder.parent).resolve().name


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BuildError as exc:
        sys.exit(f"images: {exc}")
