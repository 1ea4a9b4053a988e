"""A real Kubernetes node on 127.0.0.1: containerd + runc + the upstream kubelet (issue #24).

`RealNode` joins a real kubelet to the API server of a `ControlPlane`. containerd runs with its own
configuration, root, state folder and socket under the node's work folder; the kubelet keeps its fixed
root `/var/lib/kubelet` (device plugins and the podresources API live there) and registers as node
`127.0.0.1`. What these machines need and why (`../shared/node/README.md` from the clone has the facts):

* containerd clamps `oom_score_adj` (`restrict_oom_score_adj`): root here lacks `CAP_SYS_RESOURCE`.
* The node is named `127.0.0.1` (`--hostname-override`), so the API server reaches the kubelet's API
  (logs) on loopback; the kubelet authenticates as `system:node:127.0.0.1` in `system:nodes`.
* The kubelet runs in its own mount namespace where the `/proc/sys` files it wants to change read back
  the values it wants, so the host's sysctls stay untouched; `/var/lib/kubelet` is made a shared mount
  first so the kubelet's volume mounts still reach containerd.
* No host iptables chains, eviction and image GC off, swap allowed, cgroupfs on cgroup v1.
* The pod network is a loopback-only CNI list: pods use `hostNetwork: true` (`host_pod_body`).
* Images are offline OCI archives (`import_images`); the sandbox image is `localhost/pause:3.10`.

Nothing here depends on pytest. `stop()` undoes whatever `start()` reached (processes, pods, the Node,
mounts, cgroups, the folders it made) and is registered with atexit.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpupack.errors import GpupackError
from gpupack.harness.certificates import issue_certificate
from gpupack.harness.controlplane import (
    NOT_READY_TAINT,
    ControlPlane,
    ControlPlaneError,
    Process,
    http_status,
    wait_until,
)
from tests.e2e import images as image_builds

NODE_NAME = "127.0.0.1"
HOST = "127.0.0.1"
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
POD_RESOURCES_SOCKET = KUBELET_ROOT / "pod-resources" / "kubelet.sock"
# The kubelet links every container's log here; the path is fixed in the kubelet.
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# containerd 1.6 puts its shims' sockets under /run/containerd/s whatever its own state folder is (and
# other containerds on the machine do too): stop() removes only empty folders there, if it was not there.
SHIM_SOCKET_ROOT = Path("/run/containerd")
SANDBOX_IMAGE = "localhost/pause:3.10"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
CNI_BIN_DIR = Path("/usr/lib/cni")
NODE_LEASES = "kube-node-lease"  # the namespace of the kubelets' heartbeat Leases
CLUSTER_ROLE_BINDING = "gpupack-e2e-system-nodes"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the kubelet's container manager writes to /proc/sys at start (component-helpers' sysctl names).
KERNEL_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
PROGRAMS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "unshare", "mount", "umount", "openssl")
APT_PACKAGES = "containerd runc containernetworking-plugins util-linux mount openssl"
EVICTION_SIGNALS = ("memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available")
API_TIMEOUT = 10  # seconds, for each API call made while stopping


class RealNodeError(GpupackError, RuntimeError):
    """The real node could not be set up, or did not reach the wanted state in time."""


# ============================================================ small helpers
def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.25) -> None:
    """Call `check` until it is true; RealNodeError naming `what` after `timeout` seconds."""
    try:
        wait_until(what, check, timeout, interval)
    except ControlPlaneError as exc:
        raise RealNodeError(str(exc)) from None


def run(argv: Sequence[str], timeout: float = 120) -> str:
    """Run a program to its end; its stdout, or RealNodeError with its output when it fails."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RealNodeError(f"{shlex.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


def missing_programs() -> list[str]:
    """The programs of PROGRAMS that are not on PATH (and the CNI loopback plugin when absent)."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if not (CNI_BIN_DIR / "loopback").exists():
        missing.append(str(CNI_BIN_DIR / "loopback"))
    return missing


def port_taken(port: int) -> bool:
    """True when something listens on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


# ============================================================ mounts and cgroups
@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where it is mounted and its propagation tags."""

    point: str
    tags: tuple[str, ...]

    @property
    def shared(self) -> bool:
        """True when the mount propagates to and from its peers."""
        return any(tag.startswith("shared:") for tag in self.tags)


def mounts() -> list[Mount]:
    """The mounts of this process's mount namespace, in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        tags = tuple(fields[6 : fields.index("-")])
        point = fields[4].encode().decode("unicode_escape")  # \040 and friends
        found.append(Mount(point, tags))
    return found


def is_mount_point(path: Path) -> bool:
    """True when `path` itself is a mount point."""
    return any(mount.point == str(path) for mount in mounts())


def is_shared_mount(path: Path) -> bool:
    """True when the mount at `path` (the last one, if stacked) is shared."""
    at_path = [mount for mount in mounts() if mount.point == str(path)]
    return bool(at_path) and at_path[-1].shared


def mounts_under(path: Path) -> list[str]:
    """Mount points strictly below `path`, deepest (and latest) first."""
    prefix = str(path).rstrip("/") + "/"
    points = [mount.point for mount in mounts() if mount.point.startswith(prefix)]
    return sorted(points, key=lambda point: (point.count("/"), point), reverse=True)


def unmount(point: str) -> None:
    """Unmount `point`, lazily when it is busy; nothing when it is not mounted."""
    for argv in (["umount", point], ["umount", "-l", point]):
        if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
            return


def unmount_under(path: Path) -> None:
    """Unmount everything mounted below `path` (not `path` itself)."""
    for point in mounts_under(path):
        unmount(point)


def remove_empty_folders(top: Path) -> None:
    """Remove `top` and the folders below it that hold no file, deepest first; never a file."""
    if not top.is_dir():
        return
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def kubepods_cgroups() -> list[Path]:
    """The kubelet's cgroup folders (`kubepods` of each v1 hierarchy, cgroupfs driver)."""
    return sorted(path for path in CGROUP_ROOT.glob("*/kubepods") if path.is_dir())


def cgroup_processes(top: Path) -> set[int]:
    """Every process in the cgroup `top` and the cgroups below it."""
    pids: set[int] = set()
    for procs in top.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(pid) for pid in procs.read_text().split())
    return pids


