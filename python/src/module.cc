// The `shardcache` Python module: a thin pybind11 layer over libshardcache.
//
// Batches stay in shared memory. batch.sample(i) is a read-only memoryview whose owner keeps the
// batch (and its arena slot) alive; numpy.from_dlpack(batch) / torch.from_dlpack(batch) see a
// dense uint8 [B, record_bytes] tensor through a DLPack capsule that also keeps the batch
// alive. The slot returns to the daemon when the last of these is gone (or batch.release()).
//
// The GIL is released around every call that talks to the daemon.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "shardcache/client.h"
#include "python/src/stager_binding.h"

namespace py = pybind11;
using namespace shardcache;

namespace {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Leaked on purpose: it must outlive interpreter shutdown ordering.
py::handle g_error_type;

[[noreturn]] void Raise(const Status& s) {
  py::object e = g_error_type(s.ToString());  // NOLINT
  e.attr("code") = static_cast<int>(s.code());
  e.attr("code_name") = StatusCodeName(s.code());
  PyErr_SetObject(g_error_type.ptr(), e.ptr());
  throw py::error_already_set();
}

struct BatchHolder {
  explicit BatchHolder(Batch b) : batch(std::move(b)) {}
  Batch batch;
};

// The owner of a memoryview over part of a batch.
struct ByteRange {
  std::shared_ptr<BatchHolder> holder;
  const uint8_t* data;
  size_t size;
};

struct DLContext {
  std::shared_ptr<BatchHolder> holder;
  int64_t shape[2];
  DLManagedTensor tensor;
};

class PyBatch {
 public:
  explicit PyBatch(Batch b) : holder_(std::make_shared<BatchHolder>(std::move(b))) {}

  const Batch& b() const {
    if (!holder_) throw py::value_error("batch was released");
    return holder_->batch;
  }
  size_t size() const { return holder_ ? holder_->batch.size() : 0; }

  py::array_t<int64_t> sample_ids() const {
    const auto& ids = b().sample_ids();
    py::array_t<int64_t> a(static_cast<py::ssize_t>(ids.size()));
    auto m = a.mutable_unchecked<1>();
    for (size_t i = 0; i < ids.size(); ++i) m(i) = static_cast<int64_t>(ids[i]);
    return a;
  }

  py::memoryview View(const uint8_t* p, size_t n) const {
    py::object owner = py::cast(ByteRange{holder_, p, n});
    return py::memoryview(owner);
  }

  size_t Index(py::ssize_t i) const {
    const auto n = static_cast<py::ssize_t>(b().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error("sample index out of range");
    return static_cast<size_t>(i);
  }

  py::memoryview sample(py::ssize_t i) const {
    const auto v = b().sample(Index(i));
    return View(v.data, v.size);
  }

  py::memoryview data() const { return View(b().data(), b().payload_bytes()); }

  // Tar samples (fields): keys, one sample's fields, and every field of the batch as columns.
  py::list keys() const {
    const auto& bb = b();
    py::list out(bb.size());
    for (size_t i = 0; i < bb.size(); ++i) {
      const std::string_view k = bb.key(i);
      out[i] = py::str(k.data(), k.size());
    }
    return out;
  }

  py::dict fields(py::ssize_t i) const {
    const auto& bb = b();
    const size_t at = Index(i);
    py::dict d;
    const std::string_view k = bb.key(at);
    d["__key__"] = py::str(k.data(), k.size());
    d["__id__"] = py::int_(bb.sample_id(at));
    for (size_t m = 0; m < bb.field_count(at); ++m) {
      const Field f = bb.field(at, m);
      d[py::str(f.name.data(), f.name.size())] = View(f.bytes.data, f.bytes.size);
    }
    return d;
  }

  // (names, table): every field of the batch in one int64 array of shape [1 + 2 * len(names), B]
  // — row 0 the sample ids, rows 1 + 2k and 2 + 2k the offsets (from the payload start) and
  // lengths (-1 where a sample lacks it) of field names[k]. Built in one pass in C++ and held
  // in one array, so that a trainer (or a DataLoader worker, which hands it to the main process
  // as one shared-memory tensor) gets per-field views without a Python loop per member.
  py::tuple columns() const {
    const auto& bb = b();
    const size_t n = bb.size();
    std::vector<std::string_view> names;
    for (size_t i = 0; i < n; ++i) {
      for (size_t m = 0; m < bb.field_count(i); ++m) {
        const std::string_view name = bb.field(i, m).name;
        if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      }
    }
    py::array_t<int64_t> table({static_cast<py::ssize_t>(1 + 2 * names.size()), static_cast<py::ssize_t>(n)});
    int64_t* t = table.mutable_data();
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<int64_t>(bb.sample_id(i));
    for (size_t k = 0; k < names.size(); ++k) {
      std::fill_n(t + (1 + 2 * k) * n, n, 0);
      std::fill_n(t + (2 + 2 * k) * n, n, -1);
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t m = 0; m < bb.field_count(i); ++m) {
        const Field f = bb.field(i, m);
        const size_t k = static_cast<size_t>(std::find(names.begin(), names.end(), f.name) - names.begin());
        t[(1 + 2 * k) * n + i] = static_cast<int64_t>(f.bytes.data - bb.data());
        t[(2 + 2 * k) * n + i] = static_cast<int64_t>(f.bytes.size);
      }
    }
    py::list py_names;
    for (const auto& name : names) py_names.append(py::str(name.data(), name.size()));
    return py::make_tuple(py_names, table);
  }

