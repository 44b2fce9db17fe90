"""The machine's warm parent of a Gym runtime: Gym's third-party modules imported once, forked for each stack.

Every Gym process (``ng_run`` and each server) imports nemo-gym's dependencies from scratch: seconds of CPU
and ~130 MB of private memory each (wandb, ray, openai, pandas, fastapi...). This process imports them once,
then forks, for each stack an owner starts, that stack's supervisor (``warm_supervisor.py``), which forks the
stack's processes from itself in the stack's own session. A fork shares the imported modules' memory until a
page is written, and spends no time importing them.

What it imports (the preload): the modules the Gym runtime's import chain loads (its entry points and
``nemo_gym.base_*``), as a probe run of that chain lists them (once per runtime; cached), less nemo-gym's own
packages (``nemo_gym``'s import reads the working directory and changes the environment: it must run in each
process, as stock) and less every module whose import reads the working directory, except the standard
library's ``multiprocessing.process`` (re-derived in each fork, as its own spawn does) and ``tempfile`` (whose
default folder falls back to the working directory only when no temporary folder is writable).

Fork safety: a fork copies one thread, and any lock another thread held stays locked in the child. After the
preload two libraries run threads of their own: OpenBLAS (numpy, via wandb and pandas: its worker pool) and
pyarrow's jemalloc (a background purge thread). The jemalloc thread is never started here
(``JE_ARROW_MALLOC_CONF=background_thread:false`` in this process's own environment only; a fork of a
jemalloc process runs without it anyway); OpenBLAS's pool is retired by its own fork handler, which joins its
threads before a fork, so one throwaway fork at the end of the preload leaves this process with exactly one
thread (a pool is started again by the next BLAS call in whichever process makes one). This process then checks
``/proc/self/task`` and serves only with one thread, and checks that the preload holds no file descriptor and
changed no signal handler; otherwise it exits, saying why, and stacks start the plain way.

What it records for the forks (``warm_child.py``): the interpreter and ``sys.path`` it started with, the
environment variables the preload read (a request whose environment differs in one is refused) or changed,
and what the preload added to ``sys.path``.

Run as ``python zygote.py CONFIG_JSON`` under the plain supervisor with leases (one per machine, user, runtime
and environment: ``verifiers_nemo/_stack/warm_parent.py``), or ``python zygote.py --probe`` to list the
preload. Standard library only.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

_STARTUP_PATH0, _STARTUP_PATH = sys.path[0], list(sys.path[1:])
for _name in [name for name in os.environ if name.startswith("VERIFIERS_NEMO_ENV_ROOM_")]:
    del os.environ[_name]  # the room for the forks' environments (warm_child.ENV_ROOM): never seen by anything
_STARTUP_ENV = dict(os.environ)
_STARTUP_MODULES = frozenset(sys.modules)
_HERE = os.path.dirname(os.path.abspath(__file__))
_HELPERS = ("wire", "supervisor", "warm_child", "warm_supervisor", "launcher")
_GYM_DISTRIBUTION = "nemo-gym"
_TOLERATED_CWD_READERS = frozenset({"multiprocessing.process", "tempfile", "rich"})
"""Modules that read the working directory at import and stay in the preload: ``multiprocessing.process``
(re-derived in each fork, see ``warm_child``), ``tempfile`` (the working directory is its default folder's last
fallback, after TMPDIR, /tmp...), ``rich`` (``_IMPORT_CWD``: shown for relative file names in its tracebacks;
code run as a script has absolute ones)."""
_PROBED_PREFIXES = ("nemo_gym.base_",)
_PATH_HELPERS = frozenset({"os", "posixpath", "genericpath", "pathlib", "pathlib._local", "pathlib._abc"})


def _load_helpers() -> Any:
    """Our other Gym-side modules, loaded by path under private names (``_vnr_*``: dropped in every fork)."""
    helpers = {}
    for name in _HELPERS:
        spec = importlib.util.spec_from_file_location(f"_vnr_{name}", os.path.join(_HERE, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        helpers[name] = module
    return type("Helpers", (), helpers)


# -- the probe: which modules Gym's import chain loads ----------------------------------------------------------


def probe() -> dict[str, Any]:
    """Import Gym's chain here (a throwaway process) and list what it loaded, in order: ``modules`` (not
    nemo-gym's own), ``cwd_readers`` (modules whose import read the working directory) and ``env_read`` (the
    environment variables the chain read, nemo-gym's included)."""
    readers: list[str] = []
    getcwd = os.getcwd

    def watched_getcwd() -> str:
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__") in _PATH_HELPERS:
            frame = frame.f_back  # os.path.abspath, Path.cwd...: their caller reads it
        readers.append(frame.f_globals.get("__name__", "?"))
        return getcwd()

    before = set(sys.modules)
    env_read: set[str] = set()
    os.getcwd = watched_getcwd  # type: ignore[assignment]
    try:
        with _watch_environ(env_read.add):
            for name in _chain():
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
    finally:
        os.getcwd = getcwd  # type: ignore[assignment]
    gym_tops = _gym_top_levels()
    return {
        "modules": [m for m in sys.modules if m not in before and m.split(".")[0] not in gym_tops],
        "cwd_readers": sorted({r for r in readers if r.split(".")[0] not in gym_tops}),
        "env_read": sorted(env_read),
    }


