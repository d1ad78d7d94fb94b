#!/usr/bin/env python3
"""The layering rules of docs/design.md, checked with `bazel query` over the build graph.

    python3 tools/check_layering.py [--xml OUT.xml]

Each rule is one query whose answer must be empty; the script prints each rule with PASS or
FAIL (and the offending targets) and exits 1 if any failed. --xml also writes the rules as
JUnit test cases, which tools/test.sh counts with the other tests. Test targets (and testonly
libraries) are exempt: tests/ may depend on anything.
"""
import argparse
import subprocess
import sys
from xml.sax.saxutils import escape

# Production targets of a package: its rules, less tests and testonly ones.
PROD = "(kind(rule, {p}) except kind('.*_test', {p}) except attr(testonly, 1, {p}))"

RULES = [
    ("common_depends_on_nothing_above_it",
     "common/ (the core seam and its start-up plumbing packages) depends on neither kernels/, "
     "server/ nor worker/",
     f"deps({PROD.format(p='//common/...')}) intersect (//kernels/... + //server/... + //worker/...)"),
    ("common_core_free_of_startup_plumbing",
     "common/'s core seam (//common, common/rpc, common/metrics) depends on none of the "
     "start-up plumbing (common/config, common/cluster, common/startup)",
     f"deps({PROD.format(p='(//common:all + //common/rpc/... + //common/metrics/...)')}) intersect "
     "(//common/config/... + //common/cluster/... + //common/startup/...)"),
    ("kernels_free_of_proto",
     "kernels/ depends on common/ only: not on proto/, server/ or worker/",
     f"deps({PROD.format(p='//kernels/...')}) intersect (//proto/... + //server/... + //worker/...)"),
    ("server_free_of_worker",
     "server/ never links worker/",
     f"deps({PROD.format(p='//server/...')}) intersect //worker/..."),
    ("worker_free_of_server_except_its_main",
     "worker/ never links server/, except ps_worker's main (centralized mode)",
     f"deps({PROD.format(p='//worker/...')} except //worker:ps_worker) intersect //server/..."),
    ("only_mains_join_server_and_worker",
     "no library depends on both server/ and worker/: only a *_main binary, or the Python "
     "client (python/, ps_worker's two stores behind one module), composes them",
     "let libs = kind(cc_library, //...) except attr(testonly, 1, //...) except //python/... in "
     "rdeps($libs, //server/...) intersect rdeps($libs, //worker/...)"),
]


def query(expression):
    out = subprocess.run(["bazel", "query", "--noshow_progress", "--output=label", expression],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bazel query failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return [line for line in out.stdout.splitlines() if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xml", help="also write the results as JUnit XML to this file")
    args = parser.parse_args(argv)
    cases = []
    for name, what, expression in RULES:
        try:
            offenders = query(expression)
            error = None
        except RuntimeError as e:
            offenders, error = [], str(e)
        ok = not offenders and error is None
        print(f"layering: {'PASS' if ok else 'FAIL'} {name}: {what}")
        for target in offenders:
            print(f"layering:   offends: {target}")
        if error:
            print(f"layering:   {error}")
        cases.append((name, what, ok, "\n".join(offenders) or error or ""))
    if args.xml:
        failures = sum(1 for c in cases if not c[2])
        with open(args.xml, "w") as f:
            f.write(f'<?xml version="1.0"?>\n<testsuites><testsuite name="layering" '
                    f'tests="{len(cases)}" failures="{failures}">\n')
            for name, what, ok, detail in cases:
                f.write(f'<testcase classname="layering" name="{escape(name)}">')
                if not ok:
                    f.write(f'<failure message="{escape(what, {chr(34): "&quot;"})}">'
                            f'{escape(detail)}</failure>')
                f.write("</testcase>\n")
            f.write("</testsuite></testsuites>\n")
    return 0 if all(c[2] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