  // DLPack of the dense [B, record_bytes] batch (records datasets).
  py::capsule dlpack(py::object stream) const {
    if (!stream.is_none()) throw py::buffer_error("shardcache batches live in host memory; stream must be None");
    const auto& bb = b();
    if (bb.record_bytes() == 0) {
      throw py::buffer_error(
          "this batch holds variable-size samples; DLPack needs a dense [B, record_bytes] batch "
          "(a records dataset) — use batch.sample(i), batch.fields(i) or batch.payload() instead");
    }
    return Capsule(2, {static_cast<int64_t>(bb.size()), static_cast<int64_t>(bb.record_bytes())});
  }

  // DLPack of the whole payload as one uint8 vector, for any dataset: a single tensor that
  // per-sample or per-field views slice (what a DataLoader worker hands over in one piece).
  py::capsule payload_dlpack(py::object stream) const {
    if (!stream.is_none()) throw py::buffer_error("shardcache batches live in host memory; stream must be None");
    return Capsule(1, {static_cast<int64_t>(b().payload_bytes()), 0});
  }

  void release() {
    if (!holder_) return;
    if (holder_.use_count() > 1) {
      throw py::buffer_error("views of this batch (memoryviews, arrays) are still alive; drop them first");
    }
    std::shared_ptr<BatchHolder> h = std::move(holder_);
    py::gil_scoped_release nogil;
    h.reset();
  }

 private:
  py::capsule Capsule(int32_t ndim, std::array<int64_t, 2> shape) const {
    auto* ctx = new DLContext{holder_, {shape[0], shape[1]}, {}};
    DLTensor& t = ctx->tensor.dl_tensor;
    t.data = const_cast<uint8_t*>(b().data());
    t.device = {kDLCPU, 0};
    t.ndim = ndim;
    t.dtype = {kDLUInt, 8, 1};
    t.shape = ctx->shape;
    t.strides = nullptr;  // compact row-major
    t.byte_offset = 0;
    ctx->tensor.manager_ctx = ctx;
    ctx->tensor.deleter = [](DLManagedTensor* m) { delete static_cast<DLContext*>(m->manager_ctx); };
    // A consumer renames the capsule to "used_dltensor" and calls the deleter itself; an unused
    // capsule frees the tensor when it is collected.
    PyObject* cap = PyCapsule_New(&ctx->tensor, "dltensor", [](PyObject* c) {
      if (PyCapsule_IsValid(c, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
        m->deleter(m);
      }
    });
    if (!cap) {
      delete ctx;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
  }

  std::shared_ptr<BatchHolder> holder_;
};

// batch.payload(): the payload as a DLPack producer (torch.from_dlpack / numpy.from_dlpack).
struct PyPayload {
  PyBatch batch;
};

struct PyClient {
  std::shared_ptr<Client> client;
};

class PyLoader {
 public:
  PyLoader(std::shared_ptr<Client> client, LoaderOptions o)
      : client_(std::move(client)), o_(std::move(o)), requested_window_(o_.block_window_shards) {}

  PyLoader& iter() { return *this; }

  PyBatch next() {
    Open();
    Result<Batch> b = OutOfRange("");
    {
      py::gil_scoped_release nogil;
      b = loader_->Next();
    }
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kOutOfRange) throw py::stop_iteration();
      Raise(b.status());
    }
    return PyBatch(std::move(*b));
  }

