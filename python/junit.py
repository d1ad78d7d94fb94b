"""Runs a module's unittest cases and writes JUnit XML to $XML_OUTPUT_FILE (Bazel's test.xml),
one <testcase> per test method, so that tools/count_tests.py counts each case."""

import sys
import time
import unittest
from xml.sax.saxutils import quoteattr


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (class, name, seconds, kind, text)
        self._start = 0.0

    def startTest(self, test):
        self._start = time.time()
        super().startTest(test)

    def _record(self, test, kind, text=""):
        cls = type(test).__name__
        name = getattr(test, "_testMethodName", str(test))
        self.cases.append((cls, name, time.time() - self._start, kind, text))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def _xml(suite_name, cases):
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>',
           '<testsuite name=%s tests="%d" failures="%d" errors="%d" skipped="%d">' % (
               quoteattr(suite_name), len(cases), sum(c[3] == "failure" for c in cases),
               sum(c[3] == "error" for c in cases), sum(c[3] == "skipped" for c in cases))]
    for cls, name, secs, kind, text in cases:
        body = ""
        if kind in ("failure", "error"):
            body = "<%s message=%s/>" % (kind, quoteattr(text.strip().splitlines()[-1] if text.strip() else kind))
        elif kind == "skipped":
            body = "<skipped message=%s/>" % quoteattr(text)
        out.append('<testcase classname=%s name=%s time="%.3f">%s</testcase>' % (
            quoteattr(cls), quoteattr(name), secs, body))
    out.append("</testsuite></testsuites>\n")
    return "\n".join(out)


def main(module_name):
    """Runs every test of `module_name`; exit status 0 when all passed (skips included)."""
    import os
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2)
    result = runner.run(suite)
    path = os.environ.get("XML_OUTPUT_FILE")
    if path:
        with open(path, "w") as f:
            f.write(_xml(os.path.basename(sys.argv[0]), result.cases))
    sys.exit(0 if result.wasSuccessful() else 1)
