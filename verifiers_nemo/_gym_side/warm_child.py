"""Becoming ``python SCRIPT ARGS`` in a process forked from a warm parent, as a fresh interpreter would be.

A warm parent (``zygote.py``) has imported, once, the third-party modules of Gym's import chain (never
``nemo_gym`` itself, whose import reads the working directory and the environment). A process forked from it
becomes, here, what the interpreter the requester would have started (``launcher.py`` is that requester for a
Gym server; the warm supervisor itself for ``ng_run``) is when it starts running the script:

- file descriptors: exactly the requester's, at the same numbers (its stdio, log pipes, anything it inherited);
  every descriptor of the warm parent is closed;
- environment, working directory, umask, resource limits: the requester's;
- signals: the dispositions a fresh interpreter has (ignored where the requester inherited them ignored, else
  default; Python's own SIGINT, SIGPIPE and SIGXFSZ settings) and the requester's blocked mask;
- the process's command line and name as ``ps`` shows them (``set_process_title``), and its environment as other
  processes read it (``/proc/PID/environ``: ``set_process_environ``);
- ``sys``: ``argv``, ``orig_argv``, ``executable``, ``path`` (the requester's own, which the same interpreter
  computed from the same environment, with the script's directory first, and what the preload itself added to
  ``sys.path``), a fresh ``__main__`` module; our own helper modules are dropped from ``sys.modules``;
- what the preload changed in the environment (``ray`` sets ``RAY_CLIENT_MODE``) is applied again, as the
  import would have done it (only when the requester had the value the warm parent had);
- state a module keeps from the process it was imported in, re-derived the way a fresh import would: the
  standard library's ``multiprocessing.process.ORIGINAL_DIR`` (the working directory at start: the standard
  library's own spawn sets it the same way in its children) and numpy's legacy global random generator
  (reseeded from the OS, as its import does; Python's ``random`` reseeds itself after a fork).

A requester may run the same Python binary from another venv (an environment derived from the runtime, holding
a server's extra packages): the fork takes on that venv's prefixes (``sys``, ``site``, ``sysconfig``) and path.

What stays the warm parent's, measured and said: the string hash seed (one per warm parent, not per server),
the set of modules already imported (the preload; a module the server would never have imported is there,
unused; a preloaded module of which the requester's venv holds a byte-identical copy is the runtime's, its
``__file__`` in the runtime's folder), and pyarrow's jemalloc without its background purge thread (as in any
forked child of it).
Which requests cannot be served this way at all is ``refusal``'s (the launcher then starts the plain way).
Standard library only.
"""

from __future__ import annotations

import fcntl
import gc
import importlib.machinery
import os
import re
import resource
import signal
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