def remove_cgroup_tree(top: Path) -> None:
    """Remove the (empty) cgroup `top` and all below it, deepest first (a cgroup's files go with it)."""
    remove_empty_folders(top)


def processes_with_args(program: str, *args: str) -> list[int]:
    """PIDs whose command line runs `program` (its base name) with all of `args` among its arguments."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and Path(argv[0]).name == program and all(arg in argv for arg in args):
            pids.append(int(proc.name))
    return pids


def kill_pids(pids: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> None:
    """Send `sig` to each PID that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# ============================================================ certificates
# ============================================================ configuration files
@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps its files (all below `workdir`)."""

    workdir: Path

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket."""
        return self.workdir / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        """containerd's persistent root (content store, snapshots)."""
        return self.workdir / "containerd-root"

    @property
    def containerd_state(self) -> Path:
        """containerd's state folder (bundles, runc state)."""
        return self.workdir / "containerd-state"

    @property
    def conf(self) -> Path:
        """Configuration files."""
        return self.workdir / "conf"

    @property
    def pki(self) -> Path:
        """The kubelet's client and serving certificates."""
        return self.workdir / "pki"

    @property
    def cni_conf(self) -> Path:
        """CNI configuration folder (the loopback-only list)."""
        return self.workdir / "cni"

    @property
    def sysctl(self) -> Path:
        """Files bound over /proc/sys entries inside the kubelet's mount namespace."""
        return self.workdir / "sysctl"

    @property
    def pod_logs(self) -> Path:
        """The kubelet's podLogsDir (containers' log files)."""
        return self.workdir / "pod-logs"

    @property
    def logs(self) -> Path:
        """containerd's and the kubelet's own logs."""
        return self.workdir / "logs"


