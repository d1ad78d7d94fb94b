"""What the flag-range tests of the binaries share: run a binary with bad flags and expect it to
refuse them, before it starts or dials anything, with a message naming the flag."""
import subprocess


def refusal(binary, flags, timeout=60):
    """Runs binary with flags; returns (exit code, stderr + stdout)."""
    p = subprocess.run([binary] + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout


def check_refusals(test, binary, cases):
    """cases: [(flags, text the message must hold)]; each run must exit non-zero with it."""
    for flags, expected in cases:
        with test.subTest(flags=flags):
            code, out = refusal(binary, flags)
            test.assertNotEqual(code, 0, out)
            test.assertIn(expected, out)
