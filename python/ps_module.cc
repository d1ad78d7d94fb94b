// ps._ps: the pybind11 module behind `import ps` (python/ps/__init__.py wraps it).
//
// Buffers: pulls write straight into the caller's (or a freshly allocated) float32 NumPy
// array, pushes read the caller's array in place. Only float32 C-contiguous arrays (uint64
// for keys) are accepted; anything else is INVALID_ARGUMENT rather than a silent copy, so that
// the zero-copy promise holds or the caller hears why not.
//
// Threads: every call into the store runs with the GIL released; the arrays it reads or
// writes are kept alive by the Python references held by this frame.
//
// Errors: a failed absl::Status becomes the exception class of its code from ps/errors.py
// (ps.InvalidArgument, ps.NotFound, ...), carrying the code and the message.
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"
#include "python/client.h"
#include "worker/data/batch.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/load.h"
#include "worker/data/metrics.h"

namespace py = pybind11;

namespace ps::python {
namespace {

// Carries a failed status out of C++; translated to ps.errors' class for its code.
struct StatusError {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

void TranslateStatusError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    py::object errors = py::module_::import("ps.errors");
    py::object exc = errors.attr("from_status")(static_cast<int>(e.status.code()),
                                                std::string(e.status.message()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

absl::Status InvalidArray(const std::string& what, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", problem));
}

// Whether `a`'s elements are T's: numpy's equivalence of dtypes, not the identity of the
// dtype object (an array that came through pickle, e.g. from a DataLoader's worker process,
// has a float32 dtype object of its own).
template <typename T>
bool HasDtype(const py::array& a) {
  return py::isinstance<py::array_t<T>>(a);
}

// Whether `a`'s elements lie at addresses aligned for their type (numpy allows otherwise, e.g.
// np.frombuffer at an odd offset; C++ reads through a float* must not).
bool Aligned(const py::array& a) {
  return (a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0;
}

// A float32, C-contiguous, aligned array of the elements of `shape` (writeable if `write`):
// flat (one dimension or none), or of that very shape (a transposed gradient has the right
// size and would scramble the rows); or INVALID_ARGUMENT saying what is wrong with it.
absl::Status CheckFloatArray(const py::object& obj, const std::string& what,
                             const std::vector<int64_t>& shape, bool write) {
  int64_t size = 1;
  for (int64_t d : shape) size *= d;
  if (!py::isinstance<py::array>(obj)) {
    return InvalidArray(what, "expected a numpy.ndarray (or torch tensor) of float32");
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!HasDtype<float>(a)) {
    return InvalidArray(
        what, absl::StrCat("dtype ", std::string(py::str(a.dtype())), ", expected float32"));
  }
  if (!(a.flags() & py::array::c_style)) return InvalidArray(what, "not C-contiguous");
  if (!Aligned(a)) return InvalidArray(what, "not aligned for float32");
  if (write && !a.writeable()) return InvalidArray(what, "read-only");
  if (a.size() != size) {
    return InvalidArray(what, absl::StrCat(a.size(), " elements, expected ", size));
  }
  if (a.ndim() > 1 && !std::equal(shape.begin(), shape.end(), a.shape(), a.shape() + a.ndim())) {
    return InvalidArray(
        what, absl::StrCat("shape (", absl::StrJoin(a.shape(), a.shape() + a.ndim(), ", "),
                           "), expected (", absl::StrJoin(shape, ", "), ") or flat"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeys(const py::object& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) return InvalidArray(what, "expected a numpy uint64 array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!HasDtype<uint64_t>(a)) {
    return InvalidArray(
        what, absl::StrCat("dtype ", std::string(py::str(a.dtype())), ", expected uint64"));
  }
  if (a.ndim() != 1) return InvalidArray(what, "expected a 1-D array");
  if (!(a.flags() & py::array::c_style)) return InvalidArray(what, "not C-contiguous");
  if (!Aligned(a)) return InvalidArray(what, "not aligned for uint64");
  return absl::OkStatus();
}

absl::Span<float> MutableFloats(const py::object& obj) {
  py::array a = py::reinterpret_borrow<py::array>(obj);
  return absl::Span<float>(static_cast<float*>(a.mutable_data()), a.size());
}

absl::Span<const float> Floats(const py::object& obj) {
  py::array a = py::reinterpret_borrow<py::array>(obj);
  return absl::Span<const float>(static_cast<const float*>(a.data()), a.size());
}

absl::Span<const uint64_t> Keys(const py::object& obj) {
  py::array a = py::reinterpret_borrow<py::array>(obj);
  return absl::Span<const uint64_t>(static_cast<const uint64_t*>(a.data()), a.size());
}

// A new float32 array of `shape`.
py::object NewFloats(std::vector<int64_t> shape) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array_t<float>(dims);
}

// A table name: a str. pybind11 would take bytes too, and refuse anything else with a
// RuntimeError of its own instead of the INVALID_ARGUMENT every other bad input gets.
std::string TableName(py::handle name) {
  if (!py::isinstance<py::str>(name)) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("a table name must be a str, not ",
                     std::string(py::str(py::type::handle_of(name).attr("__name__"))))));
  }
  return py::cast<std::string>(name);
}

py::tuple PositionTuple(const common::WorkerPosition& p) {
  return py::make_tuple(p.epoch, p.offset, p.clock);
}

// ---- The client's calls ----------------------------------------------------------------------
//
// Python side: pull(dense={name: out or None}, sparse={name: (keys, out or None)}) and
// push(dense={name: grad}, sparse={name: (keys, grads)}), one store call each (one round
// trip per server). Arrays are checked here, before anything is sent.

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}
  // The client's end tells the servers this worker finished, retried with back-off while they
  // do not answer (seconds, minutes with rpc.max_retries): other Python threads run meanwhile.
  ~PyClient() {
    if (client_ == nullptr || !PyGILState_Check()) return;
    py::gil_scoped_release release;
    client_.reset();
  }
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  // Returns {name: array} for dense and {name: array} for sparse, filled.
  // The batches of a pull and a push from Python dicts, checked (dtype, contiguity, sizes) and
  // with the arrays they point into kept in `keep` while the GIL is released.
  void BuildPull(const py::dict& dense, const py::dict& sparse, common::PullBatch* batch,
                 py::dict* dense_out, py::dict* sparse_out, std::vector<py::object>* keep) {
    for (auto item : dense) {
      const std::string name = TableName(item.first);
      const TableInfo* t = TableOfKind(name, false);
      py::object out = py::reinterpret_borrow<py::object>(item.second);
      if (out.is_none()) out = NewFloats(t->shape);
      ThrowIfError(CheckFloatArray(out, "pull_dense " + name + " out", t->shape, true));
      batch->dense.push_back({name, MutableFloats(out)});
      (*dense_out)[item.first] = out;
      keep->push_back(out);
    }
    for (auto item : sparse) {
      const std::string name = TableName(item.first);
      const TableInfo* t = TableOfKind(name, true);
      py::tuple pair = py::cast<py::tuple>(item.second);
      py::object keys = pair[0];
      py::object out = pair[1];
      ThrowIfError(CheckKeys(keys, "pull_sparse " + name + " keys"));
      const int64_t n = py::reinterpret_borrow<py::array>(keys).size();
      if (out.is_none()) out = NewFloats({n, t->size});
      ThrowIfError(CheckFloatArray(out, "pull_sparse " + name + " out", {n, t->size}, true));
      batch->sparse.push_back({name, Keys(keys), MutableFloats(out)});
      (*sparse_out)[item.first] = out;
      keep->push_back(keys);
      keep->push_back(out);
    }
  }

  void BuildPush(const py::dict& dense, const py::dict& sparse, common::PushBatch* batch,
                 std::vector<py::object>* keep) {
    for (auto item : dense) {
      const std::string name = TableName(item.first);
      const TableInfo* t = TableOfKind(name, false);
      py::object grad = py::reinterpret_borrow<py::object>(item.second);
      ThrowIfError(CheckFloatArray(grad, "push_dense " + name + " grad", t->shape, false));
      batch->dense.push_back({name, Floats(grad)});
      keep->push_back(grad);
    }
    for (auto item : sparse) {
      const std::string name = TableName(item.first);
      const TableInfo* t = TableOfKind(name, true);
      py::tuple pair = py::cast<py::tuple>(item.second);
      py::object keys = pair[0];
      py::object grads = pair[1];
      ThrowIfError(CheckKeys(keys, "push_sparse " + name + " keys"));
      const int64_t n = py::reinterpret_borrow<py::array>(keys).size();
      ThrowIfError(CheckFloatArray(grads, "push_sparse " + name + " grads", {n, t->size}, false));
      batch->sparse.push_back({name, Keys(keys), Floats(grads)});
      keep->push_back(keys);
      keep->push_back(grads);
    }
  }

  // One fused step (Client::Step): returns (clock, dense_out, sparse_out).
  py::tuple Step(const py::dict& push_dense, const py::dict& push_sparse,
                 const py::dict& pull_dense, const py::dict& pull_sparse) {
    common::PushBatch push;
    common::PullBatch pull;
    py::dict dense_out, sparse_out;
    std::vector<py::object> keep;
    BuildPush(push_dense, push_sparse, &push, &keep);
    BuildPull(pull_dense, pull_sparse, &pull, &dense_out, &sparse_out, &keep);
    absl::StatusOr<int64_t> clock;
    {
      py::gil_scoped_release release;
      clock = client_->Step(push, pull);
    }
    ThrowIfError(clock.status());
    return py::make_tuple(*clock, dense_out, sparse_out);
  }

  py::tuple Pull(const py::dict& dense, const py::dict& sparse) {
    common::PullBatch batch;
    py::dict dense_out, sparse_out;
    std::vector<py::object> keep;  // references held while the GIL is released
    BuildPull(dense, sparse, &batch, &dense_out, &sparse_out, &keep);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Pull(batch);
    }
    ThrowIfError(status);
    return py::make_tuple(dense_out, sparse_out);
  }