def containerd_config(paths: NodePaths, runc: str, sandbox_image: str = SANDBOX_IMAGE) -> str:
    """containerd 1.6's TOML: own root, state and socket, CRI with clamped oom_score_adj and loopback CNI."""
    q = json.dumps  # a TOML basic string reads like a JSON string for these paths
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    skip = ["aufs", "btrfs", "devmapper", "zfs"]
    disabled = [f"io.containerd.snapshotter.v1.{name}" for name in skip]
    disabled += ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
    return f"""version = 2
root = {q(str(paths.containerd_root))}
state = {q(str(paths.containerd_state))}
disabled_plugins = {q(disabled)}
[grpc]
  address = {q(str(paths.containerd_socket))}
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(paths.containerd_root / "opt"))}
{cri}]
  sandbox_image = {q(sandbox_image)}
  stream_server_address = {q(HOST)}
  stream_server_port = "0"
  enable_selinux = false
  restrict_oom_score_adj = true
  {cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    {cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      {cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = {q(runc)}
        Root = {q(str(paths.containerd_state / "runc"))}
  {cri}.cni]
    bin_dir = {q(str(CNI_BIN_DIR))}
    conf_dir = {q(str(paths.cni_conf))}
    max_conf_num = 1
"""


def loopback_conflist() -> dict[str, Any]:
    """A CNI list with only the loopback plugin: the runtime reports NetworkReady, pods use the host's network."""
    return {"cniVersion": "0.4.0", "name": "gpupack-loopback", "plugins": [{"type": "loopback"}]}


def kubelet_config(paths: NodePaths, ca_cert: Path, serving_cert: Path, serving_key: Path) -> dict[str, Any]:
    """The KubeletConfiguration: API on 127.0.0.1 open to the API server, nothing that touches the host."""
    off = "0%"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": HOST,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": HOST,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        # The API server calls the kubelet without a client certificate; the API listens on loopback only.
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "evictionHard": {signal: off for signal in EVICTION_SIGNALS},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "makeIPTablesUtilChains": False,
        "serializeImagePulls": False,
        "maxPods": 30,
        "resolvConf": "/etc/resolv.conf" if Path("/etc/resolv.conf").exists() else "",
        "volumePluginDir": str(paths.workdir / "volume-plugins"),
        "podLogsDir": str(paths.pod_logs),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def kubelet_kubeconfig(server: str, ca_cert: Path, client_cert: Path, client_key: Path) -> dict[str, Any]:
    """The kubeconfig the kubelet talks to the API server with (its own client certificate)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": "kubelet", "user": {"client-certificate": str(client_cert), "client-key": str(client_key)}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "kubelet"}}],
        "current-context": "e2e",
    }


def shielded_sysctls(folder: Path) -> dict[str, Path]:
    """For each kernel tunable the kubelet would change: a file holding the wanted value, keyed by /proc/sys path."""
    folder.mkdir(parents=True, exist_ok=True)
    shields = {}
    for name, wanted in KERNEL_TUNABLES.items():
        proc = Path("/proc/sys") / name
        if proc.read_text().strip() != wanted:
            shield = folder / name.replace("/", ".")
            shield.write_text(f"{wanted}\n")
            shields[str(proc)] = shield
    return shields


def in_own_mount_namespace(argv: Sequence[str], binds: Mapping[str, Path]) -> list[str]:
    """`argv` run in a new mount namespace that keeps shared mounts shared, with `binds` (target: file) over /proc.

    unshare starts a shell that mounts, then execs the program: the process started is the program itself.
    """
    steps = ["mount --make-rprivate /proc"]
    steps += [f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}" for target, source in binds.items()]
    script = " && ".join([*steps, 'exec "$0" "$@"'])
    return ["unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script, *argv]


# ============================================================ pods
def host_pod_body(
    name: str,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    restart_policy: str = "Never",
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A one-container hostNetwork pod bound to the real node (no scheduler), image never pulled.

    No ServiceAccount token is mounted (no controller-manager publishes `kube-root-ca.crt` here).
    """
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": list(command),
        "env": [{"name": key, "value": value} for key, value in (env or {}).items()],
    }
    if resources:
        container["resources"] = dict(resources)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE_NAME,
            "hostNetwork": True,
            "restartPolicy": restart_policy,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def pod_phase(core: Any, namespace: str, name: str) -> str:
    """The pod's phase (Pending, Running, Succeeded, Failed, Unknown)."""
    return str(core.read_namespaced_pod(name, namespace).status.phase)


