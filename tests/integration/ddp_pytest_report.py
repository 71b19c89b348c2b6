"""A pytest plugin for the ctest entries (one per test file; loaded with `-p ddp_pytest_report`).

It makes what pytest ran visible to ctest and to scripts/test's summary:
- a file whose tests were all skipped exits with SKIP_EXIT (ctest's SKIP_RETURN_CODE), so ctest
  reports it as skipped, never as passed; a file with no test at all is a failure;
- the end of the output says how many passed, failed and were skipped, with each skip's reason;
- with $DDP_TEST_REPORT_DIR set, a JSON record per file (test ids, outcomes, skip reasons) that
  tests/summary.py adds up.
"""
import json
import os
import re

import pytest

SKIP_EXIT = 77  # tests/integration/CMakeLists.txt: SKIP_RETURN_CODE


class _Report:
    def __init__(self):
        self.outcomes = {}  # nodeid -> {"outcome": ..., "reason": ...}

    def record(self, nodeid, outcome, reason=""):
        prev = self.outcomes.get(nodeid)
        # A test that failed in teardown after passing is a failure; keep the worst outcome.
        if prev and prev["outcome"] == "failed":
            return
        self.outcomes[nodeid] = {"outcome": outcome, "reason": reason}

    def counts(self):
        c = {"passed": 0, "failed": 0, "skipped": 0}
        for o in self.outcomes.values():
            c[o["outcome"]] += 1
        return c


_report = _Report()


def _skip_reason(rep):
    # longrepr of a skip is (file, line, "Skipped: reason")
    if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        return re.sub(r"^Skipped: ", "", str(rep.longrepr[2]))
    return str(rep.longrepr)


def pytest_runtest_logreport(report):
    if report.skipped:
        if hasattr(report, "wasxfail"):
            _report.record(report.nodeid, "skipped", f"expected failure: {report.wasxfail}")
        else:
            _report.record(report.nodeid, "skipped", _skip_reason(report))
    elif report.failed:
        _report.record(report.nodeid, "failed", report.when)
    elif report.when == "call":
        _report.record(report.nodeid, "passed")


def pytest_collectreport(report):
    if report.failed:
        _report.record(report.nodeid or "collection", "failed", "collection")


def pytest_sessionfinish(session, exitstatus):
    c = _report.counts()
    directory = os.environ.get("DDP_TEST_REPORT_DIR")
    if directory:
        os.makedirs(directory, exist_ok=True)
        files = sorted({str(p) for p in session.config.args})
        name = os.environ.get("DDP_TEST_NAME") or "pytest." + "_".join(os.path.basename(f) for f in files)
        path = os.path.join(directory, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump({"name": name, "files": files, "counts": c, "tests": _report.outcomes}, f, indent=1)
        os.replace(path + ".tmp", path)
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a file with no test proves nothing
    elif exitstatus == pytest.ExitCode.OK and c["skipped"] > 0 and c["passed"] == 0:
        session.exitstatus = SKIP_EXIT


def pytest_terminal_summary(terminalreporter):
    c = _report.counts()
    tr = terminalreporter
    tr.write_line(f"ddp-report: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    for nodeid, o in sorted(_report.outcomes.items()):
        if o["outcome"] == "skipped":
            tr.write_line(f"ddp-report: SKIPPED {nodeid}: {o['reason']}")