  // Where this rank stands in its epoch. `position` (the global positions every rank has
  // consumed, when the ranks move in step) lets a job resume on another world size.
  py::dict state_dict() {
    LoaderState st;
    if (loader_) {
      st = loader_->state();
    } else {  // never opened, or closed: what the next iteration would open
      st.epoch = o_.epoch;
      st.samples_consumed = o_.samples_consumed;
      st.start_position = o_.start_position;
      st.world_size = o_.world_size;
    }
    py::dict d;
    d["dataset"] = o_.dataset;
    d["version"] = loader_ ? loader_->version() : seen_.version.empty() ? o_.expect_version : seen_.version;
    d["seed"] = o_.seed;
    d["epoch"] = o_.epoch;
    d["shuffle"] = ShuffleName(o_.shuffle);
    d["rank"] = o_.rank;
    d["world_size"] = o_.world_size;
    d["batch_size"] = o_.batch_size;
    d["drop_last"] = o_.drop_last;
    d["pad"] = o_.pad;
    d["samples_consumed"] = st.samples_consumed;
    d["start_position"] = st.start_position;
    d["position"] = st.GlobalPosition(seen_.dataset_samples);
    d["block_window_shards"] = seen_.window != 0 ? seen_.window : o_.block_window_shards;
    return d;
  }

  // Continues from a state_dict() of a loader with the same dataset, seed, shuffle, batch size
  // and tail; the epoch and position come from the state. Another rank or world size continues
  // the epoch from the state's global position (every rank of the old job at the same step).
  // The dataset must still be at the state's version (the next iteration raises otherwise).
  void load_state_dict(py::dict d) {
    auto need = [&](const char* key) -> py::object {
      if (!d.contains(key)) throw py::value_error(std::string("state_dict has no '") + key + "'");
      return d[key];
    };
    auto check = [&](const char* key, py::object mine) {
      if (d.contains(key) && !py::object(d[key]).equal(mine)) {
        throw py::value_error(std::string("state_dict was saved with a different ") + key + ": " +
                              py::str(d[key]).cast<std::string>() + " (this loader: " +
                              py::str(mine).cast<std::string>() + ")");
      }
    };
    check("dataset", py::str(o_.dataset));
    check("seed", py::int_(o_.seed));
    check("shuffle", py::str(ShuffleName(o_.shuffle)));
    check("batch_size", py::int_(o_.batch_size));
    check("drop_last", py::bool_(o_.drop_last));
    check("pad", py::bool_(o_.pad));
    const uint64_t epoch = need("epoch").cast<uint64_t>();
    uint64_t start = 0, consumed = 0;
    const bool same_ranks = need("world_size").cast<uint32_t>() == o_.world_size &&
                            need("rank").cast<uint32_t>() == o_.rank;
    if (same_ranks) {
      start = d.contains("start_position") ? d["start_position"].cast<uint64_t>() : 0;
      consumed = need("samples_consumed").cast<uint64_t>();
    } else if (d.contains("position")) {
      start = d["position"].cast<uint64_t>();
    } else {
      throw py::value_error("state_dict has no global 'position' (saved by an older shardcache): resume it "
                            "with the world_size and rank it was saved with");
    }
    Close();
    o_.epoch = epoch;
    o_.start_position = start;
    o_.samples_consumed = consumed;
    o_.expect_version = d.contains("version") ? d["version"].cast<std::string>() : "";
    o_.block_window_shards = d.contains("block_window_shards") ? d["block_window_shards"].cast<uint32_t>()
                                                                 : requested_window_;
  }