def _chain() -> list[str]:
    """The modules Gym's processes start from: its console scripts' modules and ``nemo_gym.base_*``, and ``ray``,
    which every Gym process imports when it connects to its Ray cluster (0.7 imports it only then)."""
    names = ["ray"]
    for entry in importlib.metadata.distribution(_GYM_DISTRIBUTION).entry_points:
        if entry.group == "console_scripts" and entry.name == "ng_run":
            names.append(entry.module)
    spec = importlib.util.find_spec("nemo_gym")
    folder = os.path.dirname(spec.origin) if spec and spec.origin else ""
    for file in sorted(os.listdir(folder)) if folder else []:
        stem = file[:-3]
        if file.endswith(".py") and f"nemo_gym.{stem}".startswith(_PROBED_PREFIXES):
            names.append(f"nemo_gym.{stem}")
    return names


def _origins(names: set[str]) -> dict[str, str]:
    """The folder each preloaded top-level module was imported from (where it has a file: not a namespace
    package), for ``warm_child.refusal`` to compare a copy elsewhere with."""
    origins = {}
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(file, str):
            here = os.path.dirname(file)
            origins[name] = os.path.dirname(here) if os.path.basename(file).startswith("__init__.") else here
    return origins


def _gym_top_levels() -> set[str]:
    """Top-level import names that belong to nemo-gym's distribution (``nemo_gym``, ``resources_servers``...)."""
    tops = {name for name, dists in importlib.metadata.packages_distributions().items() if _GYM_DISTRIBUTION in dists}
    return tops | {"nemo_gym", "__main__", "__mp_main__"}


# -- the warm parent ---------------------------------------------------------------------------------------------


