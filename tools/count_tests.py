"""Counts test cases in the test.xml files under each root (default bazel-testlogs): prints 'N passed, N failed, N skipped'.

Bazel counts test targets (and shows a skipped gtest as PASSED); users want test cases.
A target that produced no test.xml with cases (a shell test, a crash) counts as one case.
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
for path in paths:
    try:
        cases = list(ET.parse(path).getroot().iter("testcase"))
    except ET.ParseError:
        failed += 1
        continue
    for tc in cases:
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed += 1
        elif tc.find("skipped") is not None or tc.get("result") == "skipped" or tc.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
