"""A pytest plugin the task factory loads into a library's own test runs (on the host, never in rollouts).

It is copied next to the run as a standalone module (it imports nothing from swe_megatron) and writes one
JSON file (--probe-out) with:
  outcomes   {nodeid: passed|failed|error|skipped|xfailed|xpassed}
  failures   {nodeid: {"type", "message", "source", "output"}}: the exception type, pytest's crash message,
             the failing line(s) of the test ("> " lines of its first traceback entry), its captured stdout
  collect_errors [str]
and with --probe-sources FILE (one absolute library source path per line) also which library functions
each test called:
  funcs      [[file, first_line, qualname, [public aliases]]]   (first_line: the code's co_firstlineno)
  calls      {nodeid: [func index]}     every library function the test called, fixtures included
  entries    {nodeid: [func index]}     the library functions called directly from non-library code
  edges      [[caller index, callee index]]
  import_calls [func index]             called outside any test (imports, collection)
--probe-select FILE keeps only the listed node ids; --probe-test-timeout S fails a test that runs longer
than S seconds with ProbeTimeout (a mutant's endless loop must not stall the build).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest


class ProbeTimeout(Exception):
    """A test ran past --probe-test-timeout."""


def pytest_addoption(parser):
    g = parser.getgroup("swe-megatron-probe")
    g.addoption("--probe-out", default=None, help="where to write the JSON record")
    g.addoption("--probe-sources", default=None, help="file listing library source files to trace calls into")
    g.addoption("--probe-select", default=None, help="file listing the node ids to run")
    g.addoption("--probe-test-timeout", type=float, default=0.0, help="per-test wall-clock limit (0: none)")


def pytest_configure(config):
    if config.getoption("--probe-out"):
        config.pluginmanager.register(_Probe(config), "swe-megatron-probe")


class _Probe:
    def __init__(self, config):
        self.out = config.getoption("--probe-out")
        self.timeout = config.getoption("--probe-test-timeout") or 0.0
        select = config.getoption("--probe-select")
        self.select = set(_read_lines(select)) if select else None
        sources = config.getoption("--probe-sources")
        self.sources = {os.path.abspath(p) for p in _read_lines(sources)} if sources else None
        self.outcomes: dict[str, str] = {}
        self.failures: dict[str, dict] = {}
        self.collect_errors: list[str] = []
        self.current: str | None = None
        self.is_lib: dict = {}  # code object -> bool
        self.index: dict = {}  # code object -> func index
        self.funcs: list = []
        self.calls: dict[str, set] = {}
        self.entries: dict[str, set] = {}
        self.edges: set = set()
        self.import_calls: set = set()
        self.exc_types: dict[str, str] = {}
        self.session = None
        if self.sources is not None:
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)

    # -- call tracing ------------------------------------------------------------------------------
    def _lib(self, code) -> bool:
        hit = self.is_lib.get(code)
        if hit is None:
            hit = os.path.abspath(code.co_filename) in self.sources
            self.is_lib[code] = hit
        return hit

    def _id(self, code) -> int:
        i = self.index.get(code)
        if i is None:
            i = self.index[code] = len(self.funcs)
            self.funcs.append(code)
        return i

    def _profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not self._lib(code):
            return
        i = self._id(code)
        caller = frame.f_back
        from_lib = caller is not None and self._lib(caller.f_code)
        if from_lib:
            self.edges.add((self._id(caller.f_code), i))
        if self.current is None:
            self.import_calls.add(i)
        else:
            self.calls[self.current].add(i)
            if not from_lib:
                self.entries[self.current].add(i)

    # -- pytest hooks ------------------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        self.session = session

    def pytest_collection_modifyitems(self, session, config, items):
        if self.select is None:
            return
        keep = [it for it in items if it.nodeid in self.select]
        dropped = [it for it in items if it.nodeid not in self.select]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {_short(str(report.longrepr), 2000)}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        self.calls.setdefault(item.nodeid, set())
        self.entries.setdefault(item.nodeid, set())
        if self.timeout > 0:
            signal.signal(signal.SIGALRM, _raise_timeout)
            signal.setitimer(signal.ITIMER_REAL, self.timeout)

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.current = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        yield
        if call.excinfo is not None and call.when != "teardown":
            self.exc_types.setdefault(item.nodeid, call.excinfo.typename)

    def pytest_runtest_logreport(self, report):
        nodeid, prev = report.nodeid, self.outcomes.get(report.nodeid)
        if report.when == "call":
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            else:
                outcome = report.outcome
            if prev != "error":
                self.outcomes[nodeid] = outcome
        elif report.failed:  # setup or teardown
            self.outcomes[nodeid] = "error"
        elif report.when == "setup" and report.skipped:
            self.outcomes[nodeid] = "skipped"
        if report.failed and nodeid not in self.failures:
            self.failures[nodeid] = _failure(report)
            if self.exc_types.get(nodeid) == "ProbeTimeout" and self.session is not None:
                # One endless test condemns the mutant; do not wait for the others.
                self.session.shouldstop = "a test ran past the probe's time limit"

    def pytest_sessionfinish(self, session, exitstatus):
        if self.sources is not None:
            sys.setprofile(None)
            threading.setprofile(None)
        for nodeid, info in self.failures.items():
            info["type"] = self.exc_types.get(nodeid, info.get("type") or "")
        record = {
            "outcomes": self.outcomes,
            "failures": self.failures,
            "collect_errors": self.collect_errors,
        }
        if self.sources is not None:
            aliases = _public_aliases(self.index, self.sources)
            record.update(
                funcs=[
                    [
                        os.path.abspath(c.co_filename),
                        c.co_firstlineno,
                        c.co_qualname,
                        sorted(aliases.get(c, ())),
                    ]
                    for c in self.funcs
                ],
                calls={k: sorted(v) for k, v in self.calls.items()},
                entries={k: sorted(v) for k, v in self.entries.items()},
                edges=sorted(self.edges),
                import_calls=sorted(self.import_calls),
            )
        tmp = self.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, self.out)


def _raise_timeout(signum, frame):
    raise ProbeTimeout("test ran past the probe's time limit")


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _failure(report) -> dict:
    """What a bug report could quote: the crash message and the failing test line, without file names."""
    longrepr = report.longrepr
    message, source = "", []
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        message = crash.message
    else:
        message = str(longrepr).strip().splitlines()[-1] if str(longrepr).strip() else ""
    tb = getattr(longrepr, "reprtraceback", None)
    entries = getattr(tb, "reprentries", None) or []
    if entries:
        lines = getattr(entries[0], "lines", []) or []
        marked = False
        for line in lines:
            if line.startswith(">"):
                marked = True
                source.append(line[1:].strip())
            elif marked and line.startswith("E"):
                break
            elif marked and line.strip():
                source.append(line.strip())
    output = (getattr(report, "capstdout", "") or "").strip().splitlines()[:40]
    return {"type": "", "message": _short(message, 4000), "source": source[:8], "output": output}


def _unwrap(obj):
    for _ in range(4):
        for attr in ("__wrapped__", "__func__", "func", "fget"):
            inner = getattr(obj, attr, None)
            if inner is not None and inner is not obj:
                obj = inner
                break
        else:
            break
    return getattr(obj, "__code__", None)


def _public_aliases(index: dict, sources: set) -> dict:
    """Code object -> the public names a user could call it by (attributes of the library's top-level modules)."""
    out: dict = {}
    wanted = set(index)
    for modname, mod in sorted(sys.modules.items()):
        if "." in modname or mod is None:
            continue
        path = getattr(mod, "__file__", None)
        if not path or os.path.abspath(path) not in sources:
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, obj in items:
            if name.startswith("_"):
                continue
            try:
                code = _unwrap(obj)
                if code in wanted:
                    out.setdefault(code, set()).add(f"{modname}.{name}")
                if isinstance(obj, type) and getattr(obj, "__module__", "").split(".")[0] == modname:
                    for mname, member in vars(obj).items():
                        if mname.startswith("_") and not (mname.startswith("__") and mname.endswith("__")):
                            continue
                        mcode = _unwrap(member)
                        if mcode in wanted:
                            out.setdefault(mcode, set()).add(f"{modname}.{name}.{mname}")
            except Exception:  # noqa: BLE001 - odd objects (lazy proxies) must not break the record
                continue
    return out