NATIVE = re.compile(
    r"^(PYTHON|LC_|LANG$|LANGUAGE$|TZ$|LD_|MALLOC|JE_|ARROW|OMP_|OPENBLAS|GOTO|MKL|NUMEXPR|NPY_|RAY_|GRPC|SSL_|"
    r"OPENSSL|CUDA)"
)
"""Variables the interpreter or native libraries read when they start or load, not through ``os.environ`` (so no
probe sees them): a fork must have the warm parent's values. Ray's C++ configuration, for one, is read once when
``ray._raylet`` loads (measured: ``RAY_AUTH_MODE`` set after the import is not seen)."""
READ_LATE = frozenset({"RAY_AUTH_TOKEN", "PYTHONBREAKPOINT"})
"""Matched by ``NATIVE`` but read only when used. Ray reads its token when a driver connects (measured on both
releases: a process that imported ``ray`` before ``RAY_AUTH_TOKEN`` was set joins the token head; a stack's token
is its Ray head's, not the warm parent's). ``breakpoint()`` reads ``PYTHONBREAKPOINT`` when called (Ray sets it
in ng_run when it connects, and the servers inherit it)."""
_RLIMITS = {name: getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")}
_UNSETTABLE = {signal.SIGKILL, signal.SIGSTOP}


def signal_state(pid: int | str = "self") -> tuple[list[int], list[int]]:
    """The signals process ``pid`` ignores and blocks (``/proc/PID/status``: ``SigIgn``, ``SigBlk``)."""
    masks = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigIgn", "SigBlk"):
                masks[key] = int(value.strip(), 16)
    return tuple(  # type: ignore[return-value]
        [n for n in range(1, 65) if masks.get(key, 0) >> (n - 1) & 1] for key in ("SigIgn", "SigBlk")
    )


def rlimits() -> dict[str, list[int]]:
    """This process's resource limits, by name."""
    return {name: list(resource.getrlimit(value)) for name, value in _RLIMITS.items()}


def interpreter() -> list[Any]:
    """What must be equal for a fork of the warm parent to stand for this interpreter: its path as started,
    prefixes, version and flags (``-X`` options and ``PYTHON*`` variables set them)."""
    return [
        sys.executable,
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.hexversion,
        list(sys.flags),
        sorted(map(str, sys._xoptions.items())),
    ]


def refusal(request: Mapping[str, Any], preload: Mapping[str, Any], own_path: bool = True) -> str | None:
    """Why ``request`` cannot be served by a fork of a warm parent that recorded ``preload`` (``Zygote.prepare``),
    or None. The interpreter must be the warm parent's own, with the same flags; the environment must agree with
    the warm parent's in every variable its modules read while they were imported (or hold what that import
    itself set) and in every ``NATIVE`` one; and, with ``own_path`` (a launcher's request, whose ``sys.path``
    its own interpreter computed; it may differ by ``PYTHONPATH``), no folder on the path that the warm parent's
    lacks may hold a module the preload imported from elsewhere (the plain interpreter would import that one)."""
    if not _same_interpreter(request.get("interpreter"), preload["interpreter"]):
        return "it runs another interpreter or other interpreter flags than the warm parent"
    env = request["env"]
    before, after = preload["env_before"], preload["env_after"]
    native = {k for k in (*env, *preload["native_env"]) if NATIVE.match(k) and k not in READ_LATE}
    if own_path:
        native.discard("PYTHONPATH")
    expected = {**{k: preload["native_env"].get(k) for k in native}, **before}
    # A variable the preload itself sets, found with the value it sets: what an ancestor that ran the same import
    # left (ng_run's ``ray`` sets RAY_CLIENT_MODE=0, and its servers inherit it).
    differs = sorted(
        k
        for k in {*preload["env_read"], *native}
        if env.get(k) != expected.get(k) and not (k in after and env.get(k) == after[k])
    )
    if differs:
        return f"its environment differs in {', '.join(differs[:5])}, which the warm parent's modules read at import"
    if len(request["fds"]) > 250:
        return f"it has {len(request['fds'])} open file descriptors"
    if own_path:
        script_dir = os.path.dirname(os.path.realpath(os.path.join(request["cwd"], request["argv"][0])))
        ours = set(preload["path"])
        for folder in dict.fromkeys([script_dir, *request["path"]]):
            if folder not in ours:
                shadow = _shadowing(folder, preload["top_levels"])
                if shadow and not _same_files(folder, shadow, preload.get("origins", {})):
                    return f"{os.path.join(folder, shadow)} would be imported instead of the preloaded {shadow}"
                code = _pth_with_code(folder) if folder != script_dir else None
                if code:
                    return f"{os.path.join(folder, code)} runs code when the interpreter starts"
    return None


def _same_files(folder: str, entry: str, origins: Mapping[str, str]) -> bool:
    """Whether the module ``entry`` of ``folder`` is, file for file, the preloaded one of that name: both installed
    from wheels whose records (``*.dist-info/RECORD``) list the same files of that module with the same hashes (an
    environment derived from the runtime holds such copies of the runtime's packages its extras depend on, at the
    runtime's exact versions)."""
    name = entry.partition(".")[0]
    origin = origins.get(name)
    if origin is None:
        return False
    ours, theirs = _recorded_files(folder, name), _recorded_files(origin, name)
    return bool(ours) and ours == theirs


def _recorded_files(folder: str, name: str) -> frozenset[tuple[str, str]] | None:
    """The files of top-level module ``name`` and their hashes as the records of ``folder``'s distributions list
    them (None when a file of it has no hash or no record lists it)."""
    import csv

    rows: set[tuple[str, str]] = set()
    try:
        infos = [e for e in os.listdir(folder) if e.endswith(".dist-info")]
    except OSError:
        return None
    for info in infos:
        try:
            with open(os.path.join(folder, info, "RECORD"), newline="", encoding="utf-8") as f:
                for row in csv.reader(f):
                    path = row[0] if row else ""
                    if (path.startswith((name + "/", name + ".")) or path == name) and "__pycache__" not in path:
                        if len(row) < 2 or not row[1]:
                            return None
                        rows.add((path, row[1]))
        except OSError:
            continue
    return frozenset(rows) or None


def _same_interpreter(requested: Any, preloaded: list[Any]) -> bool:
    """Whether a fork of the warm parent can stand for ``requested`` (``interpreter()`` of the requester): the
    same, or the same Python binary, version and flags run from another venv on the same base (an environment
    derived from the runtime: ``become`` then takes on that venv's prefixes; its site folders are checked by
    ``refusal`` like any folder on the path)."""
    if requested == preloaded:
        return True
    if not isinstance(requested, list) or len(requested) != len(preloaded) or requested[3:] != preloaded[3:]:
        return False
    executable, prefix, exec_prefix = requested[:3]
    return (
        os.path.realpath(executable) == os.path.realpath(preloaded[0])
        and prefix == exec_prefix
        and os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))
    )


