"""The e2e node's offline images (tests/e2e/images.py): what each holds, and that the gpupack image is the Dockerfile's.

The small images and the Dockerfile reading run anywhere with gcc and busybox-static. The gpupack image needs
root, buildah and debootstrap (a few minutes cold, nothing when cached); without them its tests fail, as the
rest of the suite does (tests/e2e/conftest.py), and skip only when asked to: GPUPACK_E2E_ALLOW_SKIP=1 outside CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests.e2e import images

DOCKERFILE = images.REPO / "Dockerfile"


def layer_members(archive: Path) -> dict[str, tarfile.TarInfo]:
    """The entries of a one-layer archive's layer, by path."""
    _, manifest, _ = images.read_manifest(archive)
    (layer,) = manifest["layers"]
    with tarfile.open(archive) as outer:
        handle = outer.extractfile("blobs/sha256/" + layer["digest"].removeprefix("sha256:"))
        assert handle is not None
        with tarfile.open(fileobj=handle, mode="r|gz") as tar:
            return {member.name: member for member in tar}


# ------------------------------------------------------------------ reading the Dockerfile


def test_dockerfile_config_reads_the_last_stage(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE=x\nFROM ${BASE} AS build\nENV A=1\nUSER 5\nCOPY --from=other /x /y\nFROM ${BASE}\n"
        '# a comment\nENV B=2 \\\n    C="two words"\nENV D plain old form\nUSER 10001:10001\nEXPOSE 80 53/udp\n'
        'ENTRYPOINT ["prog"]\nCMD run --fast\nCOPY a b/ dest/\n'
    )
    assert images.dockerfile_config(dockerfile) == {
        "Env": {"B": "2", "C": "two words", "D": "plain old form"},
        "User": "10001:10001",
        "ExposedPorts": {"80/tcp": {}, "53/udp": {}},
        "Entrypoint": ["prog"],
        "Cmd": ["/bin/sh", "-c", "run --fast"],
    }
    assert images.copy_sources(dockerfile) == ["a", "b/"]


def test_the_gpupack_key_covers_every_file_the_dockerfile_copies() -> None:
    files = images.context_files(DOCKERFILE)
    for needed in ("pyproject.toml", "README.md", "manifests/examples/cluster.yaml", "extender/state.py"):
        assert needed in files
    for folder in ("gpupack", "scoring", "extender", "agent", "report", "bench"):
        assert any(name.startswith(folder + "/") for name in files), folder
    assert not [name for name in files if "__pycache__" in name or name.endswith(".pyc")]


def test_cached_reuses_and_rebuilds_on_a_new_key(tmp_path: Path) -> None:
    made: list[str] = []

    def make(key: str) -> Path:
        def write(out: Path) -> None:
            made.append(key)
            out.write_text(key)

        return images.cached(tmp_path, "thing-1.0", key, write)

    first = make("0" * 16)
    assert make("0" * 16) == first and made == ["0" * 16]
    second = make("1" * 16)
    assert made == ["0" * 16, "1" * 16] and second.read_text() == "1" * 16
    assert not first.exists(), "the archive of the old key is deleted"


# ------------------------------------------------------------------ the small images


def test_pause_is_a_static_entrypoint_that_stops_on_sigterm(tmp_path: Path) -> None:
    archive = images.build_pause(tmp_path)
    name, _, config = images.read_manifest(archive)
    assert name == images.PAUSE_REF and config["config"]["Entrypoint"] == ["/pause"]
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    root = tmp_path / "root"
    images.unpack_rootfs(archive, root)
    assert images.is_static_elf(root / "pause")
    proc = subprocess.Popen([root / "pause"], stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    assert proc.poll() is None, "pause exited by itself"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0


def test_busybox_has_the_applets_the_pods_use(tmp_path: Path) -> None:
    archive = images.build_busybox(tmp_path)
    name, _, config = images.read_manifest(archive)
    assert name == images.BUSYBOX_REF
    assert config["config"]["Cmd"] == ["sh"] and "Entrypoint" not in config["config"]
    members = layer_members(archive)
    for applet in ("sh", "env", "cat", "sleep", "ls", "echo", "grep", "test", "printenv"):
        assert f"bin/{applet}" in members, applet
    assert members["tmp"].mode == 0o1777


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_busybox_runs_in_a_chroot(tmp_path: Path) -> None:
    archive = images.build_busybox(tmp_path)
    root = tmp_path / "root"
    images.unpack_rootfs(archive, root)
    script = "echo hi | grep -q hi && test -d /tmp && sleep 0 && ls / | grep -q tmp && printenv GREETING"
    chroot: list[str | Path] = [shutil.which("chroot") or "chroot", "--userspec=1234:1234", root]
    done = subprocess.run([*chroot, "sh", "-c", script], env={"GREETING": "hello"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "hello"


def test_kube_scheduler_is_on_path_for_any_user(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "kube-scheduler"
    binary.parent.mkdir()
    shutil.copy(images.busybox_binary(), binary)  # any static binary stands in
    archive = images.build_kube_scheduler(tmp_path, binary.parent, "v1.2.3")
    name, _, config = images.read_manifest(archive)
    assert name == "localhost/kube-scheduler:v1.2.3" and "Entrypoint" not in config["config"]
    assert "PATH=/usr/local/bin:/usr/bin:/bin" in config["config"]["Env"]
    member = layer_members(archive)["usr/local/bin/kube-scheduler"]
    assert (member.uid, member.gid, member.mode) == (0, 0, 0o755)
    assert images.build_kube_scheduler(tmp_path, binary, "v1.2.3") == archive, "an unchanged binary is reused"


# ------------------------------------------------------------------ the gpupack image


@pytest.fixture(scope="module")
def gpupack_archive() -> Path:
    """The gpupack image, built from the Dockerfile (or reused from the cache)."""
    try:
        if os.geteuid() != 0:
            raise images.BuildError("building the gpupack image needs root (debootstrap, buildah)")
        return images.build_gpupack(images.cache_dir())
    except images.BuildError as exc:
        if os.environ.get("GPUPACK_E2E_ALLOW_SKIP") == "1" and os.environ.get("CI") != "true":
            pytest.skip(f"GPUPACK_E2E_ALLOW_SKIP=1 and no gpupack image: {exc}")
        pytest.fail(f"the gpupack image did not build: {exc}", pytrace=False)


@pytest.mark.slow
def test_gpupack_image_config_is_the_dockerfiles(gpupack_archive: Path) -> None:
    name, _, image = images.read_manifest(gpupack_archive)
    assert name == f"localhost/gpupack:{images.project_version()}"
    config, wanted = image["config"], images.dockerfile_config(DOCKERFILE)
    for key in ("User", "Entrypoint", "Cmd", "ExposedPorts"):
        assert config.get(key) == wanted.get(key), key
    assert config.get("WorkingDir", "") == wanted.get("WorkingDir", "")
    env = dict(item.split("=", 1) for item in config["Env"])
    assert {key: env.get(key) for key in wanted["Env"]} == wanted["Env"]
    assert env["PATH"].split(":")[0] == "/usr/local/bin", "python and gpupack come from /usr/local/bin"
    assert image["os"] == "linux" and image["architecture"] == "amd64"


@pytest.mark.slow
def test_gpupack_image_runs_as_its_user(gpupack_archive: Path) -> None:
    if shutil.which("chroot") is None:
        pytest.skip("no chroot")
    output = images.check_gpupack(gpupack_archive)
    assert "usage: gpupack" in output
    assert "uid 10001," in output and "compiled kernels in /opt/gpupack/numba-cache" in output
