#!/usr/bin/python3
"""The ps package against both stores: the in-process shards (Client.centralized) and real
ps_server processes on 127.0.0.1 port 0 (Client). Every API call, bitwise round trips, bad
input (exact exception and code, nothing changed), zero-copy buffers, the GIL released during a
blocking pull, the torch integration's gradients against finite differences. A restarted
worker's resume, tool clients and ps.cluster's clean-up: client_lifecycle_test.py.

Tables use SGD with learning rate 1 and zero initial values, so that after one push of g the
value is exactly -g (0 - 1 * g is exact in float32): a pull reads back what was pushed, bit for
bit.
"""

import gc
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import junit  # noqa: E402
import ps  # noqa: E402
import ps.cluster  # noqa: E402

try:
    import torch
    import ps.torch as pstorch
except ImportError:
    torch = None

SGD1 = "optimizer { kind: SGD learning_rate: 1.0 }"
DENSE = ["d_roundtrip", "d_out", "d_errors", "d_batch", "d_stats", "d_step", "d_pickle"]
SPARSE = ["s_roundtrip", "s_errors", "s_batch", "s_step", "s_pickle"]


def config_text(num_workers=1, staleness=None, extra=""):
    lines = ['name: "python-client-test"', "cluster { num_servers: 2 num_workers: %d dense_block_floats: 8 }" % num_workers]
    for name in DENSE:
        lines.append('tables { name: "%s" kind: TABLE_KIND_DENSE shape: [5, 7] %s }' % (name, SGD1))
    for name in SPARSE:
        lines.append('tables { name: "%s" kind: TABLE_KIND_SPARSE dim: 6 %s }' % (name, SGD1))
    lines.append('tables { name: "lin.weight" kind: TABLE_KIND_DENSE shape: [5, 7] %s }' % SGD1)
    lines.append('tables { name: "lin.bias" kind: TABLE_KIND_DENSE shape: [5] %s }' % SGD1)
    lines.append('tables { name: "emb" kind: TABLE_KIND_SPARSE dim: 4 initializer { kind: NORMAL stddev: 0.5 } %s }' % SGD1)
    if staleness is not None:
        lines.append("training { staleness: %d }" % staleness)
    lines.append("server { max_pull_wait_s: 60 }")
    lines.append("security { plaintext: true }")
    return "\n".join(lines) + "\n" + extra


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class ContractTests:
    """Every test runs against self.client (a fresh store per class, worker 0)."""

    client = None

    def test_tables_describe_the_config(self):
        t = self.client.tables
        self.assertEqual(t["d_out"], ps.TableInfo("d_out", "dense", (5, 7)))
        self.assertEqual(t["s_roundtrip"], ps.TableInfo("s_roundtrip", "sparse", (6,)))

    def test_dense_push_then_pull_round_trips_bitwise(self):
        g = rand((5, 7), 1)
        self.client.push_dense("d_roundtrip", g)
        got = self.client.pull_dense("d_roundtrip")
        self.assertEqual(got.dtype, np.float32)
        self.assertEqual(got.shape, (5, 7))
        self.assertEqual(got.tobytes(), (-g).tobytes())

    def test_pull_writes_into_the_callers_array(self):
        out = np.full((5, 7), 42, np.float32)
        got = self.client.pull_dense("d_out", out=out)
        self.assertIs(got, out)
        self.assertTrue(np.all(out == 0))
        flat = np.full(35, 42, np.float32)  # any shape of the right size
        self.client.pull_dense("d_out", out=flat)
        self.assertTrue(np.all(flat == 0))
        rows = np.full((3, 6), 42, np.float32)
        self.assertIs(self.client.pull_sparse("s_roundtrip", np.array([901, 902, 903], np.uint64), out=rows), rows)
        self.assertTrue(np.all(rows == 0))

    def test_new_pull_arrays_own_their_buffer(self):
        got = self.client.pull_dense("d_out")
        self.assertTrue(got.flags.owndata and got.flags.c_contiguous and got.flags.writeable)

    def test_sparse_push_then_pull_round_trips_bitwise_with_duplicate_keys(self):
        keys = np.array([3, 1 << 63, 12345678901234], np.uint64)
        g = rand((3, 6), 2)
        self.client.push_sparse("s_roundtrip", keys, g)
        got = self.client.pull_sparse("s_roundtrip", np.array([12345678901234, 3, 3, 1 << 63], np.uint64))
        self.assertEqual(got.shape, (4, 6))
        self.assertEqual(got.tobytes(), (-g[[2, 0, 0, 1]]).tobytes())

    def test_batched_pull_and_push_cover_several_tables(self):
        keys = np.array([7, 8], np.uint64)
        gd, gs = rand((5, 7), 3), rand((2, 6), 4)
        self.client.push(dense={"d_batch": gd}, sparse={"s_batch": (keys, gs)})
        got = self.client.pull(dense=["d_batch"], sparse={"s_batch": keys})
        self.assertEqual(got["d_batch"].tobytes(), (-gd).tobytes())
        self.assertEqual(got["s_batch"].tobytes(), (-gs).tobytes())

    def test_fused_step_pushes_ends_the_step_and_pulls_what_it_pushed(self):
        keys = np.array([3, 9], np.uint64)
        gd, gs = rand((5, 7), 5), rand((2, 6), 6)
        start = self.client.steps
        out = np.empty((5, 7), np.float32)
        got = self.client.step(push_dense={"d_step": gd}, push_sparse={"s_step": (keys, gs)},
                               pull_dense={"d_step": out}, pull_sparse={"s_step": keys})
        self.assertIs(got["d_step"], out)  # into the caller's array
        self.assertEqual(out.tobytes(), (-gd).tobytes())  # the pull sees the push (SGD, lr 1)
        self.assertEqual(got["s_step"].tobytes(), (-gs).tobytes())
        self.assertEqual(self.client.steps, start + 1)
        for s in self.client.stats():
            clocks = {int(w.get("worker_id", 0)): int(w["clock"]) for w in s["worker_clocks"]}
            self.assertEqual(clocks[0], start + 1)
        # A step without gradients still ends the step.
        self.client.step(pull_dense=["d_step"])
        self.assertEqual(self.client.steps, start + 2)
        # Bad input is refused before anything is sent: the clock stays.
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.step,
                              push_dense={"d_step": np.zeros((5, 7), np.float64)}, pull_dense=["d_step"])
        self.assertEqual(self.client.steps, start + 2)

    def assertRaisesCode(self, cls, code_name, fn, *args, **kwargs):
        with self.assertRaises(cls) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code_name, code_name)
        self.assertEqual(cm.exception.code, {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5,
                                             "FAILED_PRECONDITION": 9}[code_name])
        self.assertTrue(cm.exception.message)
        return cm.exception

    def test_arrays_that_came_through_pickle_are_taken(self):
        # Their dtype objects are their own (as a DataLoader worker's arrays are): equal to
        # float32 and uint64, not the same objects. (Refused as "dtype float32, expected
        # float32" before 2026-12-05.)
        g = pickle.loads(pickle.dumps(rand((5, 7), 3)))
        self.assertIsNot(g.dtype, np.dtype(np.float32))
        self.client.push_dense("d_pickle", g)
        out = pickle.loads(pickle.dumps(np.zeros((5, 7), np.float32)))
        self.assertEqual(self.client.pull_dense("d_pickle", out=out).tobytes(), (-g).tobytes())
        keys = pickle.loads(pickle.dumps(np.array([11, 12], np.uint64)))
        self.assertIsNot(keys.dtype, np.dtype(np.uint64))
        gs = pickle.loads(pickle.dumps(rand((2, 6), 4)))
        self.client.push_sparse("s_pickle", keys, gs)
        self.assertEqual(self.client.pull_sparse("s_pickle", keys).tobytes(), (-gs).tobytes())

    def test_arrays_of_another_shape_are_refused(self):
        # The right size in another shape (a transposed gradient) would scramble the rows;
        # flat arrays of the right size are taken. (Only the size was checked before
        # 2026-12-05.)
        keys = np.array([1, 2, 3], np.uint64)
        before = self.client.pull_sparse("s_errors", keys)
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.push_sparse, "s_errors", keys,
                                  np.ones((6, 3), np.float32))
        self.assertIn("shape (6, 3), expected (3, 6)", e.message)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.push_dense, "d_errors",
                              np.ones((7, 5), np.float32))
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_sparse, "s_errors", keys,
                              out=np.zeros((6, 3), np.float32))
        self.assertEqual(self.client.pull_sparse("s_errors", keys).tobytes(), before.tobytes())
        flat = self.client.pull_dense("d_errors", out=np.zeros(35, np.float32))
        self.assertEqual(flat.shape, (35,))

    @unittest.skipIf(torch is None, "needs torch")
    def test_pulls_into_a_tensor_return_that_tensor(self):
        keys = np.array([4, 5], np.uint64)
        out = torch.zeros((2, 6))
        self.assertIs(self.client.pull_sparse("s_roundtrip", keys, out=out), out)
        dense = torch.zeros((5, 7))
        got = self.client.pull(dense={"d_out": dense}, sparse={"s_roundtrip": (keys, out)})
        self.assertIs(got["d_out"], dense)
        self.assertIs(got["s_roundtrip"], out)

    def test_unaligned_arrays_are_refused(self):
        raw = bytearray(4 * 35 + 1)
        odd = np.frombuffer(raw, np.float32, count=35, offset=1)
        self.assertFalse(odd.flags.aligned)
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_dense, "d_errors", out=odd)
        self.assertIn("aligned", e.message)
        keys = np.frombuffer(bytearray(8 * 2 + 1), np.uint64, count=2, offset=1)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_sparse, "s_errors", keys)

    def test_bad_dense_input_raises_invalid_argument_and_changes_nothing(self):
        before = self.client.pull_dense("d_errors")
        c = self.client
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_dense, "d_errors",
                                  np.ones((5, 7), np.float64))
        self.assertIn("float32", e.message)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_dense, "d_errors", np.ones((5, 6), np.float32))
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_dense, "d_errors",
                                  np.ones((5, 14), np.float32)[:, ::2])
        self.assertIn("contiguous", e.message)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.pull_dense, "d_errors", out=np.ones(35, np.float64))
        ro = np.zeros(35, np.float32)
        ro.flags.writeable = False
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.pull_dense, "d_errors", out=ro)
        nan = np.zeros((5, 7), np.float32)
        nan[2, 3] = np.nan
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_dense, "d_errors", nan)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_dense, "s_errors", np.ones(6, np.float32))
        # (A batch with one bad table is refused, but across servers the others' parts may be
        # applied: each server checks its own part, as common/parameter_store.h says.)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push, dense={"d_batch": nan})
        self.assertEqual(c.pull_dense("d_errors").tobytes(), before.tobytes())

    def test_bad_sparse_input_raises_invalid_argument_and_changes_nothing(self):
        keys = np.array([5, 6], np.uint64)
        before = self.client.pull_sparse("s_errors", keys)
        c = self.client
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_sparse, "s_errors",
                              keys.astype(np.int64), np.ones((2, 6), np.float32))
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_sparse, "s_errors", keys,
                              np.ones((2, 5), np.float32))
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_sparse, "s_errors", keys,
                              np.ones((2, 12), np.float32)[:, ::2])
        nan = np.ones((2, 6), np.float32)
        nan[1, 5] = np.inf
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.push_sparse, "s_errors", keys, nan)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", c.pull_sparse, "s_errors",
                              np.array([[5, 6]], np.uint64))
        self.assertEqual(c.pull_sparse("s_errors", keys).tobytes(), before.tobytes())

    def test_a_table_name_that_is_not_a_str_raises_invalid_argument(self):
        # (A RuntimeError of pybind11's before 2026-12-06; bytes were taken as a name.)
        g = np.ones((5, 7), np.float32)
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_dense, 5)
        self.assertIn("table name must be a str, not int", e.message)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.push_dense, b"d_errors", g)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull, dense={("d", 1): None})
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.push_sparse, 7,
                              np.array([1], np.uint64), np.ones((1, 6), np.float32))

    @unittest.skipIf(torch is None, "needs torch")
    def test_out_tensors_that_are_not_cpu_float32_raise_invalid_argument(self):
        # torch's own .numpy() raised TypeError for these before 2026-12-06. (A tensor on the
        # "meta" device stands for a GPU's: neither lives in this process's memory.)
        keys = np.array([1, 2], np.uint64)
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_dense, "d_out",
                                  out=torch.zeros((5, 7), device="meta"))
        self.assertIn("pull_dense d_out out: a tensor on meta; expected a CPU float32 tensor", e.message)
        e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull_sparse, "s_errors", keys,
                                  out=torch.zeros((2, 6), dtype=torch.bfloat16))
        self.assertIn("torch.bfloat16", e.message)
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.pull,
                              dense={"d_out": torch.zeros((5, 7), dtype=torch.float64)})
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.step,
                              pull_sparse={"s_errors": (keys, torch.zeros((2, 6), dtype=torch.bfloat16))})
        # A gradient torch cannot give numpy: the same error.
        self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", self.client.push_dense, "d_errors",
                              torch.zeros((5, 7), dtype=torch.bfloat16))

    def test_unknown_table_raises_not_found(self):
        self.assertRaisesCode(ps.NotFound, "NOT_FOUND", self.client.pull_dense, "no_such_table")
        self.assertRaisesCode(ps.NotFound, "NOT_FOUND", self.client.push_sparse, "no_such_table",
                              np.array([1], np.uint64), np.ones((1, 6), np.float32))

    def test_stats_count_pushes_and_rejections(self):
        before = self.client.stats()
        self.assertEqual(len(before), 2)
        self.client.push_dense("d_stats", np.ones((5, 7), np.float32))
        nan = np.full((5, 7), np.nan, np.float32)
        with self.assertRaises(ps.InvalidArgument):
            self.client.push_dense("d_stats", nan)
        after = self.client.stats()
        self.assertEqual(sorted(s["server_index"] for s in after), [0, 1])
        self.assertGreater(sum(int(s["pushes"]) for s in after), sum(int(s["pushes"]) for s in before))
        rejected = sum(int(s["rejected"].get("nonfinite", 0)) for s in after)
        self.assertGreater(rejected, sum(int(s["rejected"].get("nonfinite", 0)) for s in before))

    def test_clock_advances_and_the_servers_hear_it(self):
        start = self.client.steps
        self.assertEqual(self.client.clock(), start + 1)
        self.assertEqual(self.client.clock(), start + 2)
        self.assertEqual(self.client.steps, start + 2)
        for s in self.client.stats():
            clocks = {int(w.get("worker_id", 0)): int(w["clock"]) for w in s["worker_clocks"]}
            self.assertEqual(clocks[0], start + 2)

    def test_checkpoint_writes_one_per_server(self):
        result = self.client.checkpoint()
        self.assertEqual(len(result), 2)
        for r in result:
            self.assertGreaterEqual(int(r["checkpoint_id"]), 1)
        stats = self.client.stats()
        self.assertTrue(all(int(s["checkpoints_written"]) >= 1 for s in stats))

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_dense_parameters_pull_in_place_and_push_the_autograd_gradients(self):
        model = torch.nn.Linear(7, 5)  # tables lin.weight (5, 7) and lin.bias (5,)
        self.client.push(dense={"lin.weight": rand((5, 7), 8), "lin.bias": rand(5, 9)})
        params = pstorch.DenseParameters(self.client, model, prefix="lin.")
        storage = model.weight.data_ptr()
        params.pull()
        self.assertEqual(model.weight.data_ptr(), storage)  # written in place
        before = {n: self.client.pull_dense(n) for n in ("lin.weight", "lin.bias")}
        self.assertEqual(model.weight.detach().numpy().tobytes(), before["lin.weight"].tobytes())
        model(torch.from_numpy(rand((3, 7), 5))).pow(2).sum().backward()
        grads = {"lin.weight": model.weight.grad.numpy().copy(), "lin.bias": model.bias.grad.numpy().copy()}
        params.push()
        self.assertIsNone(model.weight.grad)
        for n in grads:
            np.testing.assert_allclose(before[n] - self.client.pull_dense(n), grads[n], rtol=1e-5, atol=1e-5)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_embedding_bag_gradient_matches_finite_differences(self):
        emb = pstorch.EmbeddingBag(self.client, "emb", mode="sum")
        keys = np.array([11, 12, 11, 13, 14, 12], np.uint64)
        offsets = np.array([0, 2, 3])
        weights = torch.from_numpy(rand((3, 4), 6)).double()
        unique, inverse = np.unique(keys, return_inverse=True)
        rows0 = self.client.pull_sparse("emb", unique).astype(np.float64)

        def loss_of(rows):
            bags = torch.nn.functional.embedding_bag(torch.from_numpy(inverse.astype(np.int64)),
                                                     torch.from_numpy(rows), torch.from_numpy(offsets), mode="sum")
            return float((torch.tanh(bags) * weights).sum())

        out = emb(keys, offsets)
        (torch.tanh(out.double()) * weights).sum().backward()  # pushes the row gradients (SGD, lr 1)
        pushed = rows0 - self.client.pull_sparse("emb", unique).astype(np.float64)
        numeric = np.zeros_like(rows0)
        eps = 1e-4
        for i in np.ndindex(*rows0.shape):
            up, down = rows0.copy(), rows0.copy()
            up[i] += eps
            down[i] -= eps
            numeric[i] = (loss_of(up) - loss_of(down)) / (2 * eps)
        np.testing.assert_allclose(pushed, numeric, rtol=1e-3, atol=1e-5)