RUNTIME_PTH = "_verifiers_nemo_gym_runtime.pth"
"""The one ``.pth`` of an environment derived from the runtime (``_gym/derived_env.py``): it adds the runtime's
site-packages, which the warm parent has processed already."""


def _pth_with_code(folder: str) -> str | None:
    """A ``.pth`` file of ``folder`` with an ``import`` line (``site`` runs it when a plain interpreter starts; a
    fork would not), other than ``RUNTIME_PTH``."""
    try:
        entries = sorted(e for e in os.listdir(folder) if e.endswith(".pth") and e != RUNTIME_PTH)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(folder, entry), encoding="utf-8", errors="replace") as f:
                if any(line.startswith(("import ", "import\t")) for line in f):
                    return entry
        except OSError:
            return entry
    return None


def _shadowing(folder: str, names: Iterable[str]) -> str | None:
    """An entry of ``folder`` that a plain interpreter would import for one of ``names`` (a module file or a
    regular package: a bare folder is a namespace portion, which a package found later on the path overrides)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return None
    wanted = set(names)
    for entry in entries:
        stem, dot, suffix = entry.partition(".")
        if stem not in wanted:
            continue
        path = os.path.join(folder, entry)
        if (dot and suffix.endswith(("py", "pyc", "so"))) or os.path.isfile(os.path.join(path, "__init__.py")):
            return entry
    return None


def set_process_title(argv: list[str], comm: str) -> None:
    """Make this process's command line (``/proc/self/cmdline``, what ``ps`` and ``pgrep -f`` read) ``argv`` and
    its name (``comm``) ``comm``: a fork shows its own command, not the warm parent's. The command line is the
    memory the warm parent's own arguments occupied (padded for this: ``TITLE_ROOM``), NUL-padded after ``argv``;
    longer ones are cut."""
    import ctypes

    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: proc(5) fields 48 and 49
    size = end - start
    title = b"\0".join(os.fsencode(a) for a in argv)[: size - 1] + b"\0"
    ctypes.memset(start, 0, size)
    ctypes.memmove(start, title, len(title))
    with open("/proc/self/comm", "w") as f:
        f.write(comm[:15])


TITLE_ROOM = 16384
"""Bytes of command line a warm parent keeps for its forks' own (``set_process_title``)."""
ENV_ROOM = {f"VERIFIERS_NEMO_ENV_ROOM_{i}": " " * (120 << 10) for i in range(8)}
"""A warm parent starts with these variables (960 KiB: a Gym server's environment holds its whole config; one
variable may not exceed 128 KiB) and removes them at once: the room its forks write their own environments into
(``set_process_environ``)."""


def set_process_environ(env: Mapping[str, str]) -> None:
    """Make ``/proc/self/environ`` (what other processes read of this one's environment: the environment it was
    started with) ``env``: the memory the warm parent's own environment occupied at its start (with
    ``ENV_ROOM``), NUL-padded. Call it once ``os.environ`` is ``env``: the C library then points to copies, not
    to that memory. An environment that does not fit is cut at a variable's end."""
    import ctypes

    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end: proc(5) fields 50 and 51
    size = end - start
    data = b""
    for key, value in env.items():
        entry = os.fsencode(key) + b"=" + os.fsencode(value) + b"\0"
        if len(data) + len(entry) > size:
            break
        data += entry
    ctypes.memset(start, 0, size)
    ctypes.memmove(start, data, len(data))


def become(request: Mapping[str, Any], received: list[int], preload: Mapping[str, Any]) -> Script:
    """In a process just forked from the warm parent: become the interpreter ``request`` describes (see the
    module docstring); ``received`` are the requester's descriptors, in the order of ``request["fds"]``.
    Returns the script to run (``Script.run``), with nothing of ours left on the way."""
    _reset_signals(request["ignored"], request["blocked"])
    _place_fds(received, request["fds"])
    for name, (soft, hard) in request.get("rlimits", {}).items():
        if name in _RLIMITS and resource.getrlimit(_RLIMITS[name]) != (soft, hard):
            resource.setrlimit(_RLIMITS[name], (soft, hard))
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    _set_environ(request["env"], preload["env_after"], preload["env_before"])
    set_process_environ(request["env"])  # as it was started: what the import changes later is not there either
    for name in preload.get("own_modules", ()):  # named: iterating sys.modules would copy pages of every key
        sys.modules.pop(name, None)
    script = os.path.abspath(request["argv"][0])
    sys.argv[:] = list(request["argv"])
    sys.orig_argv[:] = [request["orig_argv0"], *request["argv"]]
    sys.executable = request["executable"]
    _enter_venv(request["interpreter"][1], request["interpreter"][2])
    sys.path[:] = [*preload["path_prefix"], os.path.dirname(os.path.realpath(script)), *request["path"]]
    sys.path.extend(p for p in preload["path_suffix"] if p not in sys.path)
    # sys.path_importer_cache stays: its finders are the same folders' (and check their folders' mtimes); clearing
    # it frees thousands of objects, which copies their pages from the warm parent (12 MiB a fork, measured).
    _stdio_like_a_fresh_start()
    _rederive_import_time_state(request["cwd"])
    set_process_title(sys.orig_argv, request.get("comm", os.path.basename(request["orig_argv0"])))
    return Script(script)