  // Starts epoch `epoch` from its beginning (the next iteration opens it).
  void set_epoch(uint64_t epoch) {
    Close();
    o_.epoch = epoch;
    o_.samples_consumed = 0;
    o_.start_position = 0;
    o_.expect_version.clear();
    o_.block_window_shards = requested_window_;
  }

  uint64_t len() {
    Open();
    const uint64_t n = loader_->samples_per_epoch();
    return o_.drop_last ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
  }
  Loader& open() {
    Open();
    return *loader_;
  }
  uint64_t epoch() const { return o_.epoch; }
  void close() { Close(); }

 private:
  static const char* ShuffleName(Shuffle s) {
    return s == Shuffle::kGlobal ? "global" : s == Shuffle::kBlock ? "block" : "none";
  }
  void Open() {
    if (loader_) return;
    Result<std::unique_ptr<Loader>> l = Internal("");
    {
      py::gil_scoped_release nogil;
      l = client_->OpenLoader(o_);
    }
    if (!l.ok()) Raise(l.status());
    loader_ = std::move(*l);
    seen_ = {loader_->version(), loader_->dataset_samples(), loader_->block_window_shards()};
  }
  void Close() {
    if (!loader_) return;
    o_.samples_consumed = loader_->state().samples_consumed;
    std::unique_ptr<Loader> l = std::move(loader_);
    py::gil_scoped_release nogil;
    l.reset();
  }

  std::shared_ptr<Client> client_;
  LoaderOptions o_;
  const uint32_t requested_window_;
  std::unique_ptr<Loader> loader_;
  // What the last open loader said (state_dict() of a closed loader still names them).
  struct {
    std::string version;
    uint64_t dataset_samples = UINT64_MAX;
    uint32_t window = 0;
  } seen_;
};

}  // namespace

