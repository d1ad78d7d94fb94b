#!/usr/bin/env python3
"""Tests of tools/gpu/summarize.py on a results folder made here, laid out as run_checks.sh
writes one: ratios per round against that round's centralized run, per-step times, the
server's time in its tables, medians and the verdict against 0.7."""

import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import summarize  # noqa: E402


def write_jsonl(path, samples_per_s, steps=1000, compute=0.4, wait=0.0, push=0.5, lent=False,
                exposed=None):
    record = {"type": "done", "worker": 0, "steps": steps, "samples": 64 * steps,
              "samples_per_s": samples_per_s, "compute_s": compute, "wait_s": wait,
              "pull_s": 0.001, "push_s": push, "lent_gradients": lent}
    if exposed is not None:
        record["exposed_comm_s"] = exposed
    with open(path, "w", encoding="utf-8") as f:
        f.write("I20261204 some log line, not json\n")
        f.write(json.dumps({"type": "epoch", "samples_per_s": 1}) + "\n")
        f.write(json.dumps(record) + "\n")


class SummarizeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="summarize_test_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_ratios_are_per_round_and_medians_give_the_verdict(self):
        # Round 1's centralized run: 64,000 samples in 0.32 s, compute 0.25 ms a step.
        write_jsonl(self.path("mlp_centralized_cuda_1.jsonl"), 200000, compute=0.25, push=0.0)
        write_jsonl(self.path("mlp_centralized_cuda_2.jsonl"), 100000)
        # As built: 0.30 and 0.40 of its round. Lent + prefetch: 0.75 and 0.85 (met).
        write_jsonl(self.path("mlp_1x1_cuda_1.jsonl"), 60000)
        write_jsonl(self.path("mlp_1x1_cuda_2.jsonl"), 40000)
        write_jsonl(self.path("mlp_1x1_cuda_prefetch_lend_1.jsonl"), 150000, compute=0.37,
                    wait=0.03, push=0.001, lent=True)
        write_jsonl(self.path("mlp_1x1_cuda_prefetch_lend_2.jsonl"), 85000, lent=True)
        with open(self.path("mlp_1x1_cuda_prefetch_lend_1_server.log"), "w") as f:
            f.write("I20261204 18:44:41.356568  1242 parameter_server.cc:400] time in the "
                    "tables: 1876 pushes, check 32.5 us + apply 98.2 us each; 1877 pulls, "
                    "read 21.4 us each\n")
        lines = summarize.summarize(self.dir)
        text = "\n".join(lines)
        self.assertIn("centralized 1: 200,000 samples/s", text)
        self.assertIn("as built 1: 60,000 samples/s (0.30)", text)
        self.assertIn("as built 2: 40,000 samples/s (0.40)", text)
        lent = [l for l in lines if l.startswith("prefetch_lend 1:")]
        self.assertEqual(len(lent), 1)
        self.assertIn("(0.75)", lent[0])
        self.assertIn("0.370 / 0.030 / 0.001 / 0.001 ms", lent[0])
        self.assertIn("; lent;", lent[0])
        self.assertIn("server 32 + 98 / 21 us", lent[0])
        # Compute 0.370 against 0.250 ms; 0.7x means 0.32 / 0.7 = 0.457 s, of which the run's
        # 0.427 s less its 0.032 s of pull + push + wait leave 0.062 s: 0.062 ms a step.
        self.assertIn("; compute +0.120; exposed 0.032, allowed 0.062", lent[0])
        self.assertIn("centralized 1: 200,000 samples/s, compute 0.250 ms per step", text)
        # As built 1: 1.067 s of training, 0.501 s of it the calls: 0.7x would need them to
        # take 0.457 - 0.566 s, 0.109 s less than none.
        built = [l for l in lines if l.startswith("as built 1:")]
        self.assertIn("; compute +0.150; exposed 0.501, allowed none (0.109 over)", built[0])
        self.assertIn("median as built: 0.35 (0.30-0.40, 2 rounds) vs >= 0.7: not met", text)
        self.assertIn("median prefetch_lend: 0.80 (0.75-0.85, 2 rounds) vs >= 0.7: met", text)

    def test_the_records_exposed_communication_is_taken_when_there(self):
        write_jsonl(self.path("mlp_centralized_cuda_4.jsonl"), 200000, compute=0.25, push=0.0)
        # 0.4 s of training, 0.1 of it exposed by the record (its own phases would say 0.031).
        write_jsonl(self.path("mlp_1x1_cuda_prefetch_4.jsonl"), 160000, wait=0.03, push=0.0,
                    exposed=0.1)
        lines = summarize.summarize(self.dir)
        run = [l for l in lines if l.startswith("prefetch 4:")]
        self.assertEqual(len(run), 1, lines)
        # 0.457 - (0.4 - 0.1) = 0.157 s over 1000 steps.
        self.assertIn("exposed 0.100, allowed 0.157", run[0])

    def test_a_run_without_its_rounds_centralized_run_has_no_ratio(self):
        write_jsonl(self.path("mlp_1x1_cuda_prefetch_3.jsonl"), 50000)
        write_jsonl(self.path("mlp_1x1_cuda_apply_sleep_3.jsonl"), 50000)
        open(self.path("mlp_1x1_cuda_whole_blocks_3.jsonl"), "w").close()  # failed: no record
        lines = summarize.summarize(self.dir)
        self.assertTrue(any(l.startswith("prefetch 3: 50,000 samples/s (no centralized run)")
                            for l in lines), lines)
        self.assertTrue(any(l.startswith("apply_sleep 3:") for l in lines), lines)
        self.assertFalse(any(l.startswith("whole_blocks") for l in lines), lines)
        self.assertFalse(any(l.startswith("median") for l in lines), lines)

    def test_main_refuses_a_missing_folder(self):
        self.assertEqual(summarize.main(["summarize.py", self.path("nothing")]), 2)


if __name__ == "__main__":
    unittest.main()