  void Push(const py::dict& dense, const py::dict& sparse) {
    common::PushBatch batch;
    std::vector<py::object> keep;
    BuildPush(dense, sparse, &batch, &keep);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Push(batch);
    }
    ThrowIfError(status);
  }

  int64_t Tick() {
    absl::StatusOr<int64_t> r;
    {
      py::gil_scoped_release release;
      r = client_->Tick();
    }
    return ValueOrThrow(std::move(r));
  }

  void Finish() {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Finish();
    }
    ThrowIfError(status);
  }

  // (epoch, offset, clock) the store remembers after the report.
  py::tuple ReportPosition(uint32_t epoch, uint64_t offset) {
    absl::StatusOr<common::WorkerPosition> r;
    {
      py::gil_scoped_release release;
      r = client_->ReportPosition(epoch, offset);
    }
    return PositionTuple(ValueOrThrow(std::move(r)));
  }

  std::vector<std::string> Checkpoint() {
    absl::StatusOr<std::vector<std::string>> r;
    {
      py::gil_scoped_release release;
      r = client_->Checkpoint();
    }
    return ValueOrThrow(std::move(r));
  }

  std::vector<std::string> Stats() {
    absl::StatusOr<std::vector<std::string>> r;
    {
      py::gil_scoped_release release;
      r = client_->Stats();
    }
    return ValueOrThrow(std::move(r));
  }

