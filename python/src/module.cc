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

#include <memory>
#include <optional>
#include <string>

#include "shardcache/client.h"
#include "python/src/stager_binding.h"

namespace py = pybind11;
using namespace shardcache;

namespace {

// ---- DLPack (v0.8 ABI, as numpy >= 1.22 and torch consume it)
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLUInt = 1;

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

  py::memoryview sample(py::ssize_t i) const {
    const auto& bb = b();
    if (i < 0) i += static_cast<py::ssize_t>(bb.size());
    if (i < 0 || static_cast<size_t>(i) >= bb.size()) throw py::index_error("sample index out of range");
    const auto v = bb.sample(static_cast<size_t>(i));
    return View(v.data, v.size);
  }

  py::memoryview data() const { return View(b().data(), b().payload_bytes()); }

  py::capsule dlpack(py::object stream) const {
    if (!stream.is_none()) throw py::buffer_error("shardcache batches live in host memory; stream must be None");
    const auto& bb = b();
    if (bb.record_bytes() == 0) {
      throw py::buffer_error(
          "this batch holds variable-size samples; DLPack needs a dense [B, record_bytes] batch "
          "(a records dataset) — use batch.sample(i) instead");
    }
    auto* ctx = new DLContext{holder_, {static_cast<int64_t>(bb.size()), static_cast<int64_t>(bb.record_bytes())}, {}};
    DLTensor& t = ctx->tensor.dl_tensor;
    t.data = const_cast<uint8_t*>(bb.data());
    t.device = {kDLCPU, 0};
    t.ndim = 2;
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
  std::shared_ptr<BatchHolder> holder_;
};

struct PyClient {
  std::shared_ptr<Client> client;
};

class PyLoader {
 public:
  PyLoader(std::shared_ptr<Client> client, LoaderOptions o) : client_(std::move(client)), o_(std::move(o)) {}

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

  py::dict state_dict() {
    py::dict d;
    d["dataset"] = o_.dataset;
    d["version"] = loader_ ? loader_->version() : version_;
    d["seed"] = o_.seed;
    d["epoch"] = o_.epoch;
    d["shuffle"] = ShuffleName(o_.shuffle);
    d["rank"] = o_.rank;
    d["world_size"] = o_.world_size;
    d["batch_size"] = o_.batch_size;
    d["drop_last"] = o_.drop_last;
    d["samples_consumed"] = loader_ ? loader_->state().samples_consumed : o_.samples_consumed;
    return d;
  }

  // Continues from a state_dict() of a loader with the same dataset, seed, shuffle, rank and
  // world size; the epoch and position come from the state.
  void load_state_dict(py::dict d) {
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
    check("rank", py::int_(o_.rank));
    check("world_size", py::int_(o_.world_size));
    check("batch_size", py::int_(o_.batch_size));
    check("drop_last", py::bool_(o_.drop_last));
    Close();
    o_.epoch = d["epoch"].cast<uint64_t>();
    o_.samples_consumed = d["samples_consumed"].cast<uint64_t>();
  }

  // Starts epoch `epoch` from its beginning (the next iteration opens it).
  void set_epoch(uint64_t epoch) {
    Close();
    o_.epoch = epoch;
    o_.samples_consumed = 0;
  }

  uint64_t len() {
    Open();
    const uint64_t n = loader_->samples_per_epoch();
    return o_.drop_last ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
  }
  uint64_t samples_per_epoch() {
    Open();
    return loader_->samples_per_epoch();
  }
  uint64_t record_bytes() {
    Open();
    return loader_->record_bytes();
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
    version_ = loader_->version();
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
  std::unique_ptr<Loader> loader_;
  std::string version_;
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
      .def("__dlpack__", &PyBatch::dlpack, py::kw_only(), py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyBatch&) { return py::make_tuple(kDLCPU, 0); })
      .def("release", &PyBatch::release, "return the slot now (no views may remain)");

  py::class_<PyLoader>(m, "Loader")
      .def("__iter__", &PyLoader::iter, py::return_value_policy::reference_internal)
      .def("__next__", &PyLoader::next)
      .def("__len__", &PyLoader::len)
      .def("state_dict", &PyLoader::state_dict)
      .def("load_state_dict", &PyLoader::load_state_dict, py::arg("state"))
      .def("set_epoch", &PyLoader::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &PyLoader::epoch)
      .def_property_readonly("samples_per_epoch", &PyLoader::samples_per_epoch)
      .def_property_readonly("record_bytes", &PyLoader::record_bytes)
      .def("close", &PyLoader::close);

  py::class_<PyClient>(m, "Client")
      .def(py::init([](const std::string& path) {
             Result<std::unique_ptr<Client>> c = Internal("");
             {
               py::gil_scoped_release nogil;
               c = Client::Connect(path);
             }
             if (!c.ok()) Raise(c.status());
             return PyClient{std::shared_ptr<Client>(std::move(*c))};
           }),
           py::arg("socket_path") = std::string(kDefaultSocketPath))
      .def(
          "loader",
          [](PyClient& c, const std::string& dataset, uint32_t batch_size, uint64_t seed, uint64_t epoch,
             const std::string& shuffle, uint32_t rank, uint32_t world_size, bool drop_last,
             uint32_t block_window_shards, uint32_t timeout_ms) {
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
            return PyLoader(c.client, o);
          },
          py::arg("dataset"), py::arg("batch_size") = 32, py::arg("seed") = 0, py::arg("epoch") = 0,
          py::arg("shuffle") = "none", py::arg("rank") = 0, py::arg("world_size") = 1,
          py::arg("drop_last") = false, py::arg("block_window_shards") = 0, py::arg("timeout_ms") = 0)
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
      .def_property_readonly("arena_bytes", [](const PyClient& c) { return c.client->arena_bytes(); })
      .def_property_readonly("slot_count", [](const PyClient& c) { return c.client->slot_count(); })
      .def_property_readonly("slot_bytes", [](const PyClient& c) { return c.client->slot_bytes(); });

  // shardcache.Stager / DeviceBatch (python/src/stager_binding.cc).
  RegisterStager(m, [](py::handle c) { return c.cast<PyClient&>().client; });
}
