"""Tool runner: run a tool call's code in a sandbox and capture what it printed.

Two sandboxes, one result type (:class:`ToolResult`):

- :class:`SubprocessSandbox` (embedded default): ``bwrap --unshare-all --die-with-parent``
  when bubblewrap is on ``PATH`` and usable (no network, user nobody in its own user namespace,
  no capabilities, a new session, a private ``/tmp``). It sees only the host's system
  directories, read-only (:data:`SANDBOX_RO_PATHS`): never the gateway's state directory, auth
  file, certificates or home directory. Its user maps to the gateway's own, so binding ``/``
  would let tool code read every file the gateway can, ``0600`` ones included. Each call runs
  in a control group of its own (:mod:`hermeslet.cgroups`: cgroup v2, or v1 on hybrid
  hosts) whose memory (``ToolLimits.memory_bytes``, all its processes together, no swap) and
  process count (``ToolLimits.pids``) the kernel enforces; whatever is left of the call
  when it ends or times out is killed with its group. Where no cgroup can be made, the
  fallback is per-process rlimits (address space per process, ``RLIMIT_NPROC`` per user) and
  it is LOUD: a warning at startup and ``hermeslet_tool_sandbox_kernel_limits{mode="rlimit"}``.
  The child also gets CPU seconds, no core files and its own process group.

  Without a usable bubblewrap there is **no silent fallback**: tool calls are refused
  (:class:`SandboxUnavailable`, and the node does not announce the ``subprocess`` runner)
  unless the operator opted in to running tool code as a plain subprocess,
  ``unsafe_unsandboxed=True`` (``hermes serve --unsafe-unsandboxed-tools``, loopback only) or
  ``use_bwrap=False`` (an explicit choice in code, e.g. tests).
- :class:`DockerSandbox` (when configured): a fresh container per call through the Docker SDK
  with ``network_mode="none"``, memory (no extra swap)/CPU/pids limits, a read-only root, user
  ``nobody`` (65534), all capabilities dropped, no-new-privileges; killed on timeout, or as
  soon as its call is cancelled (:class:`DockerCall`). The SDK is blocking, so it runs in a
  worker thread.

A tool call is either ``code`` (Python source, run with the sandbox's ``python3``) or
``command`` (an argv list). Output is read as it is written and cut at ``max_output_chars``
per stream (what follows is counted and dropped, never held): a tool that prints a gigabyte
costs the node no more memory than one that prints the limit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

from hermeslet import cgroups

DEFAULT_MAX_OUTPUT = 64 * 1024

log = logging.getLogger("hermeslet.tools")

#: what the bubblewrap sandbox sees of the host, read-only: programs, libraries and the few
#: files of /etc they read. Symbolic links (merged /usr: /bin -> usr/bin) are recreated as
#: links; paths the host lacks are skipped.
SANDBOX_RO_PATHS: tuple[str, ...] = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ssl/certs",
    "/etc/ca-certificates",
)
#: PATH inside the bubblewrap sandbox (the host's may name directories it cannot see)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: what an operator can do about a node without a sandbox (error messages and the log)
NO_SANDBOX_HELP = (
    "install bubblewrap (apt-get install bubblewrap; it needs user namespaces, which a "
    "container's default seccomp profile forbids) or give a HermesLet a Docker sandbox "
    "(hermeslet run --docker); for local development only, `hermes serve "
    "--unsafe-unsandboxed-tools` (tools.unsafe_unsandboxed, loopback only) runs tool code "
    "unsandboxed as the gateway's user")


class SandboxUnavailable(RuntimeError):
    """A tool call with no sandbox to run it in (and no opt-in to run it without one)."""


@dataclass(slots=True)
class ToolResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    cold: bool
    timed_out: bool


@dataclass(slots=True)
class ToolLimits:
    """Per-call resource limits (subprocess: rlimits; Docker: container limits)."""

    cpu_s: int = 60
    memory_bytes: int = 1 << 30
    pids: int = 64
    cpus: float = 1.0


def _truncate(data: bytes, limit: int, dropped: int = 0) -> str:
    """``data`` as text, cut at ``limit`` characters; ``dropped``: bytes already dropped."""
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit or dropped:
        cut = len(text) - limit if len(text) > limit else 0
        more = f"{cut} chars" + (f" and {dropped} bytes" if dropped else "")
        return text[:limit] + f"\n...[truncated {more}]"
    return text


class CappedOutput:
    """One output stream of a call, kept up to ``limit`` characters' worth of bytes (UTF-8:
    at most 4 per character) and counted beyond: what is over is dropped as it arrives."""

    def __init__(self, limit_chars: int) -> None:
        self.keep = 4 * limit_chars + 4
        self.limit_chars = limit_chars
        self.buf = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self) -> str:
        return _truncate(bytes(self.buf), self.limit_chars, self.dropped)


async def _drain(stream: asyncio.StreamReader | None, out: CappedOutput) -> None:
    """Read ``stream`` to its end into ``out`` (chunks of 64 KiB: never the whole)."""
    if stream is None:
        return
    while chunk := await stream.read(1 << 16):
        out.feed(chunk)


def _argv(code: str | None, command: list[str] | None, python: str) -> list[str]:
    if (code is None) == (command is None):
        raise ValueError("a tool call needs exactly one of code and command")
    if code is not None:
        return [python, "-c", code]
    assert command is not None
    if not command:
        raise ValueError("empty command")
    return list(command)


class Sandbox(ABC):
    """Runs one tool call to completion (or timeout)."""

    kind: str

    @abstractmethod
    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult: ...


class SubprocessSandbox(Sandbox):
    """Subprocess in bubblewrap (when available) with rlimits; process-group kill on timeout."""

    kind = "subprocess"

    def __init__(
        self,
        *,
        limits: ToolLimits | None = None,
        use_bwrap: bool | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT,
        python: str | None = None,
        unsafe_unsandboxed: bool = False,
        cgroup: cgroups.CgroupRoot | Literal["auto", "off"] | str = "auto",
    ) -> None:
        """``use_bwrap``: None (default) uses bubblewrap when it is on ``PATH`` and works,
        True requires it, False runs a plain subprocess (an explicit choice). Without
        bubblewrap, tool calls are refused unless ``unsafe_unsandboxed`` (or ``use_bwrap``
        is False). ``cgroup``: where per-call cgroups are made (:mod:`hermeslet.cgroups`):
        ``"auto"`` (detect), a delegated cgroup v2 directory, a :class:`CgroupRoot`, or
        ``"off"`` (per-process rlimits only; loud)."""
        self.limits = limits or ToolLimits()
        self._cgroup_arg = cgroup
        self._cgroup_root: cgroups.CgroupRoot | None = None
        self._cgroup_known = False
        self.rlimit_fallbacks = 0  # calls run with per-process limits only
        bwrap = shutil.which("bwrap")
        self.bwrap = bwrap if (use_bwrap is None or use_bwrap) and bwrap else None
        if use_bwrap and not self.bwrap:
            raise RuntimeError("bwrap requested but not on PATH")
        #: plain subprocesses allowed: the operator's (or the caller's) explicit choice
        self.unsafe = bool(unsafe_unsandboxed) or use_bwrap is False
        self.max_output_chars = max_output_chars
        self._python = python
        self._bwrap_ok: bool | None = None if self.bwrap else False
        self.why_not = ("" if self.bwrap else "bubblewrap (bwrap) is not on PATH"
                        if use_bwrap is None else "a plain subprocess was asked for")

    @property
    def python(self) -> str:
        return self._python or ("python3" if self.bwrap else sys.executable)

    def probe(self) -> bool:
        """Whether bubblewrap works here (once; some hosts forbid user namespaces): if it
        does not, the sandbox is unavailable (or, opted in, a plain subprocess)."""
        if self._bwrap_ok is None and self.bwrap:
            try:
                r = subprocess.run(self._wrap(["true"]), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   timeout=30, check=False)
                ok, err = r.returncode == 0, r.stderr.decode(errors="replace").strip()
            except (OSError, subprocess.SubprocessError) as e:
                ok, err = False, str(e)
            self._bwrap_ok = ok
            if not ok:
                self.bwrap = None
                self.why_not = f"bubblewrap is unusable here ({err or 'exit status != 0'})"
        return self.bwrap is not None

    @property
    def sandboxed(self) -> bool:
        """Tool code runs inside bubblewrap."""
        return self.probe()

    @property
    def available(self) -> bool:
        """Tool calls run: in bubblewrap, or unsandboxed by explicit choice."""
        return self.sandboxed or self.unsafe

    @property
    def cgroup_root(self) -> cgroups.CgroupRoot | None:
        """Where per-call cgroups are made (detected once), or None: rlimits only."""
        if not self._cgroup_known:
            self._cgroup_known = True
            arg = self._cgroup_arg
            if isinstance(arg, cgroups.CgroupRoot):
                self._cgroup_root = arg
            elif arg != "off":
                self._cgroup_root = cgroups.detect(None if arg == "auto" else arg)
                if self._cgroup_root is None and arg != "auto":
                    log.warning("tool sandbox: the cgroup directory %s is not a writable "
                                "cgroup v2 directory with memory and pids", arg)
        return self._cgroup_root

    @property
    def kernel_limits(self) -> cgroups.Mode:
        """How a call's memory and process count are bounded: ``cgroup2``/``cgroup1`` (the
        whole call, by the kernel) or ``rlimit`` (per process; the loud fallback)."""
        root = self.cgroup_root
        return root.mode if root is not None else "rlimit"

    def describe_limits(self) -> str:
        lim = self.limits
        if self.kernel_limits != "rlimit":
            return (f"per-call limits by the kernel ({self.kernel_limits}): {lim.memory_bytes} "
                    f"bytes of memory and {lim.pids} processes per call")
        return (f"WARNING: no writable cgroup (v2 or v1 memory+pids) here: tool calls are "
                f"limited per PROCESS only ({lim.memory_bytes} bytes of address space each, "
                f"{lim.pids} processes per user), so a call that forks can use more; give "
                "the node a delegated cgroup v2 directory (tools.cgroup_root) or run it as a "
                "user who may create cgroups")

    def describe(self) -> str:
        """One line for the log: how tool code runs here, or why it is refused."""
        if self.sandboxed:
            return ("tool sandbox: bubblewrap (no network, user nobody, no capabilities, "
                    "read-only system directories only); " + self.describe_limits())
        if self.unsafe:
            return (f"tool calls run UNSANDBOXED ({self.why_not}; opted in): tool code runs "
                    "as this process's user with its files and network; local development "
                    "only")
        return f"tool calls refused: no sandbox on this node ({self.why_not}); {NO_SANDBOX_HELP}"

    def _preexec(self, group: cgroups.CallCgroup | None) -> Any:
        """What the child runs between fork and exec: enter the call's cgroup (first, so
        that nothing of the call is outside it), then its rlimits (``RLIMIT_NPROC`` where
        there is no cgroup: per user, the fallback's best)."""
        import resource

        cpu = int(self.limits.cpu_s)
        mem = int(self.limits.memory_bytes)
        nproc = int(self.limits.pids)

        def child() -> None:
            if group is not None:
                group.enter()
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if group is None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

        return child

    def _call_cgroup(self) -> cgroups.CallCgroup | None:
        """A cgroup for one call, or None (the fallback, counted and logged)."""
        root = self.cgroup_root
        if root is not None:
            try:
                return root.create(int(self.limits.memory_bytes), int(self.limits.pids))
            except OSError as e:
                log.warning("tool call cgroup not made (%s): this call is limited per "
                            "process only", e)
        self.rlimit_fallbacks += 1
        return None

    def _wrap(self, argv: list[str]) -> list[str]:
        if not self.bwrap:
            return argv
        return [
            self.bwrap,
            "--unshare-all",
            "--unshare-user", "--uid", "65534", "--gid", "65534",  # nobody, even when run as root
            "--cap-drop", "ALL",
            "--new-session",  # no TIOCSTI into the agent's terminal
            "--die-with-parent",
            *_ro_binds(),  # system directories only: no state, keys, certificates, homes
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--remount-ro", "/",  # the sandbox's own root: nothing new beside /tmp
            "--chdir", "/tmp",
            "--setenv", "PATH", SANDBOX_PATH,
            "--setenv", "HOME", "/tmp",
            "--",
            *argv,
        ]  # fmt: skip

    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult:
        if not self.available:
            raise SandboxUnavailable(f"tool call refused: no sandbox on this node "
                                     f"({self.why_not}); {NO_SANDBOX_HELP}")
        argv = self._wrap(_argv(code, command, self.python))
        t0 = time.monotonic()
        group = self._call_cgroup()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=self._preexec(group),
                start_new_session=True,  # own process group: the timeout kills all of it
                cwd="/tmp",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                     "PYTHONDONTWRITEBYTECODE": "1"},
            )
        except BaseException:
            if group is not None:
                group.close()
            raise
        out, err = CappedOutput(self.max_output_chars), CappedOutput(self.max_output_chars)
        timed_out = False

        async def finish() -> None:
            await asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
            await proc.wait()

        try:
            await asyncio.wait_for(finish(), timeout=timeout_s)
        except TimeoutError:
            timed_out = True
            _killpg(proc.pid)
            if group is not None:
                await asyncio.to_thread(group.close)
                group = None
            await proc.wait()
        except asyncio.CancelledError:
            _killpg(proc.pid)
            raise
        finally:
            if group is not None:  # what the call left behind (a daemonised child)
                oom = group.oom_killed()
                await asyncio.to_thread(group.close)
                if oom:
                    err.feed(f"\n[hermes: the call went over its memory limit of "
                             f"{self.limits.memory_bytes} bytes and was killed]\n".encode())
        rc = proc.returncode if proc.returncode is not None else -9
        return ToolResult(
            exit_code=rc,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - t0,
            cold=False,
            timed_out=timed_out,
        )