def wait_pod_phase(core: Any, namespace: str, name: str, phases: Iterable[str], timeout: float = 60) -> str:
    """Wait until the pod's phase is one of `phases`; that phase. The error tells the pod's last state."""
    wanted = set(phases)
    last: list[Any] = [None]

    def reached() -> bool:
        last[0] = core.read_namespaced_pod(name, namespace)
        return str(last[0].status.phase) in wanted

    try:
        wait_for(f"pod {namespace}/{name} to be {'/'.join(sorted(wanted))}", reached, timeout)
    except RealNodeError as exc:
        raise RealNodeError(f"{exc}; last: {pod_summary(last[0])}") from exc
    return str(last[0].status.phase)


def pod_summary(pod: Any) -> str:
    """A pod's phase, conditions and containers' states on one line (for error messages)."""
    if pod is None:
        return "no pod read"
    status = pod.status
    conditions = [f"{c.type}={c.status}{f' ({c.reason})' if c.reason else ''}" for c in status.conditions or []]
    states = []
    for container in status.container_statuses or []:
        state = container.state
        detail = state.waiting or state.terminated
        states.append(f"{container.name}: {detail.reason if detail else 'running'} {detail.message if detail else ''}")
    return f"phase {status.phase}, {', '.join(conditions)}; {'; '.join(states)}"


def container_log(core: Any, namespace: str, name: str, container: str | None = None) -> str:
    """A container's log through the API server (API server -> kubelet on 127.0.0.1:10250)."""
    kwargs = {"container": container} if container else {}
    return str(core.read_namespaced_pod_log(name, namespace, **kwargs))


def node_condition(node: Any, kind: str) -> Any | None:
    """The Node's condition of type `kind`, None when it has none."""
    return next((c for c in (node.status.conditions or []) if c.type == kind), None)