  py::list Tables() const {
    py::list out;
    for (const TableInfo& t : client_->tables()) {
      py::dict d;
      d["name"] = t.name;
      d["kind"] = t.sparse ? "sparse" : "dense";
      d["shape"] = py::tuple(py::cast(t.shape));
      out.append(d);
    }
    return out;
  }

  int64_t clock() const { return client_->clock(); }
  py::tuple start_position() const { return PositionTuple(client_->start_position()); }
  bool centralized() const { return client_->centralized(); }
  int32_t worker_index() const { return client_->worker_index(); }
  int32_t num_workers() const { return client_->config().cluster().num_workers(); }
  int32_t staleness() const {
    return client_->config().training().has_staleness() ? client_->config().training().staleness()
                                                        : -1;
  }

 private:
  // The table `name`, which must be sparse (or dense); NOT_FOUND / INVALID_ARGUMENT.
  const TableInfo* TableOfKind(const std::string& name, bool sparse) const {
    const TableInfo* t = ValueOrThrow(client_->Table(name));
    if (t->sparse != sparse) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat("table \"", name, "\" is ",
                                                           t->sparse ? "sparse" : "dense", ", not ",
                                                           sparse ? "sparse" : "dense")));
    }
    return t;
  }

  std::unique_ptr<Client> client_;
};