def _ro_binds() -> list[str]:
    """bwrap arguments that show :data:`SANDBOX_RO_PATHS` read-only (links as links)."""
    out: list[str] = []
    for p in SANDBOX_RO_PATHS:
        if os.path.islink(p):
            out += ["--symlink", os.readlink(p), p]
        elif os.path.exists(p):
            out += ["--ro-bind", p, p]
    return out


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sandbox_container_options(limits: ToolLimits) -> dict[str, Any]:
    """The ``containers.create`` options of every Docker tool sandbox (one-shot or pooled):
    no network, memory without extra swap, CPU and pids limits, read-only root with a small
    ``/tmp``, user nobody (numeric: images without ``/etc/passwd``), no capabilities,
    no-new-privileges. One place, so the sandboxes cannot drift apart."""
    return {
        "network_mode": "none",
        "mem_limit": int(limits.memory_bytes),
        "memswap_limit": int(limits.memory_bytes),  # no swap beyond the memory limit
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "read_only": True,
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "tmpfs": {"/tmp": "size=64m"},
        "working_dir": "/tmp",
    }


def capped_logs(container: Any, limit_chars: int, *, stdout: bool) -> CappedOutput:
    """A stopped container's stdout (or stderr), streamed and cut at ``limit_chars``
    (:class:`CappedOutput`): never the whole log in memory."""
    out = CappedOutput(limit_chars)
    for chunk in container.logs(stdout=stdout, stderr=not stdout, stream=True, follow=False):
        out.feed(chunk)
    return out