PYBIND11_MODULE(_shardcache, m) {
  m.doc() = "shardcache client: batches from the node's shardcached in shared memory";
  g_error_type = PyErr_NewException("shardcache.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = g_error_type;
  m.attr("DEFAULT_SOCKET") = kDefaultSocketPath;

  py::class_<ByteRange>(m, "_ByteRange", py::buffer_protocol())
      .def_buffer([](ByteRange& r) {
        return py::buffer_info(const_cast<uint8_t*>(r.data), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(r.size)}, {1}, /*readonly=*/true);
      });

  py::class_<PyBatch>(m, "Batch")
      .def("__len__", &PyBatch::size)
      .def_property_readonly("sample_ids", &PyBatch::sample_ids,
                             "numpy int64 array of the global sample ids in this batch")
      .def("sample", &PyBatch::sample, py::arg("i"), "read-only memoryview of sample i's bytes")
      .def_property_readonly("data", &PyBatch::data, "read-only memoryview of the whole payload")
      .def_property_readonly("record_bytes", [](const PyBatch& b) { return b.b().record_bytes(); })
      .def_property_readonly("payload_bytes", [](const PyBatch& b) { return b.b().payload_bytes(); })
      .def_property_readonly("seq", [](const PyBatch& b) { return b.b().seq(); })
      .def_property_readonly("wait_us", [](const PyBatch& b) { return b.b().wait_us(); })
      .def_property_readonly("samples_consumed_after", [](const PyBatch& b) { return b.b().samples_consumed_after(); },
                             "the rank's resume point once this batch and every one before it are consumed")
      .def_property_readonly("has_fields", [](const PyBatch& b) { return b.b().has_fields(); })
      .def_property_readonly("keys", &PyBatch::keys, "WebDataset keys of the samples (tar datasets)")
      .def("fields", &PyBatch::fields, py::arg("i"),
           "sample i as a dict: '__key__', '__id__' and a read-only memoryview per member (tar datasets)")
      .def("columns", &PyBatch::columns,
           "(names, table): an int64 array [1 + 2 * len(names), B] of the sample ids, then per field "
           "the offsets (from the payload start) and lengths (-1 where absent)")
      .def("__dlpack__", &PyBatch::dlpack, py::kw_only(), py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyBatch&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def("payload", [](const PyBatch& b) { return PyPayload{b}; },
           "the whole payload as one uint8 vector for torch.from_dlpack / numpy.from_dlpack (any dataset)")
      .def("release", &PyBatch::release, "return the slot now (no views may remain)");

  py::class_<PyPayload>(m, "Payload", "a batch's payload bytes as a 1-D uint8 DLPack tensor")
      .def("__dlpack__", [](const PyPayload& p, py::object stream) { return p.batch.payload_dlpack(stream); },
           py::kw_only(), py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyPayload&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });

  py::class_<PyLoader>(m, "Loader")
      .def("__iter__", &PyLoader::iter, py::return_value_policy::reference_internal)
      .def("__next__", &PyLoader::next)
      .def("__len__", &PyLoader::len)
      .def("state_dict", &PyLoader::state_dict)
      .def("load_state_dict", &PyLoader::load_state_dict, py::arg("state"))
      .def("set_epoch", &PyLoader::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &PyLoader::epoch)
      .def_property_readonly("samples_per_epoch", [](PyLoader& l) { return l.open().samples_per_epoch(); },
                             "this rank's samples in the epoch (padding included)")
      .def_property_readonly("loader_samples", [](PyLoader& l) { return l.open().loader_samples(); },
                             "samples this loader delivers from its resume point (its worker's share)")
      .def_property_readonly("dataset_samples", [](PyLoader& l) { return l.open().dataset_samples(); })
      .def_property_readonly("record_bytes", [](PyLoader& l) { return l.open().record_bytes(); })
      .def_property_readonly("version", [](PyLoader& l) { return l.open().version(); })
      .def_property_readonly("format", [](PyLoader& l) { return l.open().format(); },
                             "'records', 'tar' or 'megatron'")
      .def_property_readonly("sample_dtype", [](PyLoader& l) { return l.open().sample_dtype(); },
                             "megatron: numpy dtype name of the tokens; '' otherwise")
      .def("close", &PyLoader::close);

  py::class_<CheckpointWriter, std::shared_ptr<CheckpointWriter>>(m, "_CheckpointWriter")
      .def("fileno", &CheckpointWriter::fd)
      .def("commit",
           [](CheckpointWriter& w) {
             Result<uint64_t> size = Internal("");
             {
               py::gil_scoped_release nogil;
               size = w.Close();
             }
             if (!size.ok()) Raise(size.status());
             return *size;
           })
      .def("abort", [](CheckpointWriter& w) {
        py::gil_scoped_release nogil;
        w.Abort();
      });

  py::class_<PyClient>(m, "Client")
      .def(py::init([](const std::string& path, uint32_t reconnect_timeout_ms) {
             Result<std::unique_ptr<Client>> c = Internal("");
             ClientOptions o;
             o.reconnect_timeout_ms = reconnect_timeout_ms;
             {
               py::gil_scoped_release nogil;
               c = Client::Connect(path, o);
             }
             if (!c.ok()) Raise(c.status());
             return PyClient{std::shared_ptr<Client>(std::move(*c))};
           }),
           py::arg("socket_path") = std::string(kDefaultSocketPath), py::arg("reconnect_timeout_ms") = 60000)
      .def(
          "loader",
          [](PyClient& c, const std::string& dataset, uint32_t batch_size, uint64_t seed, uint64_t epoch,
             const std::string& shuffle, uint32_t rank, uint32_t world_size, bool drop_last,
             uint32_t block_window_shards, uint32_t timeout_ms, bool pad, uint32_t worker, uint32_t num_workers,
             bool fields) {
            auto mode = ParseShuffle(shuffle);
            if (!mode.ok()) throw py::value_error(mode.status().message());
            LoaderOptions o;
            o.dataset = dataset;
            o.batch_size = batch_size;
            o.seed = seed;
            o.epoch = epoch;
            o.shuffle = *mode;
            o.rank = rank;
            o.world_size = world_size;
            o.drop_last = drop_last;
            o.block_window_shards = block_window_shards;
            o.next_timeout_ms = timeout_ms;
            o.pad = pad;
            o.worker = worker;
            o.num_workers = num_workers;
            o.fields = fields;
            return PyLoader(c.client, o);
          },
          py::arg("dataset"), py::arg("batch_size") = 32, py::arg("seed") = 0, py::arg("epoch") = 0,
          py::arg("shuffle") = "none", py::arg("rank") = 0, py::arg("world_size") = 1,
          py::arg("drop_last") = false, py::arg("block_window_shards") = 0, py::arg("timeout_ms") = 0,
          py::arg("pad") = true, py::arg("worker") = 0, py::arg("num_workers") = 1, py::arg("fields") = true)
      .def("stats",
           [](PyClient& c) {
             Result<std::string> s = Internal("");
             {
               py::gil_scoped_release nogil;
               s = c.client->Stats();
             }
             if (!s.ok()) Raise(s.status());
             return *s;
           })
      .def("_checkpoint_open",
           [](PyClient& c, const std::string& name) {
             Result<std::unique_ptr<CheckpointWriter>> w = Internal("");
             {
               py::gil_scoped_release nogil;
               w = c.client->Checkpoint(name);
             }
             if (!w.ok()) Raise(w.status());
             return std::shared_ptr<CheckpointWriter>(std::move(*w));
           },
           py::arg("name"))
      .def("_checkpoint_fd",
           [](PyClient& c, const std::string& name) {
             Result<int> fd = Internal("");
             {
               py::gil_scoped_release nogil;
               fd = c.client->OpenCheckpoint(name);
             }
             if (!fd.ok()) Raise(fd.status());
             return *fd;
           },
           py::arg("name"), "a read-only descriptor of checkpoint `name` (the caller closes it)")
      .def("checkpoints",
           [](PyClient& c, const std::string& name) {
             Result<std::vector<CheckpointState>> r = Internal("");
             {
               py::gil_scoped_release nogil;
               r = c.client->Checkpoints(name);
             }
             if (!r.ok()) Raise(r.status());
             py::list out;
             for (const CheckpointState& i : *r) {
               py::dict d;
               d["name"] = i.name;
               d["state"] = i.state;
               d["size"] = i.size;
               d["uploaded_bytes"] = i.uploaded_bytes;
               d["upload_bytes_per_s"] = i.upload_bytes_per_s;
               d["eta_s"] = i.eta_s;
               d["local"] = i.local;
               d["error"] = i.error;
               out.append(d);
             }
             return out;
           },
           py::arg("name") = "",
           "states of the checkpoints saved through this node: dicts with name, state (local | uploading | "
           "remote | failed), size, uploaded_bytes, upload_bytes_per_s, eta_s, local, error")
      .def("wait_uploaded",
           [](PyClient& c, const std::string& name, double timeout) {
             Status s;
             {
               py::gil_scoped_release nogil;
               s = c.client->WaitUploaded(name, static_cast<uint32_t>(std::max(0.0, timeout) * 1000));
             }
             if (!s.ok()) Raise(s);
           },
           py::arg("name"), py::arg("timeout") = 3600.0,
           "waits until checkpoint `name` is committed upstream; raises Error when its upload failed or "
           "`timeout` seconds pass")
      .def_property_readonly("arena_bytes", [](const PyClient& c) { return c.client->arena_bytes(); })
      .def_property_readonly("slot_count", [](const PyClient& c) { return c.client->slot_count(); })
      .def_property_readonly("slot_bytes", [](const PyClient& c) { return c.client->slot_bytes(); });

  // shardcache.Stager / DeviceBatch (python/src/stager_binding.cc).
  RegisterStager(m, [](py::handle c) { return c.cast<PyClient&>().client; });
}
