"""Counts test cases in the test.xml files under each root (default bazel-testlogs): prints 'N passed, N failed, N skipped'.

Bazel counts test targets (and shows a skipped gtest as PASSED); users want test cases.
A target that produced no test.xml with cases (a shell test, a crash) counts as one case.
A target whose cases all passed but whose run failed (it exited non-zero afterwards, e.g. a
sanitizer's leak report at exit; Bazel's test.cache_status beside the test.xml says so) counts
one failed case more, named on stderr. A target that left a test.log but no test.xml counts as
one case: passed if its test.cache_status says so, else failed (named on stderr).
"""
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

roots = sys.argv[1:] or ["bazel-testlogs"]
passed = failed = skipped = 0
paths = [p for root in roots for p in glob.glob(os.path.join(root, "**", "test.xml"), recursive=True)]
# A sharded target (shard_count) has a test.xml per shard under shard_K_of_N/ and one with every
# shard's cases merged beside them: count the merged one.
paths = [
    p for p in paths
    if not (re.fullmatch(r"shard_\d+_of_\d+", os.path.basename(os.path.dirname(p)))
            and os.path.exists(os.path.join(os.path.dirname(os.path.dirname(p)), "test.xml")))
]


def varint(data, i):
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def run_failed(status_path):
    """Whether Bazel's test.cache_status (a TestResultData message) says the run failed.

    Field 2 is test_passed, field 3 the status (1 PASSED, 2 FLAKY); False when unreadable."""
    try:
        with open(status_path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    fields = {}
    i = 0
    try:
        while i < len(data):
            key, i = varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                fields[number], i = varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                length, i = varint(data, i)
                i += length
            elif wire == 5:
                i += 4
            else:
                return False
    except IndexError:
        return False
    if 3 in fields:
        return fields[3] not in (1, 2)
    return fields.get(2, 1) == 0


for path in paths:
    try:
        cases = list(ET.parse(path).getroot().iter("testcase"))
    except ET.ParseError:
        failed += 1
        continue
    case_failed = False
    for tc in cases:
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed += 1
            case_failed = True
        elif tc.find("skipped") is not None or tc.get("result") == "skipped" or tc.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    if not case_failed and run_failed(os.path.join(os.path.dirname(path), "test.cache_status")):
        failed += 1
        print(f"count_tests: {os.path.dirname(path)}: every case passed but the run failed "
              "(see its test.log): counted as one failed case", file=sys.stderr)
# Targets that ran (a test.log) but left no test.xml: one case each.
with_xml = {os.path.dirname(p) for p in paths} | {
    os.path.dirname(os.path.dirname(p)) for p in paths
    if re.fullmatch(r"shard_\d+_of_\d+", os.path.basename(os.path.dirname(p)))}
for root in roots:
    for log in glob.glob(os.path.join(root, "**", "test.log"), recursive=True):
        target = os.path.dirname(log)
        if re.fullmatch(r"shard_\d+_of_\d+", os.path.basename(target)):
            target = os.path.dirname(target)
        if target in with_xml:
            continue
        with_xml.add(target)
        status = os.path.join(target, "test.cache_status")
        if os.path.exists(status) and not run_failed(status):
            passed += 1
        else:
            failed += 1
            print(f"count_tests: {target}: no test.xml (see its test.log): counted as one failed case",
                  file=sys.stderr)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