std::unique_ptr<PyClient> MakeClient(const std::string& config_text,
                                     const std::string& config_source,
                                     const std::vector<std::string>& overrides,
                                     const std::vector<std::string>& servers, int32_t worker_index,
                                     bool centralized, const std::string& data_dir,
                                     const std::string& ca_cert, const std::string& cert,
                                     const std::string& key, const std::string& token_file,
                                     int plaintext, double wait_for_servers_s) {
  ClientOptions options;
  options.config_text = config_text;
  options.config_source = config_source;
  options.overrides = overrides;
  options.servers = servers;
  options.worker_index = worker_index;
  options.centralized = centralized;
  options.data_dir = data_dir;
  options.ca_cert = ca_cert;
  options.cert = cert;
  options.key = key;
  options.token_file = token_file;
  options.plaintext = plaintext;
  options.wait_for_servers = absl::Seconds(wait_for_servers_s);
  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = Client::Create(options);
  }
  return std::make_unique<PyClient>(ValueOrThrow(std::move(client)));
}

// ---- The job's data, for Python training loops -----------------------------------------------

// One dataset as arrays: dense {"x": (n, d) float32, "y": (n,) int32}; sparse {"offsets":
// (n+1,) int64, "ids": uint64, "values": float32, "y": float32 (binary) or int32}.
py::dict DatasetArrays(const worker::Dataset& data) {
  if (const auto* sparse = dynamic_cast<const worker::SparseDataset*>(&data); sparse != nullptr) {
    // Straight from the dataset, not as one batch: a batch holds fewer than 2^32 features
    // (its offsets are 32-bit), and a dataset of more aborted the interpreter.
    const int64_t n = sparse->size();
    py::array_t<int64_t> offsets(n + 1);
    py::array_t<uint64_t> ids(static_cast<py::ssize_t>(sparse->num_entries()));
    py::array_t<float> values(static_cast<py::ssize_t>(sparse->num_entries()));
    int64_t* o = offsets.mutable_data();
    uint64_t* id = ids.mutable_data();
    float* v = values.mutable_data();
    int64_t at = 0;
    o[0] = 0;
    for (int64_t i = 0; i < n; ++i) {
      absl::Span<const uint64_t> row_ids = sparse->feature_ids(i);
      absl::Span<const float> row_values = sparse->feature_values(i);
      std::copy(row_ids.begin(), row_ids.end(), id + at);
      std::copy(row_values.begin(), row_values.end(), v + at);
      at += static_cast<int64_t>(row_ids.size());
      o[i + 1] = at;
    }
    py::dict d;
    d["offsets"] = offsets;
    d["ids"] = ids;
    d["values"] = values;
    if (sparse->num_classes() == 2) {
      py::array_t<float> y(n);
      for (int64_t i = 0; i < n; ++i) y.mutable_data()[i] = static_cast<float>(sparse->label(i));
      d["y"] = y;
    } else {
      py::array_t<int32_t> y(n);
      for (int64_t i = 0; i < n; ++i) y.mutable_data()[i] = sparse->label(i);
      d["y"] = y;
    }
    return d;
  }
  std::vector<int64_t> all(data.size());
  for (int64_t i = 0; i < data.size(); ++i) all[i] = i;
  worker::Batch b;
  data.FillBatch(all, &b);
  py::dict d;
  d["x"] = py::array_t<float>(std::vector<py::ssize_t>{b.size, b.feature_dim}, b.dense.data());
  if (!b.binary_labels.empty()) {
    d["y"] = py::array_t<float>(b.binary_labels.size(), b.binary_labels.data());
  } else {
    d["y"] = py::array_t<int32_t>(b.class_labels.size(), b.class_labels.data());
  }
  return d;
}