# ============================================================ the node
class RealNode:
    """containerd + runc + a real kubelet registered as node `127.0.0.1` with `plane`'s API server."""

    def __init__(self, plane: ControlPlane, kubelet: Path, workdir: Path | None = None) -> None:
        self.plane = plane
        self.kubelet_program = Path(kubelet)
        self._own_workdir = workdir is None
        self.paths = NodePaths(Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpupack-node-")))
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self._made: set[Path] = set()  # host folders this node created, removed by stop()
        self._bound_kubelet_root = False
        self._made_binding = False
        self._prepared = False
        self._shim_root_existed = True
        self._started = False
        self._stopped = False

    # ------------------------------------------------ public paths
    @property
    def name(self) -> str:
        """The Node's name (and the kubelet's --hostname-override)."""
        return NODE_NAME

    @property
    def workdir(self) -> Path:
        """The node's own folder: configuration, certificates, logs, containerd's root and state."""
        return self.paths.workdir

    @property
    def containerd_socket(self) -> Path:
        """containerd's socket (for `ctr --address`)."""
        return self.paths.containerd_socket

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's podresources API socket."""
        return POD_RESOURCES_SOCKET

    @property
    def device_plugin_dir(self) -> Path:
        """Where device plugins put their sockets and the kubelet its registration socket `kubelet.sock`."""
        return DEVICE_PLUGIN_DIR

    # ------------------------------------------------ lifecycle
    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, images: Sequence[Path] = (), timeout: float = 120) -> RealNode:
        """Start containerd, import `images`, start the kubelet and wait until the Node is Ready and untainted.

        Stops whatever started when a step fails.
        """
        if self._started:
            raise RealNodeError("a RealNode starts once; make a new one")
        self._started = True
        atexit.register(self.stop)
        try:
            self._check_host()
            self._prepare()
            self.start_containerd()
            if images:
                self.import_images(list(images))
            self.start_kubelet(timeout)
            self.wait_ready(timeout)
            self.remove_not_ready_taint()
        except RealNodeError as exc:
            tails = self.log_tails()  # the work folder and its logs go with stop()
            self.stop()
            raise RealNodeError(f"{exc}\n{tails}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def log_tails(self, lines: int = 30) -> str:
        """The last `lines` lines of containerd's and the kubelet's logs, headed by their names."""
        parts = []
        for name, text in (("containerd", self.containerd_log()), ("kubelet", self.kubelet_log())):
            parts.append(f"----- last {lines} lines of {name}'s log -----")
            parts.extend(text.splitlines()[-lines:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Delete the node's pods and the Node, stop the kubelet and containerd, undo mounts; safe to call twice."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        try:
            if self.kubelet is not None:  # else start() failed before the node existed: touch no Node
                self._delete_pods()
                self._stop_process(self.kubelet, grace=15)
                self._delete_node()
            if self.containerd is not None:
                self._remove_containers()
                self._stop_process(self.containerd, grace=10)
                self._kill_leftovers()
            if self._prepared:
                self._undo_host_changes()
            self._delete_binding()
        finally:
            self._remove_work_files()
            atexit.unregister(self.stop)

    # ------------------------------------------------ containerd
    def start_containerd(self, timeout: float = 60) -> None:
        """containerd with the node's own configuration; waits until it answers on its socket."""
        self.containerd = Process(
            "containerd",
            [shutil.which("containerd") or "containerd", "--config", str(self.paths.conf / "containerd.toml")],
            self.paths.logs / "containerd.log",
        ).start()
        self._wait_process("containerd to answer", self.containerd, self._containerd_answers, timeout)

    def restart_containerd(self, timeout: float = 60) -> None:
        """SIGTERM containerd and start it again; the shims and the containers keep running."""
        self._stop_process(self.containerd, grace=10)
        self.start_containerd(timeout)
        self.wait_ready(timeout)

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """Run `ctr` on this node's containerd in the CRI namespace `k8s.io`; its output."""
        return run(["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args], timeout)

    def import_images(self, archives: list[Path]) -> None:
        """Import OCI image archives into the CRI namespace (images named by their archive's annotation)."""
        image_builds.import_images(str(self.containerd_socket), archives)

    def images(self) -> list[str]:
        """Names of the images containerd holds for the kubelet."""
        return [name for name in self.ctr("images", "ls", "-q").split() if not name.startswith("sha256:")]

    def containerd_log(self) -> str:
        """What containerd wrote, all runs."""
        return self.containerd.log_text() if self.containerd else _read(self.paths.logs / "containerd.log")

    def _containerd_answers(self) -> bool:
        done = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "version"], capture_output=True, timeout=10, check=False
        )
        return done.returncode == 0

    # ------------------------------------------------ kubelet
    def start_kubelet(self, timeout: float = 120) -> None:
        """The kubelet in its own mount namespace; waits for /healthz and its device-plugin socket."""
        argv = [
            str(self.kubelet_program),
            f"--config={self.paths.conf / 'kubelet.yaml'}",
            f"--kubeconfig={self.paths.conf / 'kubelet.kubeconfig'}",
            f"--hostname-override={NODE_NAME}",
            f"--root-dir={KUBELET_ROOT}",
            "--v=2",
        ]
        shields = shielded_sysctls(self.paths.sysctl)
        self.kubelet = Process("kubelet", in_own_mount_namespace(argv, shields), self.paths.logs / "kubelet.log")
        self.kubelet.start()
        url = f"http://{HOST}:{KUBELET_HEALTHZ_PORT}/healthz"
        self._wait_process("the kubelet's /healthz", self.kubelet, lambda: http_status(url) == 200, timeout)
        socket_there = (DEVICE_PLUGIN_DIR / "kubelet.sock").exists
        self._wait_process("the kubelet's device-plugin socket", self.kubelet, socket_there, timeout)

    def restart_kubelet(self, timeout: float = 120) -> None:
        """SIGTERM the kubelet and start it again (pods keep running); waits for Ready and a new Lease renewal.

        The kubelet deletes every socket in `device_plugin_dir` at start: device plugins must register again.
        """
        self._stop_process(self.kubelet, grace=15)
        stopped = datetime.datetime.now(datetime.UTC)
        self.start_kubelet(timeout)
        self.wait_ready(timeout, renewed_after=stopped)

    def kubelet_log(self) -> str:
        """What the kubelet wrote, all runs."""
        return self.kubelet.log_text() if self.kubelet else _read(self.paths.logs / "kubelet.log")

    # ------------------------------------------------ the Node
    def node(self) -> Any:
        """The Node object as the API server has it."""
        return self.plane.core().read_node(NODE_NAME)

    def lease_renewed(self) -> datetime.datetime | None:
        """When the kubelet last renewed its node Lease (microseconds; the Node's heartbeats have seconds)."""
        from kubernetes import client

        try:
            lease = client.CoordinationV1Api(self.plane.api_client()).read_namespaced_lease(NODE_NAME, NODE_LEASES)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        renewed: datetime.datetime | None = lease.spec.renew_time if lease.spec else None
        return renewed

    def wait_ready(self, timeout: float = 120, renewed_after: datetime.datetime | None = None) -> None:
        """Wait until the Node is Ready and, when `renewed_after` is given, the kubelet renewed its Lease since."""

        def ready() -> bool:
            for process in (self.containerd, self.kubelet):
                if process is not None:
                    process.check_alive()
            try:
                condition = node_condition(self.node(), "Ready")
            except Exception as exc:  # not registered yet (404), else re-raised
                if getattr(exc, "status", None) == 404:
                    return False
                raise
            if condition is None or condition.status != "True":
                return False
            if renewed_after is None:
                return True
            renewed = self.lease_renewed()
            return renewed is not None and renewed > renewed_after

        wait_for(f"node {NODE_NAME} to be Ready", _with_node_error(ready), timeout, interval=0.5)

    def remove_not_ready_taint(self) -> None:
        """Drop the not-ready taint the API server put on the new Node (no node-lifecycle controller here)."""
        core = self.plane.core()
        taints = self.node().spec.taints or []
        if not any(taint.key == NOT_READY_TAINT for taint in taints):
            return
        kept = [core.api_client.sanitize_for_serialization(t) for t in taints if t.key != NOT_READY_TAINT]
        core.patch_node(NODE_NAME, {"spec": {"taints": kept or None}}, _content_type="application/merge-patch+json")

    # ------------------------------------------------ start-up steps
    def _check_host(self) -> None:
        """RealNodeError when a program is missing or another node seems to run here."""
        missing = missing_programs()
        if missing:
            raise RealNodeError(f"missing {', '.join(missing)}: apt-get install -y {APT_PACKAGES}")
        if not os.access(self.kubelet_program, os.X_OK):
            raise RealNodeError(f"{self.kubelet_program} is not an executable kubelet")
        busy = [port for port in (KUBELET_PORT, KUBELET_HEALTHZ_PORT) if port_taken(port)]
        if busy:
            raise RealNodeError(f"127.0.0.1:{busy} already in use: another kubelet runs on this machine?")
        occupied = [path for path in kubepods_cgroups() if cgroup_processes(path)]
        if occupied:
            raise RealNodeError(f"processes run in {occupied[0]}: another kubelet's pods on this machine?")

    def _prepare(self) -> None:
        """Folders, certificates, configuration files, the shared /var/lib/kubelet and RBAC for nodes."""
        paths = self.paths
        self._prepared = True
        for folder in (paths.conf, paths.logs, paths.cni_conf, paths.containerd_root, paths.pod_logs):
            folder.mkdir(parents=True, exist_ok=True)
        for folder in (KUBELET_ROOT, CONTAINER_LOG_LINKS):
            self._make_host_folder(folder)
        self._shim_root_existed = SHIM_SOCKET_ROOT.exists()
        self._write_configs()
        self._share_kubelet_root()
        self._ensure_binding()

    def _write_configs(self) -> None:
        """Certificates signed by the control plane's CA and the containerd, CNI and kubelet configurations."""
        paths, certs = self.paths, self.plane.certs
        assert certs is not None, "the control plane has not started"
        ca_cert, ca_key = certs.ca_cert, certs.ca_key
        client_key, client_cert = issue_certificate(
            paths.pki, "kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n", ca_cert, ca_key,
        )  # fmt: skip
        serving_key, serving_cert = issue_certificate(
            paths.pki, "kubelet-serving", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            f"subjectAltName=IP:{HOST},DNS:localhost\nextendedKeyUsage=serverAuth\n", ca_cert, ca_key,
        )  # fmt: skip
        runc = shutil.which("runc") or "runc"
        (paths.conf / "containerd.toml").write_text(containerd_config(paths, runc))
        (paths.cni_conf / "10-loopback.conflist").write_text(json.dumps(loopback_conflist()))
        config = kubelet_config(paths, ca_cert, serving_cert, serving_key)
        (paths.conf / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig = kubelet_kubeconfig(self.plane.apiserver_url, ca_cert, client_cert, client_key)
        (paths.conf / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))

    def _make_host_folder(self, folder: Path) -> None:
        """Create a folder outside the work folder, remembering to remove it if it was not there."""
        if not folder.exists():
            folder.mkdir(parents=True)
            self._made.add(folder)

    def _share_kubelet_root(self) -> None:
        """Bind /var/lib/kubelet on itself as a shared mount, so mounts the kubelet makes reach containerd."""
        if is_shared_mount(KUBELET_ROOT):
            return
        run(["mount", "--bind", str(KUBELET_ROOT), str(KUBELET_ROOT)])
        self._bound_kubelet_root = True
        run(["mount", "--make-shared", str(KUBELET_ROOT)])

    def _ensure_binding(self) -> None:
        """A ClusterRoleBinding of `system:node` to the group `system:nodes` (RBAC next to the Node authorizer)."""
        from kubernetes import client

        rbac = client.RbacAuthorizationV1Api(self.plane.api_client())
        body: Any = {  # the client's stubs want its model class; a dict serialises the same
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CLUSTER_ROLE_BINDING},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
        }
        try:
            rbac.create_cluster_role_binding(body)
            self._made_binding = True
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def _wait_process(self, what: str, process: Process, check: Callable[[], bool], timeout: float) -> None:
        """Wait until `check`, failing early with the log's tail when `process` exits."""

        def ready() -> bool:
            process.check_alive()
            return check()

        wait_for(what, _with_node_error(ready), timeout)

    # ------------------------------------------------ stop steps
    def _delete_pods(self, timeout: float = 30) -> None:
        """Delete the pods bound to this node: gracefully while the kubelet runs, then at once."""
        with contextlib.suppress(Exception):
            core = self.plane.core()
            selector = f"spec.nodeName={NODE_NAME}"

            def left() -> list[Any]:
                return list(
                    core.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=API_TIMEOUT).items
                )

            pods = left()
            if pods and self.kubelet is not None and self.kubelet.running():
                for pod in pods:
                    with contextlib.suppress(Exception):
                        core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1)
                with contextlib.suppress(RealNodeError):
                    wait_for("the node's pods to go", lambda: not left(), timeout, interval=0.5)
            for pod in left():
                with contextlib.suppress(Exception):
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)

    def _delete_node(self) -> None:
        """Delete the Node object (after the kubelet stopped, so it does not register again)."""
        with contextlib.suppress(Exception):
            self.plane.core().delete_node(NODE_NAME, grace_period_seconds=0, _request_timeout=API_TIMEOUT)

    def _remove_containers(self) -> None:
        """Kill and delete every task and container containerd still holds for the kubelet."""
        if self.containerd is None or not self.containerd.running():
            return
        with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired):
            tasks = self.ctr("tasks", "ls", "-q", timeout=20).split()
            for task in tasks:
                with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired):
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task, timeout=20)
            for task in tasks:
                with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired):
                    self.ctr("tasks", "rm", "-f", task, timeout=20)
            for container in self.ctr("containers", "ls", "-q", timeout=20).split():
                with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired):
                    self.ctr("containers", "rm", container, timeout=20)

    def _kill_leftovers(self) -> None:
        """SIGKILL containers still in the kubelet's cgroups and shims of this node's containerd."""
        for top in kubepods_cgroups():
            kill_pids(cgroup_processes(top))
        kill_pids(processes_with_args("containerd-shim-runc-v2", "-address", str(self.containerd_socket)))

    def _undo_host_changes(self) -> None:
        """Unmount what the node mounted, remove its cgroups and the host folders it created."""
        for folder in (self.paths.containerd_state, self.paths.containerd_root, KUBELET_ROOT):
            unmount_under(folder)
        if self._bound_kubelet_root:
            unmount(str(KUBELET_ROOT))
            self._bound_kubelet_root = False
        deadline = time.monotonic() + 5
        for top in kubepods_cgroups():
            while cgroup_processes(top) and time.monotonic() < deadline:
                time.sleep(0.1)
            remove_cgroup_tree(top)
        for folder in sorted(self._made, key=lambda path: len(path.parts), reverse=True):
            if not mounts_under(folder) and not is_mount_point(folder):
                shutil.rmtree(folder, ignore_errors=True)
        self._made.clear()
        if not self._shim_root_existed:  # other containerds share it: remove only empty folders
            remove_empty_folders(SHIM_SOCKET_ROOT)

    def _delete_binding(self) -> None:
        """Delete the ClusterRoleBinding if this node made it."""
        if not self._made_binding:
            return
        with contextlib.suppress(Exception):
            from kubernetes import client

            rbac = client.RbacAuthorizationV1Api(self.plane.api_client())
            rbac.delete_cluster_role_binding(CLUSTER_ROLE_BINDING, _request_timeout=API_TIMEOUT)
        self._made_binding = False

    def _remove_work_files(self) -> None:
        """Remove the work folder if the node made it, else only containerd's root and state (logs stay)."""
        paths = self.paths
        if mounts_under(paths.workdir):
            return  # never delete through a mount that could not be undone
        if self._own_workdir:
            shutil.rmtree(paths.workdir, ignore_errors=True)
        else:
            for folder in (paths.containerd_root, paths.containerd_state):
                shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _stop_process(process: Process | None, grace: float) -> None:
        """SIGTERM `process`'s group, SIGKILL after `grace` seconds."""
        if process is not None:
            process.kill(signal.SIGTERM, grace=grace)


def _with_node_error(check: Callable[[], bool]) -> Callable[[], bool]:
    """`check`, with the control plane's 'process exited' error turned into RealNodeError."""

    def wrapped() -> bool:
        try:
            return check()
        except GpupackError as exc:
            if isinstance(exc, RealNodeError):
                raise
            raise RealNodeError(str(exc)) from exc

    return wrapped


def _read(path: Path) -> str:
    """A text file's content, empty when absent."""
    return path.read_text(errors="replace") if path.exists() else ""