class Zygote:
    """The warm parent: preload once (``prepare``), then fork a stack supervisor per request (``serve``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.helpers = _load_helpers()
        self.preload: dict[str, Any] = {}
        self.stop = False
        self.listener: socket.socket | None = None
        self.shared_folders: list[Any] = []

    def prepare(self) -> str | None:
        """Import the preload and check the result; why this process cannot serve, or None."""
        with open(self.config["preload"]) as f:
            listed = json.load(f)
        skipped = set(listed["cwd_readers"]) - _TOLERATED_CWD_READERS
        env_read: set[str] = set()
        env_before = {k: v for k, v in _STARTUP_ENV.items() if k not in self.config.get("own_env", {})}
        env_before.update({k: v for k, v in self.config.get("own_env", {}).items() if v is not None})
        handlers = _handlers()
        argv, sys.argv = sys.argv, sys.argv[:1]  # a module reading its arguments at import sees a script's none
        with _watch_environ(env_read.add):
            for name in listed["modules"]:
                if name in sys.modules or any(name == s or name.startswith(s + ".") for s in skipped):
                    continue
                with contextlib.suppress(BaseException):
                    importlib.import_module(name)
        sys.argv = argv
        leaked = sorted(name for name in skipped if name in sys.modules)
        if leaked:
            return f"modules that read the working directory at import were imported anyway: {leaked}"
        if _handlers() != handlers:
            return "the preload changed signal handlers"
        extra_fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and _open(int(fd)))
        if extra_fds:
            return f"the preload left file descriptors open: {extra_fds}"
        own_env = self.config.get("own_env", {})
        env_now = {k: v for k, v in os.environ.items() if k not in own_env}
        env_now.update({k: v for k, v in own_env.items() if v is not None})
        for key, value in own_env.items():  # this process's own settings (jemalloc's) leave with the preload
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        changed = {k for k in {*env_before, *env_now} if env_before.get(k) != env_now.get(k)}
        path_now = list(sys.path)
        startup = [_STARTUP_PATH0, *_STARTUP_PATH]
        at = _find(path_now, startup)
        if at is None:
            return "the preload reordered sys.path"
        self.shared_folders = _adopt_temporary_folders()
        self._retire_library_threads()
        threads = _threads()
        if len(threads) != 1:
            return f"after the preload this process runs {len(threads)} threads ({', '.join(threads)}), not one"
        helpers = self.helpers
        preloaded = {m.split(".")[0] for m in sys.modules if m not in _STARTUP_MODULES and not m.startswith("_vnr_")}
        self.preload = {
            "interpreter": helpers.warm_child.interpreter(),
            "startup_path": _STARTUP_PATH,
            "path": path_now,
            "top_levels": sorted(preloaded - {m.split(".")[0] for m in _STARTUP_MODULES}),
            "origins": _origins(preloaded - {m.split(".")[0] for m in _STARTUP_MODULES}),
            "native_env": {k: v for k, v in env_before.items() if helpers.warm_child.NATIVE.match(k)},
            "own_modules": [f"_vnr_{name}" for name in _HELPERS],
            "path_prefix": path_now[:at],
            "path_suffix": path_now[at + len(startup) :],
            "env_read": sorted(env_read | changed),
            "env_before": {k: env_before.get(k) for k in env_read | changed},
            "env_after": {k: env_now.get(k) for k in changed},
            "modules": len(sys.modules),
        }
        gc.collect()
        gc.freeze()  # what the forks inherit is never traced again: fewer pages copied on write
        return None

    def _retire_library_threads(self) -> None:
        """One throwaway fork: OpenBLAS's fork handler joins its worker pool first (see the module docstring)."""
        if len(_threads()) == 1:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()": handled here
            pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def serve(self) -> Any:
        """Fork a stack supervisor for each owner's request; returns it in the fork (never in this process)."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        path = self.config["socket"]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self.helpers.warm_child.set_process_title(sys.orig_argv[:3], "python")  # less the room kept for the forks'
        self.helpers.warm_child.set_process_environ(os.environ)  # the same
        print(
            f"[verifiers_nemo warm parent] ready: {self.preload['modules']} modules, one thread, pid {os.getpid()}",
            flush=True,
        )
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        poller.register(self.listener.fileno(), select.POLLIN)
        while not self.stop:
            for fd, _ in poller.poll():
                if fd == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 256):
                            pass
                elif fd == self.listener.fileno():
                    child = self._serve_one(wake_r, wake_w)
                    if child is not None:
                        return child
            _reap_all()
        for folder in self.shared_folders:
            with contextlib.suppress(OSError):
                folder.cleanup()
        os._exit(0)

    def _stop_signal(self, *_: object) -> None:
        self.stop = True

    def _serve_one(self, wake_r: int, wake_w: int) -> Any:
        """One owner's request: ``{"spec", "cwd", "env", "owner"}`` and its pipe's read end."""
        wire = self.helpers.wire
        try:
            sock, _ = self.listener.accept()  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return None
        sock.settimeout(30.0)
        channel = wire.Channel(sock)
        fds: list[int] = []
        try:
            _pid, uid, _gid = wire.peer(sock)
            request, fds = channel.recv()
            if uid != os.getuid() or request is None or len(fds) != 1:
                raise PermissionError("not a request of this user")
            reason = self.helpers.warm_child.refusal(
                {"interpreter": self.preload["interpreter"], "env": request["env"], "fds": []},
                self.preload,
                own_path=False,
            )
            if reason is not None:
                channel.send({"refused": f"the stack's supervisor cannot start warm: {reason}"})
                raise ValueError(reason)
        except (OSError, EOFError, ValueError, KeyError):
            for fd in fds:
                os.close(fd)
            channel.close()
            return None
        pid = os.fork()
        if pid == 0:
            return self._become_supervisor(request, fds[0], channel, (wake_r, wake_w))
        os.close(fds[0])
        try:
            pidfd = os.pidfd_open(pid)
            try:
                channel.send({"pid": pid}, [pidfd])
            finally:
                os.close(pidfd)
        except OSError:
            pass  # the owner is gone: the supervisor sees its pipe closed and stops at once
        channel.close()
        return None

    def _become_supervisor(self, request: dict[str, Any], pipe: int, channel: Any, wake: tuple[int, int]) -> Any:
        """In the fork: lead a new session as the plain supervisor would, started by the owner."""
        os.setsid()
        os.close(channel.sock.detach())
        os.close(self.listener.detach())  # type: ignore[union-attr]
        for fd in wake:
            os.close(fd)
        warm_child = self.helpers.warm_child
        owner = request["owner"]
        null = os.open(os.devnull, os.O_RDWR)
        # As ``subprocess`` starts the plain supervisor: SIGPIPE and SIGXFSZ back to their defaults.
        ignored = set(owner["ignored"]) - {signal.SIGPIPE, signal.SIGXFSZ}
        warm_child._reset_signals(ignored, owner["blocked"])
        warm_child._place_fds([pipe, null, null], [0, 1, 2])
        for name, limits in owner["rlimits"].items():
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(warm_child._RLIMITS[name], tuple(limits))
        os.umask(owner["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        warm_child.set_process_environ(request["env"])
        supervisor = os.path.join(_HERE, "supervisor.py")
        warm_child.set_process_title([sys.executable, supervisor, json.dumps(request["spec"])], "python")
        return self.helpers.warm_supervisor.WarmSupervisor(request["spec"], owner, self.preload, self.helpers)


def _watch_environ(record: Callable[[str], None]) -> contextlib.AbstractContextManager[None]:
    """Record the names of the environment variables read through ``os.environ`` (``[]``, ``in``, ``get``,
    ``os.getenv``) while the block runs; iterating over the whole environment is not a read of each variable."""
    environ_type = type(os.environ)
    originals = {name: getattr(environ_type, name) for name in ("__getitem__", "__contains__")}
    iterating = threading.local()
    items = environ_type.items

    def getitem(self: Any, key: str) -> Any:
        if not getattr(iterating, "on", False):
            record(key)
        return originals["__getitem__"](self, key)

    def contains(self: Any, key: object) -> bool:
        if isinstance(key, str):
            record(key)
        return originals["__contains__"](self, key)

    def whole(self: Any) -> Any:
        iterating.on = True
        try:
            return list(items(self))
        finally:
            iterating.on = False

    @contextlib.contextmanager
    def watching() -> Any:
        environ_type.__getitem__ = getitem  # type: ignore[method-assign]
        environ_type.__contains__ = contains  # type: ignore[method-assign]
        environ_type.items = whole  # type: ignore[method-assign]
        try:
            yield
        finally:
            for name, function in originals.items():
                setattr(environ_type, name, function)
            environ_type.items = items  # type: ignore[method-assign]

    return watching()


def _adopt_temporary_folders() -> list[Any]:
    """Make the temporary folders the preload created (wandb makes two at import) this process's: no fork
    removes them at its exit (which would take them from the other forks); this process does when it stops."""
    import atexit
    import tempfile
    import weakref

    folders = []
    for obj in gc.get_objects():
        if isinstance(obj, weakref.finalize):
            alive = obj.peek()
            if alive is not None and isinstance(alive[0], tempfile.TemporaryDirectory):
                obj.atexit = False
        elif isinstance(obj, tempfile.TemporaryDirectory):
            atexit.unregister(obj.cleanup)
            folders.append(obj)
    return folders


def _handlers() -> dict[int, Any]:
    handlers = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handlers[int(sig)] = signal.getsignal(sig)
    return handlers


def _threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _find(haystack: list[str], needle: list[str]) -> int | None:
    for at in range(len(haystack) - len(needle) + 1):
        if haystack[at : at + len(needle)] == needle:
            return at
    return None


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> Any:
    """The warm parent's life; returns, in a fork, the script that fork runs (see the end of this file)."""
    if sys.argv[1:] == ["--probe"]:
        print(json.dumps(probe()))
        sys.stdout.flush()
        os._exit(0)
    zygote = Zygote(json.loads(sys.argv[1]))
    reason = zygote.prepare()
    if reason is not None:
        print(f"[verifiers_nemo warm parent] cannot serve: {reason}", flush=True)
        os._exit(3)
    supervisor = zygote.serve()  # in this process it never returns: only in a stack's supervisor
    del zygote
    result = supervisor.serve()  # in the supervisor: its exit code; in a process it forked: the script to run
    if isinstance(result, int):
        os._exit(result)
    return result


if __name__ == "__main__":
    _vnr_code, _vnr_globals = main().prepare()
    try:
        exec(_vnr_code, _vnr_globals)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as _vnr_exc:  # as the interpreter reports an uncaught exception, less our one frame
        _vnr_tb = _vnr_exc.__traceback__.tb_next if _vnr_exc.__traceback__ is not None else None
        sys.last_exc = _vnr_exc.with_traceback(_vnr_tb)  # type: ignore[attr-defined]
        sys.last_type, sys.last_value, sys.last_traceback = type(_vnr_exc), _vnr_exc, _vnr_tb
        sys.excepthook(type(_vnr_exc), _vnr_exc, _vnr_tb)
        raise SystemExit(1) from None