@unittest.skipIf(torch is None, "torch is not installed")
class TorchHelpersTest(unittest.TestCase):
    """ps.torch's tables_text and DenseParameters against a centralized store."""

    @staticmethod
    def client_for(model, optimizer):
        return ps.Client.centralized('name: "torch-helpers" cluster { num_servers: 1 num_workers: 1 }\n' +
                                     pstorch.tables_text(model, optimizer=optimizer) +
                                     "\nsecurity { plaintext: true }\n")

    def test_tables_text_starts_layers_as_torch_does(self):
        # Before, every table that was not 2-D started at zero: a convolution's output, and a
        # LayerNorm's, were zero, so no gradient reached the convolution.
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
        with self.client_for(model, "kind: SGD learning_rate: 0.1") as c:
            conv = c.pull_dense("0.weight")
            bound = 1.0 / np.sqrt(2 * 3 * 3)
            self.assertTrue(np.all(np.abs(conv) <= bound))
            self.assertGreater(np.abs(conv).max(), bound / 2)
            self.assertEqual(len(np.unique(conv)), conv.size)
            np.testing.assert_array_equal(c.pull_dense("1.weight"), np.ones(6, np.float32))
            for bias in ("0.bias", "1.bias", "2.bias"):
                self.assertFalse(c.pull_dense(bias).any(), bias)
            self.assertTrue(c.pull_dense("2.weight").all())

    def test_a_parameter_without_a_gradient_is_not_pushed(self):
        # A frozen bias under weight decay: a zero gradient pushed for it (before) moved it.
        model = torch.nn.Linear(7, 5)
        with self.client_for(model, "kind: SGD learning_rate: 0.1 weight_decay: 0.5") as c:
            c.push(dense={"bias": rand(5, 3)})  # a bias that decay would move
            params = pstorch.DenseParameters(c, model)
            params.pull()
            weight, bias = c.pull_dense("weight"), c.pull_dense("bias")
            model.bias.requires_grad_(False)
            model(torch.from_numpy(rand((3, 7), 4))).pow(2).sum().backward()
            params.push()
            c.clock()
            np.testing.assert_array_equal(c.pull_dense("bias"), bias)
            self.assertFalse(np.array_equal(c.pull_dense("weight"), weight))


