#!/usr/bin/env python3
"""One summary of a whole test run: passed, failed, skipped, and each skip with its reason.

    tests/summary.py [--strict] [--known tests/known-skips.txt] LABEL=REPORT_DIR ...

Each REPORT_DIR holds ctest's JUnit file (`ctest.xml`, from `ctest --output-junit`) and the JSON
records that tests/integration/ddp_pytest_report.py writes per pytest file. A ctest entry with a
pytest record counts as its pytest tests; any other entry (a GoogleTest case, a corpus replay)
counts as one test. An entry that failed without a failed test in its record (a timeout, a
crash) counts as one failure of its own.

--strict (CI: root, namespaces allowed) fails the run when anything was skipped other than what
needs a GPU (a skip reason starting with "needs a GPU") or what tests/known-skips.txt names,
each entry there with the reason it cannot run on these machines.

The last line is "N passed, N failed, N skipped". Exit status: 0 when nothing failed (and, with
--strict, nothing was skipped without a reason given), else 1.
"""
import argparse
import fnmatch
import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

GPU_PREFIX = "needs a GPU"


def load_known(path):
    """[(glob, reason)] from lines 'GLOB: reason' (# comments and blank lines ignored)."""
    known = []
    if not path or not path.exists():
        return known
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        glob, sep, reason = line.partition(": ")
        if not sep or not reason.strip():
            sys.exit(f"{path}:{n}: expected 'TEST-ID-GLOB: reason it cannot run here'")
        known.append((glob.strip(), reason.strip()))
    return known


def gtest_skip_reason(output):
    # GTEST_SKIP() << "why" prints "file:line: Skipped\nwhy" before "[  SKIPPED ]"
    m = re.search(r": Skipped\n(.*?)\n", output or "")
    return m.group(1).strip() if m and m.group(1).strip() else "skipped (no reason given)"


def collect(label, directory):
    """[(test id, outcome, reason)] of one report folder."""
    results = []
    junit = directory / "ctest.xml"
    if not junit.exists():
        return [(f"{label}:ctest", "failed", f"no ctest report at {junit} (did ctest run?)")]
    records = {}
    for f in directory.glob("*.json"):
        try:
            rec = json.loads(f.read_text())
            records[rec["name"]] = rec
        except (OSError, ValueError, KeyError):
            continue
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        status = case.get("status", "run")
        failed = case.find("failure") is not None or case.find("error") is not None or status == "fail"
        skipped = case.find("skipped") is not None or status in ("skipped", "notrun", "disabled")
        out = case.findtext("system-out") or ""
        rec = records.get(name)
        prefix = f"{label}:" if label != "release" else ""
        if rec:
            any_failed = False
            for nodeid, o in sorted(rec["tests"].items()):
                test = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
                results.append((f"{prefix}{name}::{test}", o["outcome"], o.get("reason", "")))
                any_failed = any_failed or o["outcome"] == "failed"
            if failed and not any_failed:
                results.append((f"{prefix}{name}", "failed", "the file failed outside its tests (timeout or crash)"))
        elif failed:
            results.append((f"{prefix}{name}", "failed", ""))
        elif skipped:
            reason = gtest_skip_reason(out) if "[  SKIPPED ]" in out else "skipped by ctest"
            results.append((f"{prefix}{name}", "skipped", reason))
        else:
            results.append((f"{prefix}{name}", "passed", ""))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--known", type=pathlib.Path)
    ap.add_argument("dirs", nargs="+", metavar="LABEL=DIR")
    args = ap.parse_args()
    known = load_known(args.known)

    results = []
    for spec in args.dirs:
        label, _, d = spec.partition("=")
        results += collect(label, pathlib.Path(d))

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for _, outcome, _ in results:
        counts[outcome] += 1
    skips = [(t, r) for t, o, r in results if o == "skipped"]
    failures = [(t, r) for t, o, r in results if o == "failed"]
    unexplained = []

    print("\n== summary ==")
    if skips:
        print(f"skipped ({len(skips)}):")
        for test, reason in skips:
            why = next((kr for g, kr in known if fnmatch.fnmatchcase(test, g)), None)
            if reason.startswith(GPU_PREFIX):
                tag = "GPU only"
            elif why:
                tag = f"known: {why}"
            else:
                tag = "NOT EXPECTED HERE"
                unexplained.append(test)
            print(f"  {test}: {reason}  [{tag}]")
    if failures:
        print(f"failed ({len(failures)}):")
        for test, reason in failures:
            print(f"  {test}" + (f": {reason}" if reason else ""))
    stale = [g for g, _ in known if not any(fnmatch.fnmatchcase(t, g) for t, _ in skips)]
    for g in stale:
        print(f"note: known skip '{g}' did not skip in this run")
    status = 1 if failures else 0
    if args.strict and unexplained:
        print(f"strict: {len(unexplained)} skip(s) neither need a GPU nor are listed in "
              f"{args.known}: everything else must run here")
        status = 1
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return status


if __name__ == "__main__":
    sys.exit(main())