class Script:
    """A script to run as ``__main__``, the way ``python SCRIPT`` runs it (``run`` is called at module level by
    the warm parent's main, so that a traceback shows the script's frames below one of ours)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def prepare(self) -> tuple[types.CodeType, dict[str, Any]]:
        """A fresh ``__main__`` module for the script (as the interpreter makes it) and the script's code."""
        with open(self.path, "rb") as f:
            source = f.read()
        code = compile(source, self.path, "exec", dont_inherit=True)
        main = types.ModuleType("__main__")
        main.__dict__.update(
            __file__=self.path,
            __cached__=None,
            __loader__=importlib.machinery.SourceFileLoader("__main__", self.path),
            __spec__=None,
            __package__=None,
            __annotations__={},
            __builtins__=sys.modules["builtins"],
        )
        sys.modules["__main__"] = main
        return code, main.__dict__


def _reset_signals(ignored: Iterable[int], blocked: Iterable[int]) -> None:
    """The signal dispositions of a fresh interpreter whose parent left ``ignored`` ignored, and its mask."""
    ignored = set(ignored)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for sig in signal.valid_signals():
        if sig in _UNSETTABLE:
            continue
        try:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        except (OSError, ValueError):
            continue  # the C library's own real-time signals
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # what Python installs at start
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # ignored by Python at start
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set(blocked))


def _place_fds(received: list[int], targets: list[int]) -> None:
    """Close every descriptor but ``received`` and put those at the numbers ``targets``, inheritable as they
    were in the requester."""
    keep = set(received)
    for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor
    floor = max([2, *targets, *received]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd in set(received):
        os.close(fd)
    for src, dst in zip(moved, targets, strict=True):
        os.dup2(src, dst, inheritable=True)
    for fd in moved:
        os.close(fd)


def _set_environ(env: Mapping[str, str], after: Mapping[str, str | None], before: Mapping[str, str | None]) -> None:
    """``os.environ`` (and the C library's) becomes ``env``, with the preload's own changes applied on top where
    the requester had what the warm parent had (``refusal`` refused the other cases)."""
    os.environ.clear()
    os.environ.update(env)
    for key, value in after.items():
        if env.get(key) == before.get(key):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _enter_venv(prefix: str, exec_prefix: str) -> None:
    """Take on the prefixes of the requester's venv (``_same_interpreter``) wherever the interpreter's start left
    them: ``sys``; ``site.PREFIXES`` (each of the warm parent's prefixes there replaced); ``sysconfig``'s copies
    taken at its import, and its variables computed from them once (computed again at their next use, as the
    standard library itself does from 3.12.8 on when it sees the prefix changed: python/cpython#126789)."""
    before = {sys.prefix: prefix, sys.exec_prefix: exec_prefix}
    if (prefix, exec_prefix) == (sys.prefix, sys.exec_prefix):
        return
    sys.prefix, sys.exec_prefix = prefix, exec_prefix
    site = sys.modules.get("site")
    if site is not None and isinstance(getattr(site, "PREFIXES", None), list):
        site.PREFIXES[:] = list(dict.fromkeys(before.get(p, p) for p in site.PREFIXES))
    sysconfig = sys.modules.get("sysconfig")
    if sysconfig is not None:
        for name, value in (("_PREFIX", prefix), ("_EXEC_PREFIX", exec_prefix)):
            if isinstance(getattr(sysconfig, name, None), str):
                setattr(sysconfig, name, os.path.normpath(value))
        if getattr(sysconfig, "_CONFIG_VARS", None) is not None:
            sysconfig._CONFIG_VARS = None
            sysconfig._CONFIG_VARS_INITIALIZED = False


def _stdio_like_a_fresh_start() -> None:
    """Python line-buffers a buffered stdout that is a terminal (stderr always); the warm parent's was a file."""
    if sys.stdout is not None and not sys.stdout.write_through:
        try:
            sys.stdout.reconfigure(line_buffering=os.isatty(sys.stdout.fileno()))
        except (OSError, ValueError):
            pass


def _rederive_import_time_state(cwd: str) -> None:
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process.ORIGINAL_DIR = os.path.abspath(cwd)  # as multiprocessing.spawn.prepare does in its children
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()  # fresh OS entropy, as its import seeds it
    gc.enable()