class CentralizedTest(ContractTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data_dir = tempfile.mkdtemp(prefix="ps-py-central-", dir=os.environ.get("TEST_TMPDIR"))
        cls.client = ps.Client.centralized(config_text(), data_dir=cls.data_dir)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        shutil.rmtree(cls.data_dir, ignore_errors=True)

    def test_checkpoint_without_data_dir_raises_failed_precondition(self):
        with ps.Client.centralized(config_text()) as c:
            self.assertRaisesCode(ps.FailedPrecondition, "FAILED_PRECONDITION", c.checkpoint)

    def test_a_new_client_resumes_from_the_data_dirs_checkpoint(self):
        d = tempfile.mkdtemp(prefix="ps-py-resume-", dir=os.environ.get("TEST_TMPDIR"))
        try:
            g = rand((5, 7), 7)
            with ps.Client.centralized(config_text(), data_dir=d) as c:
                c.push_dense("d_roundtrip", g)
                c.checkpoint()
            with ps.Client.centralized(config_text(), data_dir=d) as c:
                self.assertEqual(c.pull_dense("d_roundtrip").tobytes(), (-g).tobytes())
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_a_new_client_resumes_the_clock_and_position_of_the_data_dirs_checkpoint(self):
        d = tempfile.mkdtemp(prefix="ps-py-resume-", dir=os.environ.get("TEST_TMPDIR"))
        try:
            with ps.Client.centralized(config_text(), data_dir=d) as c:
                self.assertEqual(c.position(), ps.Position(0, 0, 0))
                for _ in range(3):
                    c.clock()
                self.assertEqual(c.report_position(2, 7), ps.Position(2, 7, 3))
                c.checkpoint()
            with ps.Client.centralized(config_text(), data_dir=d) as c:
                self.assertEqual(c.steps, 3)  # 0 before 2026-12-06
                self.assertEqual(c.position(), ps.Position(2, 7, 3))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_a_path_config_and_data_dir_are_taken(self):
        # A pathlib.Path raised TypeError before 2026-12-06 ("argument of type 'PosixPath' is
        # not iterable").
        d = pathlib.Path(tempfile.mkdtemp(prefix="ps-py-path-", dir=os.environ.get("TEST_TMPDIR")))
        try:
            path = d / "job.textproto"
            path.write_text(config_text())
            with ps.Client.centralized(path, data_dir=d / "data") as c:
                self.assertEqual(len(c.checkpoint()), 2)
            self.assertTrue((d / "data").is_dir())
            with self.assertRaises(ps.NotFound):
                ps.Client.centralized(d / "missing.textproto")
            e = self.assertRaisesCode(ps.InvalidArgument, "INVALID_ARGUMENT", ps.Client.centralized, 42)
            self.assertIn("not int", e.message)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_config_errors_raise_with_their_codes(self):
        with self.assertRaises(ps.NotFound):
            ps.Client.centralized("/nonexistent/job.textproto")
        with self.assertRaises(ps.InvalidArgument):
            ps.Client.centralized('name: "x"\ntables { name: "t" kind: TABLE_KIND_DENSE shape: [-1] }\n')


class ServersTest(ContractTests, unittest.TestCase):
    """Two ps_server processes on 127.0.0.1 port 0."""

    @classmethod
    def setUpClass(cls):
        cls.path = os.path.join(tempfile.mkdtemp(prefix="ps-py-srv-", dir=os.environ.get("TEST_TMPDIR")), "job.textproto")
        with open(cls.path, "w") as f:
            f.write(config_text())
        cls.servers = ps.cluster.LocalServers(cls.path, num_servers=2).start()
        cls.client = ps.Client(cls.path, servers=cls.servers.addresses, worker_index=0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.servers.stop()
        shutil.rmtree(os.path.dirname(cls.path), ignore_errors=True)

    def test_wrong_worker_index_raises_invalid_argument(self):
        with self.assertRaises(ps.InvalidArgument):
            ps.Client(self.path, servers=self.servers.addresses, worker_index=1)

    def test_servers_with_another_layout_raise_failed_precondition(self):
        other = self.path + ".other"
        with open(other, "w") as f:
            f.write(config_text().replace("dense_block_floats: 8", "dense_block_floats: 16"))
        self.assertRaisesCode(ps.FailedPrecondition, "FAILED_PRECONDITION", ps.Client, other,
                              servers=self.servers.addresses, worker_index=0, wait_for_servers_s=30)


class BspGilTest(unittest.TestCase):
    """Two workers under BSP (staleness 0) on real servers: worker 0's pull of its next step
    blocks until worker 1 finishes its step, and only a second Python thread can do that."""

    def test_a_second_thread_runs_while_a_pull_blocks(self):
        root = tempfile.mkdtemp(prefix="ps-py-bsp-", dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(root, "job.textproto")
        with open(path, "w") as f:
            f.write(config_text(num_workers=2, staleness=0))
        switch = sys.getswitchinterval()
        try:
            with ps.cluster.LocalServers(path, num_servers=2) as servers:
                w0 = ps.Client(path, servers=servers.addresses, worker_index=0)
                w1 = ps.Client(path, servers=servers.addresses, worker_index=1)
                w0.clock()  # worker 0 is at clock 1, worker 1 at 0: w0's next pull must wait
                go = threading.Event()
                ran = []

                def other():
                    go.wait()
                    ran.append(w1.steps)  # runs only if the pull below let go of the GIL
                    w1.clock()

                t = threading.Thread(target=other)
                t.start()
                # The main thread keeps the GIL unless it blocks or releases it (no time slicing).
                sys.setswitchinterval(1000)
                go.set()
                got = w0.pull_dense("d_out")
                sys.setswitchinterval(switch)
                t.join()
                self.assertEqual(ran, [0])
                self.assertEqual(got.shape, (5, 7))
                w0.close()
                w1.close()
        finally:
            sys.setswitchinterval(switch)
            shutil.rmtree(root, ignore_errors=True)


class ClosedClientTest(unittest.TestCase):
    def test_a_closed_client_raises_failed_precondition(self):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as root:
            path = os.path.join(root, "job.textproto")
            with open(path, "w") as f:
                f.write(config_text())
            c = ps.Client.centralized(path)
            c.close()
            c.close()  # idempotent
            with self.assertRaises(ps.FailedPrecondition):
                c.pull_dense("d_out")

    def test_the_bodys_exception_is_not_replaced_by_a_failed_finish(self):
        root = tempfile.mkdtemp(prefix="ps-py-exit-", dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(root, "job.textproto")
        with open(path, "w") as f:
            f.write(config_text(extra="rpc { max_retries: 0 deadline_s: 2 }"))
        try:
            with ps.cluster.LocalServers(path, num_servers=2) as servers:
                client = ps.Client(path, servers=servers.addresses, worker_index=0)
            # The servers are gone: finish() fails, the body's own exception comes out.
            with self.assertRaises(KeyError):
                with client:
                    raise KeyError("the body's")
            with self.assertRaises(ps.FailedPrecondition):
                client.clock()
        finally:
            shutil.rmtree(root, ignore_errors=True)


class StepRetryTest(unittest.TestCase):
    """A step whose pull failed leaves the clock where it was, so it can be taken again."""

    def test_a_step_whose_pull_failed_does_not_move_the_clock(self):
        root = tempfile.mkdtemp(prefix="ps-py-step-", dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(root, "job.textproto")
        with open(path, "w") as f:
            f.write(config_text(num_workers=2, staleness=0).replace("max_pull_wait_s: 60", "max_pull_wait_s: 1")
                    + "rpc { max_retries: 0 }\n")
        try:
            with ps.cluster.LocalServers(path, num_servers=2) as servers:
                w0 = ps.Client(path, servers=servers.addresses, worker_index=0)
                w1 = ps.Client(path, servers=servers.addresses, worker_index=1)
                w0.clock()
                # Its next pull waits for worker 1's first step, which does not come in time.
                with self.assertRaises(ps.DeadlineExceeded):
                    w0.step(pull_dense=["d_step"])
                self.assertEqual(w0.steps, 1)  # (2 before 2026-12-05: a step was skipped)
                w1.clock()
                w1.clock()  # the pull of w0's step 2 waits for every worker's step 2
                self.assertEqual(w0.step(pull_dense=["d_step"])["d_step"].shape, (5, 7))
                self.assertEqual(w0.steps, 2)
                w0.close()
                w1.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)


class DestructorGilTest(unittest.TestCase):
    """A client collected after its servers went away tells them it finished, retried with
    back-off: other Python threads run meanwhile (before 2026-12-05 it held the GIL all along,
    minutes with the default retries)."""

    def test_a_second_thread_runs_while_a_client_is_destroyed(self):
        root = tempfile.mkdtemp(prefix="ps-py-del-", dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(root, "job.textproto")
        with open(path, "w") as f:
            f.write(config_text(extra="rpc { max_retries: 3 initial_backoff_s: 0.2 max_backoff_s: 0.2 }"))
        switch = sys.getswitchinterval()
        try:
            with ps.cluster.LocalServers(path, num_servers=2) as servers:
                client = ps.Client(path, servers=servers.addresses, worker_index=0)
            # The servers are gone: the client's end retries its Finish for about 0.6 s.
            go = threading.Event()
            ran = []

            def other():
                go.wait()
                ran.append(1)  # runs only if the destruction below lets go of the GIL

            t = threading.Thread(target=other)
            t.start()
            # The main thread keeps the GIL unless it blocks or releases it (no time slicing).
            sys.setswitchinterval(1000)
            go.set()
            del client
            gc.collect()
            ran_during = list(ran)
            sys.setswitchinterval(switch)
            t.join()
            self.assertEqual(ran_during, [1])
        finally:
            sys.setswitchinterval(switch)
            shutil.rmtree(root, ignore_errors=True)


def find_make_certs():
    for base in (os.path.join(os.environ.get("TEST_SRCDIR", ""), "ps"), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
        path = os.path.join(base, "tools", "make_certs.sh")
        if os.path.exists(path):
            return path
    return None


@unittest.skipIf(find_make_certs() is None or shutil.which("openssl") is None, "needs tools/make_certs.sh and openssl")
class TlsTest(unittest.TestCase):
    """A ps_server with mutual TLS and a bearer token; the client's TLS options override a
    plaintext config."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="ps-py-tls-", dir=os.environ.get("TEST_TMPDIR"))
        cls.certs = os.path.join(cls.root, "certs")
        subprocess.run(["bash", find_make_certs(), cls.certs, "127.0.0.1"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(cls.root, "wrong_token.txt"), "w") as f:
            f.write("not-the-token\n")
        server_security = 'security { ca_cert: "%s" cert: "%s" key: "%s" token_file: "%s" }' % tuple(
            os.path.join(cls.certs, n) for n in ("ca.pem", "server.pem", "server.key", "token.txt"))
        cls.server_config = os.path.join(cls.root, "server.textproto")
        with open(cls.server_config, "w") as f:
            f.write(config_text().replace("security { plaintext: true }", server_security))
        cls.plain_config = os.path.join(cls.root, "client.textproto")
        with open(cls.plain_config, "w") as f:
            f.write(config_text())
        # Several tests here finish worker 0 (the job's only worker); the servers must outlive
        # that, or the tests after it find no server.
        cls.servers = ps.cluster.LocalServers(cls.server_config, num_servers=2,
                                              server_args=["--exit_when_done=false"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.servers.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    def tls(self, token="token.txt", stem="client"):
        """TLS options with the certificate pair `stem`: client (no role, read only), worker-0,
        or operator (admin calls)."""
        return dict(plaintext=False, ca_cert=os.path.join(self.certs, "ca.pem"),
                    cert=os.path.join(self.certs, stem + ".pem"), key=os.path.join(self.certs, stem + ".key"),
                    token_file=os.path.join(self.certs, token) if token == "token.txt" else token)

    def test_tls_options_connect_and_round_trip(self):
        with ps.Client(self.plain_config, servers=self.servers.addresses, worker_index=0,
                       **self.tls(stem="worker-0")) as c:
            g = rand((5, 7), 10)
            c.push_dense("d_roundtrip", g)
            self.assertEqual(c.pull_dense("d_roundtrip").tobytes(), (-g).tobytes())

    def test_client_certificate_cannot_act_as_a_worker_or_checkpoint(self):
        # The client-only certificate names no role: it may read, never act as worker 0. A
        # worker's client asks where it stood when created (a heartbeat as worker 0), so it is
        # refused there (before 2026-12-06: at its first push).
        with self.assertRaises(ps.PermissionDenied):
            ps.Client(self.plain_config, servers=self.servers.addresses, worker_index=0, **self.tls())
        with ps.Client(self.plain_config, servers=self.servers.addresses, worker_index=-1, **self.tls()) as c:
            self.assertEqual(c.pull_dense("d_out").shape, (5, 7))
            with self.assertRaises(ps.PermissionDenied):
                c.checkpoint()

    def test_wrong_token_is_refused(self):
        with self.assertRaises(ps.Unauthenticated) as cm:
            ps.Client(self.plain_config, servers=self.servers.addresses, worker_index=-1, wait_for_servers_s=5,
                      **self.tls(token=os.path.join(self.root, "wrong_token.txt")))
        self.assertEqual(cm.exception.code, 16)
        self.assertIn("token", cm.exception.message)

    def test_stats_and_checkpoint_go_over_tls(self):
        with ps.Client(self.plain_config, servers=self.servers.addresses, worker_index=-1,
                       **self.tls(stem="operator")) as c:
            self.assertEqual(len(c.stats()), 2)
            self.assertTrue(all(int(r["checkpoint_id"]) >= 1 for r in c.checkpoint()))


class ErrorsTest(unittest.TestCase):
    def test_every_code_has_its_class(self):
        for code in range(1, 17):
            e = ps.errors.from_status(code, "m")
            self.assertIsInstance(e, ps.Error)
            self.assertEqual(e.code, code)
            self.assertEqual(e.message, "m")
        self.assertIsInstance(ps.errors.from_status(14, "down"), ps.Unavailable)
        self.assertEqual(str(ps.errors.from_status(3, "bad")), "INVALID_ARGUMENT: bad")


class BlasCoreTest(unittest.TestCase):
    AVX512 = ["sse2", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"]

    def test_a_set_without_avx_on_a_cpu_with_it_gets_the_best_set_the_cpu_runs(self):
        self.assertEqual(ps.cluster.better_blas_core("Prescott", self.AVX512), "SkylakeX")
        self.assertEqual(ps.cluster.better_blas_core("Prescott", ["avx", "avx2", "fma"]), "Haswell")
        self.assertEqual(ps.cluster.better_blas_core("NEHALEM", ["avx"]), "Sandybridge")
        self.assertEqual(ps.cluster.better_blas_core("Barcelona", ["avx", "avx2", "fma"]), "Haswell")

    def test_an_avx_set_or_a_cpu_without_avx_is_left_alone(self):
        for chosen in ("Haswell", "SkylakeX", "Cooperlake", "Zen", "", None):
            self.assertIsNone(ps.cluster.better_blas_core(chosen, self.AVX512), chosen)
        self.assertIsNone(ps.cluster.better_blas_core("Prescott", ["sse2", "sse3"]))
        self.assertIsNone(ps.cluster.better_blas_core("Prescott", ["avx2"]))  # no FMA, no AVX

    def test_partial_avx512_or_avx2_without_fma_gets_less(self):
        knights_landing = ["avx", "avx2", "fma", "avx512f", "avx512cd", "avx512er", "avx512pf"]
        self.assertEqual(ps.cluster.better_blas_core("Prescott", knights_landing), "Haswell")
        self.assertEqual(ps.cluster.better_blas_core("Prescott", ["avx", "avx2"]), "Sandybridge")

    class FakeOpenBlas:
        def __init__(self, config, core):
            self.openblas_get_config = lambda: config
            self.openblas_get_corename = lambda: core

    def environment(self, library, flags=None, environ=None):
        def cdll(name):
            if isinstance(library, Exception):
                raise library
            return library
        with mock.patch("ps.cluster.ctypes.CDLL", side_effect=cdll), \
                mock.patch("ps.cluster._cpu_flags", return_value=flags or self.AVX512):
            return ps.cluster.blas_core_environment({} if environ is None else environ)

    def test_the_environment_names_the_better_set_of_a_dynamic_openblas(self):
        dynamic = b"OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64"
        self.assertEqual(self.environment(self.FakeOpenBlas(dynamic, b"Prescott")),
                         {"OPENBLAS_CORETYPE": "SkylakeX"})
        self.assertEqual(self.environment(self.FakeOpenBlas(dynamic, b"Prescott"), ["avx"]),
                         {"OPENBLAS_CORETYPE": "Sandybridge"})
        self.assertEqual(self.environment(self.FakeOpenBlas(dynamic, b"SkylakeX")), {})
        # A build for one CPU ignores the variable; no OpenBLAS at all; the user's own choice.
        self.assertEqual(self.environment(self.FakeOpenBlas(b"OpenBLAS 0.3.21 Prescott", b"Prescott")), {})
        self.assertEqual(self.environment(OSError("no libopenblas.so.0")), {})
        self.assertEqual(self.environment(self.FakeOpenBlas(dynamic, b"Prescott"),
                                          environ={"OPENBLAS_CORETYPE": ""}), {})

    def test_cpu_flags_come_from_the_flags_line(self):
        cpuinfo = "processor\t: 0\nvmx flags\t: ept vpid\nflags\t\t: fpu avx avx2 fma\n"
        with mock.patch("builtins.open", mock.mock_open(read_data=cpuinfo)):
            self.assertEqual(ps.cluster._cpu_flags(), ["fpu", "avx", "avx2", "fma"])


class DataTest(unittest.TestCase):
    def test_synthetic_ctr_data_and_auc_match_the_generators(self):
        cfg = ('name: "d"\ndata { format: SYNTHETIC_CTR synthetic { num_train: 300 num_test: 200 num_fields: 3 '
               'vocabulary_per_field: 20 seed: 3 } }\n')
        d = ps.load_data(cfg)
        tr = d["train"]
        self.assertEqual(tr["offsets"].shape, (301,))
        self.assertEqual(tr["ids"].dtype, np.uint64)
        self.assertEqual(len(tr["ids"]), 900)
        self.assertTrue(set(np.unique(tr["y"])) <= {0.0, 1.0})
        # Read straight from the dataset (not as one batch, whose offsets are 32-bit): three
        # features per example, one per field.
        self.assertEqual(tr["offsets"].dtype, np.int64)
        self.assertEqual(tr["offsets"].tolist(), list(range(0, 901, 3)))
        self.assertEqual(tr["values"].dtype, np.float32)
        self.assertEqual(len(tr["values"]), 900)
        self.assertEqual(tr["y"].dtype, np.float32)
        self.assertEqual(len(tr["y"]), 300)
        self.assertGreater(d["ground_truth_auc"], 0.5)
        self.assertEqual(ps.auc([0.1, 0.9, 0.8, 0.2], [0, 1, 1, 0]), 1.0)
        again = ps.load_data(cfg)
        self.assertEqual(again["train"]["ids"].tobytes(), tr["ids"].tobytes())

    def test_load_data_takes_a_path(self):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as root:
            path = pathlib.Path(root) / "data.textproto"
            path.write_text('name: "d"\ndata { format: SYNTHETIC_CTR synthetic { num_train: 30 num_test: 20 '
                            'num_fields: 2 vocabulary_per_field: 10 seed: 3 } }\n')
            self.assertEqual(ps.load_data(path)["train"]["offsets"].shape, (31,))
            with self.assertRaises(ps.InvalidArgument):
                ps.load_data(b"data.textproto")


if __name__ == "__main__":
    junit.main(__name__)