py::dict LoadDataArrays(const std::string& config_text, const std::string& config_source,
                        const std::vector<std::string>& overrides) {
  absl::StatusOr<worker::LoadedData> loaded;
  {
    py::gil_scoped_release release;
    absl::StatusOr<JobConfig> config = common::ParseJobConfigText(config_text, config_source);
    for (size_t i = 0; config.ok() && i < overrides.size(); ++i) {
      const absl::Status s = common::ApplyOverride(overrides[i], &*config);
      if (!s.ok()) config = s;
    }
    if (!config.ok()) {
      loaded = config.status();
    } else {
      loaded = worker::LoadData(config->data(), config->training());
    }
  }
  ThrowIfError(loaded.status());
  py::dict out;
  out["train"] = DatasetArrays(*loaded->train);
  out["test"] = loaded->test ? py::object(DatasetArrays(*loaded->test)) : py::object(py::none());
  out["ground_truth_auc"] = loaded->ground_truth_auc;
  return out;
}

double Auc(const py::array_t<float, py::array::c_style | py::array::forcecast>& scores,
           const py::array_t<float, py::array::c_style | py::array::forcecast>& labels) {
  if (scores.size() != labels.size()) {
    ThrowIfError(absl::InvalidArgumentError("auc: scores and labels differ in length"));
  }
  return worker::Auc(absl::MakeConstSpan(scores.data(), scores.size()),
                     absl::MakeConstSpan(labels.data(), labels.size()));
}

}  // namespace
}  // namespace ps::python

PYBIND11_MODULE(_ps, m) {
  namespace pp = ps::python;
  m.doc() = "C++ core of the ps package; use `import ps`.";
  py::register_exception_translator(&pp::TranslateStatusError);
  py::class_<pp::PyClient>(m, "Client")
      .def(py::init(&pp::MakeClient), py::arg("config_text"), py::arg("config_source"),
           py::arg("overrides"), py::arg("servers"), py::arg("worker_index"),
           py::arg("centralized"), py::arg("data_dir"), py::arg("ca_cert"), py::arg("cert"),
           py::arg("key"), py::arg("token_file"), py::arg("plaintext"),
           py::arg("wait_for_servers_s"))
      .def("pull", &pp::PyClient::Pull, py::arg("dense"), py::arg("sparse"))
      .def("push", &pp::PyClient::Push, py::arg("dense"), py::arg("sparse"))
      .def("tick", &pp::PyClient::Tick)
      .def("step", &pp::PyClient::Step, py::arg("push_dense"), py::arg("push_sparse"),
           py::arg("pull_dense"), py::arg("pull_sparse"))
      .def("finish", &pp::PyClient::Finish)
      .def("report_position", &pp::PyClient::ReportPosition, py::arg("epoch"), py::arg("offset"))
      .def("checkpoint", &pp::PyClient::Checkpoint)
      .def("stats", &pp::PyClient::Stats)
      .def("tables", &pp::PyClient::Tables)
      .def_property_readonly("clock", &pp::PyClient::clock)
      .def_property_readonly("start_position", &pp::PyClient::start_position)
      .def_property_readonly("centralized", &pp::PyClient::centralized)
      .def_property_readonly("worker_index", &pp::PyClient::worker_index)
      .def_property_readonly("num_workers", &pp::PyClient::num_workers)
      .def_property_readonly("staleness", &pp::PyClient::staleness);
  m.def("load_data", &pp::LoadDataArrays, py::arg("config_text"), py::arg("config_source"),
        py::arg("overrides"));
  m.def("auc", &pp::Auc, py::arg("scores"), py::arg("labels"));
}