def docker_client(base_url: str | None) -> Any:
    """A Docker SDK client for ``base_url`` (``None``: the environment's, e.g. DOCKER_HOST)."""
    import docker

    return docker.DockerClient(base_url=base_url) if base_url else docker.from_env()


class DockerCall:
    """The container one blocking Docker call runs in, so that the event loop can stop it.

    A worker thread cannot be interrupted: a call whose task is cancelled (the scheduler's
    ``cancel``: its run cancelled, its client gone, the node stopping) would have left its
    container running until the call's own timeout, holding the container, its CPU and
    memory. The call hands its container to :meth:`attach` as soon as it has one;
    :meth:`cancel` kills it (and one attached after the cancel is killed at once), so the
    blocking wait ends and the call cleans up as after a timeout."""

    __slots__ = ("_lock", "_container", "cancelled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._container: Any = None
        self.cancelled = False

    def attach(self, container: Any) -> bool:
        """The call runs in ``container`` now; ``False`` (and the container killed) when the
        call was cancelled already: the caller then starts nothing in it."""
        with self._lock:
            self._container = container
            cancelled = self.cancelled
        if cancelled:
            kill_container(container)
        return not cancelled

    def cancel(self) -> None:
        """Kill the call's container (blocking: run it off the event loop)."""
        with self._lock:
            self.cancelled = True
            container = self._container
        if container is not None:
            kill_container(container)


def kill_container(container: Any) -> None:
    """``docker kill``, best effort: a container that is not running (not started yet, or
    gone) raises an API error, which says nothing here."""
    try:
        container.kill()
    except Exception:
        pass


class BlockingDockerSandbox(Sandbox):
    """A Docker sandbox whose work is a blocking SDK call (``run_blocking``), run in a worker
    thread so the event loop stays free; cancelling the awaiting task kills the call's
    container (:class:`DockerCall`)."""

    kind = "docker"
    default_image: str

    @abstractmethod
    def run_blocking(self, argv: list[str], image: str, timeout_s: float,
                     call: DockerCall | None = None) -> ToolResult:
        """Run ``argv`` in a container of ``image``, killed after ``timeout_s`` or when
        ``call`` is cancelled (the container is given to ``call.attach`` before the command
        starts in it)."""

    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult:
        argv = _argv(code, command, "python3")
        call = DockerCall()
        try:
            return await asyncio.to_thread(
                self.run_blocking, argv, image or self.default_image, timeout_s, call
            )
        except asyncio.CancelledError:
            # the worker thread goes on: stop what it waits for (a Docker API call, off the
            # loop; a thread of its own, not the default executor, whose threads may all be
            # in such calls), and let it clean up as after a timeout
            threading.Thread(target=call.cancel, name="hermeslet-docker-cancel",
                             daemon=True).start()
            raise


class DockerSandbox(BlockingDockerSandbox):
    """One container per call (``cold=True``), no network, limits, read-only root, nobody."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        limits: ToolLimits | None = None,
        default_image: str = "python:3.10-slim",
        max_output_chars: int = DEFAULT_MAX_OUTPUT,
        client: Any = None,
    ) -> None:
        self.limits = limits or ToolLimits()
        self.default_image = default_image
        self.max_output_chars = max_output_chars
        self._base_url = base_url
        self._client = client

    def _docker(self) -> Any:
        if self._client is None:
            self._client = docker_client(self._base_url)
        return self._client

    def run_blocking(self, argv: list[str], image: str, timeout_s: float,
                     call: DockerCall | None = None) -> ToolResult:
        client = self._docker()
        t0 = time.monotonic()
        container = client.containers.create(
            image, argv, detach=True, **sandbox_container_options(self.limits)
        )
        timed_out = False
        try:
            if call is not None and not call.attach(container):
                return ToolResult(exit_code=-9, stdout="", stderr="cancelled\n",
                                  duration_s=time.monotonic() - t0, cold=True,
                                  timed_out=False)
            container.start()
            try:
                status = container.wait(timeout=timeout_s)
                rc = int(status.get("StatusCode", -1))
            except Exception:  # requests' ReadTimeout / ConnectionError on timeout
                timed_out = True
                kill_container(container)
                rc = -9
            out = capped_logs(container, self.max_output_chars, stdout=True)
            err = capped_logs(container, self.max_output_chars, stdout=False)
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass
        return ToolResult(
            exit_code=rc,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - t0,
            cold=True,
            timed_out=timed_out,
        )



class ToolRunner:
    """Routes a tool call by its backend string to a sandbox.

    ``docker:IMAGE`` runs in Docker when a :class:`DockerSandbox` is configured, else in the
    subprocess sandbox (the host's Python stands in for the image). Every other backend kind
    (``api:``, ``dnn:``, ``subprocess``) runs in the subprocess sandbox, or in Docker's default
    image where the subprocess sandbox is unavailable. With neither, tool calls are refused
    (:class:`SandboxUnavailable`) and :attr:`kinds` is empty, so the scheduler sends the node
    none. How tool code runs here is logged once, when :attr:`kinds` is first read (the node's
    hello, at startup).
    """

    def __init__(self, subprocess: SubprocessSandbox | None = None,
                 docker: BlockingDockerSandbox | None = None, *,
                 unsafe_unsandboxed: bool = False) -> None:
        self.subprocess = subprocess or SubprocessSandbox(unsafe_unsandboxed=unsafe_unsandboxed)
        self.docker = docker
        self._logged = False

    @property
    def kinds(self) -> list[str]:
        if not self._logged:
            self._logged = True
            self.log_status()
        out = ["subprocess"] if self.subprocess.available else []
        return [*out, "docker"] if self.docker else out

    def log_status(self) -> None:
        """Say (once, at startup) how tool code runs on this node, or that it is refused."""
        sub = self.subprocess
        if self.docker is not None and not sub.sandboxed:
            line = "tool sandbox: Docker containers (no network, read-only root, user nobody)"
            line += f"; other backends: {sub.describe()}" if sub.unsafe else " for every backend"
            level = logging.WARNING if sub.unsafe else logging.INFO
        else:
            line = sub.describe()
            level = logging.INFO if sub.sandboxed and sub.kernel_limits != "rlimit" \
                else logging.WARNING
        log.log(level, "%s", line)

    async def run(
        self,
        backend: str,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolResult:
        kind, _, rest = backend.partition(":")
        if kind == "docker" and self.docker is not None:
            return await self.docker.run(
                code=code, command=command, timeout_s=timeout_s, image=rest or None
            )
        if self.docker is not None and not self.subprocess.available:
            return await self.docker.run(code=code, command=command, timeout_s=timeout_s)
        return await self.subprocess.run(code=code, command=command, timeout_s=timeout_s)
