// shardcache.Stager: batches staged into GPU memory ahead of the trainer, handed to torch /
// cupy / numpy through DLPack.
//
//   stager = shardcache.Stager(client, loader, depth=2, convert="tokens_shift")
//   for batch in stager:                        # shardcache.DeviceBatch, in loader order
//       x = torch.from_dlpack(batch.inputs)     # CUDA int64 [B, T-1], ordered after the copy
//       y = torch.from_dlpack(batch.targets)
//
// The stager opens its own C++ loader from `loader.state_dict()` (dataset, seed, epoch, shuffle,
// rank, world size, batch size, drop_last, resume point); the Python loader only describes the
// epoch and is not advanced. `__dlpack__(stream=None)` follows the array API: the consumer's
// stream (None = the legacy default stream, 1) waits on the device for the batch's ready event,
// and the capsule holds the batch's device buffer until the consumer's deleter runs, so the
// stager never overwrites a buffer a tensor still points to. Without a GPU (or a CUDA build)
// the same objects live in host memory and export with the CPU device type.
//
// The GIL is released around every call that may block (daemon round trips, waiting for a
// staged batch, stopping the worker). DeviceBatch and DeviceTensor may be dropped on any thread.
#include "python/src/stager_binding.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "gpu/device.h"
#include "gpu/stager.h"
#include "python/src/loader_source.h"
#include "shardcache/client.h"

namespace shardcache {
namespace {

namespace py = pybind11;
using gpu::DeviceBatch;
using gpu::DeviceTensor;
using gpu::HostBatch;
using gpu::Stager;
using gpu::StagerOptions;

// shardcache.Error, looked up once at registration (module.cc creates it).
py::handle g_error_type;
// How to reach the C++ Client behind a shardcache.Client. Leaked: module lifetime.
PyClientAccessor* g_client_of = nullptr;

[[noreturn]] void Raise(const Status& s) {
  if (!g_error_type) throw std::runtime_error(s.ToString());
  py::object e = g_error_type(s.ToString());
  e.attr("code") = static_cast<int>(s.code());
  e.attr("code_name") = StatusCodeName(s.code());
  PyErr_SetObject(g_error_type.ptr(), e.ptr());
  throw py::error_already_set();
}

gpu::ConversionSpec ParseConversion(const py::object& convert, const std::string& token_dtype,
                                    const std::optional<std::pair<int64_t, int64_t>>& image_size, int channels,
                                    const std::vector<float>& mean, const std::vector<float>& std) {
  gpu::ConversionSpec spec;
  const std::string name = convert.is_none() ? "none" : convert.cast<std::string>();
  if (name == "none") return spec;
  if (name == "tokens_int64" || name == "tokens_shift") {
    spec.kind = gpu::ConversionSpec::Kind::kTokens;
    spec.shift = name == "tokens_shift";
    if (token_dtype == "uint16") {
      spec.token_type = gpu::DType::kUInt16;
    } else if (token_dtype == "uint32") {
      spec.token_type = gpu::DType::kUInt32;
    } else {
      throw py::value_error("token_dtype must be \"uint16\" or \"uint32\", not \"" + token_dtype + "\"");
    }
    return spec;
  }
  if (name == "image_f32" || name == "image_bf16") {
    if (!image_size) throw py::value_error(name + " needs image_size=(height, width)");
    spec.kind = gpu::ConversionSpec::Kind::kImage;
    spec.out_type = name == "image_f32" ? gpu::DType::kFloat32 : gpu::DType::kBFloat16;
    spec.height = image_size->first;
    spec.width = image_size->second;
    spec.channels = channels;
    spec.mean = mean;
    spec.std = std;
    return spec;
  }
  throw py::value_error("convert must be None, \"tokens_int64\", \"tokens_shift\", \"image_f32\" or \"image_bf16\", not \"" +
                        name + "\"");
}

gpu::DeviceOptions ParseDevice(const std::string& device, int device_id) {
  gpu::DeviceOptions o;
  o.ordinal = device_id;
  if (device == "auto") {
    o.select = gpu::DeviceOptions::Select::kAuto;
  } else if (device == "cuda") {
    o.select = gpu::DeviceOptions::Select::kCuda;
  } else if (device == "host" || device == "cpu") {
    o.select = gpu::DeviceOptions::Select::kHost;
  } else {
    throw py::value_error("device must be \"auto\", \"cuda\" or \"host\", not \"" + device + "\"");
  }
  return o;
}

// (device type, ordinal) as __dlpack_device__ reports it.
py::tuple DLDeviceOf(const DeviceBatch& b) {
  if (b.backend() == gpu::Backend::kCuda) return py::make_tuple(static_cast<int>(kDLCUDA), b.device_ordinal());
  return py::make_tuple(static_cast<int>(kDLCPU), 0);
}

// One tensor of a staged batch; shares the batch, so the batch outlives every tensor object.
class PyDeviceTensor {
 public:
  PyDeviceTensor(std::shared_ptr<DeviceBatch> batch, size_t index) : batch_(std::move(batch)), index_(index) {}

  const DeviceTensor& t() const { return batch_->tensor(index_); }
  py::tuple shape() const { return py::tuple(py::cast(t().shape)); }
  std::string dtype() const { return gpu::DTypeName(t().dtype); }
  uint64_t nbytes() const { return t().bytes(); }
  py::tuple dlpack_device() const { return DLDeviceOf(*batch_); }

  // __dlpack__(stream=None, max_version=None, dl_device=None, copy=None). Returns a legacy
  // "dltensor" capsule (allowed by the array API whatever max_version asks for).
  py::capsule dlpack(const py::object& stream, const py::object& /*max_version*/, const py::object& dl_device,
                     const py::object& copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("shardcache.DeviceTensor exports without copying only (copy=True is not supported)");
    }
    if (!dl_device.is_none() && !dl_device.equal(dlpack_device())) {
      throw py::buffer_error("shardcache.DeviceTensor lives on " + py::str(dlpack_device()).cast<std::string>() +
                             "; cannot export to dl_device " + py::str(dl_device).cast<std::string>());
    }
    // Array API: None means the legacy default stream (1) for CUDA; ignored on the host path.
    const int64_t s = stream.is_none() ? 1 : stream.cast<int64_t>();
    Result<DLManagedTensor*> managed = batch_->ExportDLPack(index_, s);
    if (!managed.ok()) throw py::buffer_error(managed.status().ToString());
    // A consumer renames the capsule to "used_dltensor" and calls the deleter itself; an unused
    // capsule frees the tensor (and its hold on the device buffer) when it is collected.
    PyObject* cap = PyCapsule_New(*managed, "dltensor", [](PyObject* c) {
      if (PyCapsule_IsValid(c, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
        m->deleter(m);
      }
    });
    if (cap == nullptr) {
      (*managed)->deleter(*managed);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
  }

  std::string repr() const {
    return "<shardcache.DeviceTensor " + dtype() + py::str(shape()).cast<std::string>() + " on " +
           py::str(dlpack_device()).cast<std::string>() + ">";
  }

 private:
  std::shared_ptr<DeviceBatch> batch_;
  size_t index_;
};

class PyDeviceBatch {
 public:
  PyDeviceBatch(DeviceBatch b, bool shifted)
      : batch_(std::make_shared<DeviceBatch>(std::move(b))), shifted_(shifted) {}

  uint64_t size() const { return batch_->records(); }
  size_t num_tensors() const { return batch_->num_tensors(); }
  PyDeviceTensor tensor(py::ssize_t i) const {
    const auto n = static_cast<py::ssize_t>(batch_->num_tensors());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error("tensor index out of range (the batch has " + std::to_string(n) + ")");
    return PyDeviceTensor(batch_, static_cast<size_t>(i));
  }
  py::tuple tensors() const {
    py::tuple out(batch_->num_tensors());
    for (size_t i = 0; i < batch_->num_tensors(); ++i) out[i] = py::cast(PyDeviceTensor(batch_, i));
    return out;
  }
  // The batch's only tensor (raw bytes, tokens or images).
  PyDeviceTensor data() const {
    if (batch_->num_tensors() != 1) {
      throw py::value_error("this batch holds " + std::to_string(batch_->num_tensors()) +
                            " tensors (tokens_shift): use batch.inputs and batch.targets");
    }
    return PyDeviceTensor(batch_, 0);
  }
  PyDeviceTensor pair_part(size_t i) const {
    if (!shifted_) throw py::value_error("inputs/targets exist only with convert=\"tokens_shift\"; use batch.data");
    return PyDeviceTensor(batch_, i);
  }
  py::array_t<int64_t> sample_ids() const {
    const auto& ids = batch_->sample_ids();
    py::array_t<int64_t> a(static_cast<py::ssize_t>(ids.size()));
    std::copy(ids.begin(), ids.end(), a.mutable_data());
    return a;
  }
  py::array_t<uint64_t> sample_offsets() const {
    const auto& off = batch_->sample_offsets();
    py::array_t<uint64_t> a(static_cast<py::ssize_t>(off.size()));
    std::copy(off.begin(), off.end(), a.mutable_data());
    return a;
  }
  std::string device() const {
    return batch_->backend() == gpu::Backend::kCuda ? "cuda:" + std::to_string(batch_->device_ordinal()) : "cpu";
  }
  // Makes a CUDA stream (given as its integer handle, e.g. torch's stream.cuda_stream) wait for
  // the copy on the device; the buffer is reused only after that stream's work queued so far.
  void wait(int64_t stream) {
    Status s = batch_->WaitOn(reinterpret_cast<gpu::NativeStream>(stream));
    if (!s.ok()) Raise(s);
  }
  const std::shared_ptr<DeviceBatch>& batch() const { return batch_; }

 private:
  std::shared_ptr<DeviceBatch> batch_;
  bool shifted_;
};

class PyStager {
 public:
  PyStager(std::shared_ptr<Client> client, LoaderOptions loader_options, StagerOptions options)
      : client_(std::move(client)), loader_options_(std::move(loader_options)), options_(std::move(options)) {
    OpenLoader();
    options_.record_bytes = loader_->record_bytes();
    options_.max_records = loader_options_.batch_size;
    CreateStager();
  }

  ~PyStager() {
    // Stopping waits for the worker, which may be inside a daemon round trip.
    py::gil_scoped_release nogil;
    stager_.reset();
    loader_.reset();
  }

  PyStager& iter() { return *this; }

  PyDeviceBatch next() {
    CheckUsable();
    if (finished_) throw py::stop_iteration();
    if (!running_) {
      Status s = stager_->Start(SourceFromLoader(*loader_));
      if (!s.ok()) Raise(s);
      running_ = true;
    }
    Result<std::optional<DeviceBatch>> r = Internal("");
    {
      py::gil_scoped_release nogil;
      r = stager_->Next();
    }
    if (!r.ok() || !r->has_value()) {
      running_ = false;
      finished_ = true;
      if (!r.ok()) Raise(r.status());
      throw py::stop_iteration();
    }
    return PyDeviceBatch(std::move(**r), options_.conversion.shift);
  }

  // Stages epoch `epoch` from its beginning on the next iteration. A partly staged epoch is
  // abandoned (its host batches go back to the daemon).
  void set_epoch(uint64_t epoch) {
    Status s;
    {
      py::gil_scoped_release nogil;
      if (running_) {
        // Stager::Start refuses while an epoch runs: stop this one by rebuilding the stager.
        stager_.reset();
        running_ = false;
      }
      loader_.reset();
      loader_options_.epoch = epoch;
      loader_options_.samples_consumed = 0;
      finished_ = false;
      s = OpenLoaderStatus();
      if (s.ok() && !stager_) s = CreateStagerStatus();
    }
    if (!s.ok()) Raise(s);
  }

  uint64_t len() const {
    CheckUsable();
    const uint64_t n = loader_->samples_per_epoch();
    const uint64_t b = loader_options_.batch_size;
    return loader_options_.drop_last ? n / b : (n + b - 1) / b;
  }
  uint64_t epoch() const { return loader_options_.epoch; }
  std::string device() const {
    CheckUsable();
    return stager_->device().Describe();
  }
  py::tuple dlpack_device() const {
    const gpu::Device& d = stager_->device();
    if (d.is_cuda()) return py::make_tuple(static_cast<int>(kDLCUDA), d.ordinal());
    return py::make_tuple(static_cast<int>(kDLCPU), 0);
  }
  py::dict stats() const {
    const gpu::StagerStats s = stager_->Stats();
    py::dict d;
    d["batches_staged"] = s.batches_staged;
    d["bytes_staged"] = s.bytes_staged;
    d["bytes_bounced"] = s.bytes_bounced;
    d["batches_gathered"] = s.batches_gathered;
    d["arena_registered"] = s.arena_registered;
    d["h2d_payload_bytes"] = s.h2d_payload_bytes;
    d["h2d_index_bytes"] = s.h2d_index_bytes;
    return d;
  }

 private:
  // After a failed set_epoch the loader or stager may be missing.
  void CheckUsable() const {
    if (!loader_ || !stager_) throw py::value_error("this Stager failed to open its epoch; call set_epoch again");
  }
  void OpenLoader() {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = OpenLoaderStatus();
    }
    if (!s.ok()) Raise(s);
  }
  Status OpenLoaderStatus() {
    SC_ASSIGN_OR_RETURN(loader_, client_->OpenLoader(loader_options_));
    return Status::Ok();
  }
  void CreateStager() {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = CreateStagerStatus();
    }
    if (!s.ok()) Raise(s);
  }
  Status CreateStagerStatus() {
    SC_ASSIGN_OR_RETURN(stager_, Stager::Create(options_));
    return Status::Ok();
  }

  // Destroyed in reverse: the stager (whose worker calls the loader) before the loader, the
  // loader before the client.
  std::shared_ptr<Client> client_;
  LoaderOptions loader_options_;
  StagerOptions options_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Stager> stager_;
  bool running_ = false;   // Start() called, end of epoch not yet seen
  bool finished_ = false;  // this epoch's end (or error) was returned
};

// LoaderOptions from a shardcache.Loader's state_dict() (or such a dict itself).
LoaderOptions LoaderOptionsFrom(const py::object& loader) {
  py::dict d = py::hasattr(loader, "state_dict") ? py::dict(loader.attr("state_dict")()) : py::dict(loader);
  auto need = [&](const char* key) -> py::object {
    if (!d.contains(key)) throw py::value_error(std::string("loader state has no \"") + key + "\"");
    return d[key];
  };
  LoaderOptions o;
  o.dataset = need("dataset").cast<std::string>();
  o.batch_size = need("batch_size").cast<uint32_t>();
  o.seed = need("seed").cast<uint64_t>();
  o.epoch = need("epoch").cast<uint64_t>();
  auto shuffle = ParseShuffle(need("shuffle").cast<std::string>());
  if (!shuffle.ok()) throw py::value_error(shuffle.status().message());
  o.shuffle = *shuffle;
  o.rank = need("rank").cast<uint32_t>();
  o.world_size = need("world_size").cast<uint32_t>();
  o.drop_last = need("drop_last").cast<bool>();
  o.samples_consumed = need("samples_consumed").cast<uint64_t>();
  if (d.contains("pad")) o.pad = d["pad"].cast<bool>();
  if (d.contains("start_position")) o.start_position = d["start_position"].cast<uint64_t>();
  if (d.contains("block_window_shards")) o.block_window_shards = d["block_window_shards"].cast<uint32_t>();
  if (d.contains("version")) o.expect_version = d["version"].cast<std::string>();
  return o;
}

}  // namespace

void RegisterStager(py::module_& m, PyClientAccessor client_of) {
  g_client_of = new PyClientAccessor(std::move(client_of));
  if (py::hasattr(m, "Error")) g_error_type = py::object(m.attr("Error")).release();

  m.def("cuda_available", [] { return gpu::CudaCompiledIn() && gpu::VisibleCudaDevices() > 0; },
        "True when this build has CUDA and the runtime sees a GPU (Stager then stages to it)");
  m.def("cuda_compiled_in", &gpu::CudaCompiledIn, "True when this build contains the CUDA path");

  py::class_<PyDeviceTensor>(m, "DeviceTensor",
                             "One tensor of a DeviceBatch; torch.from_dlpack / numpy.from_dlpack take it")
      .def_property_readonly("shape", &PyDeviceTensor::shape)
      .def_property_readonly("dtype", &PyDeviceTensor::dtype, "uint8, int64, float32 or bfloat16")
      .def_property_readonly("nbytes", &PyDeviceTensor::nbytes)
      .def("__dlpack__", &PyDeviceTensor::dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "DLPack capsule; the consumer stream (None = legacy default stream) waits for the copy on the device")
      .def("__dlpack_device__", &PyDeviceTensor::dlpack_device, "(2, ordinal) on CUDA, (1, 0) on the host path")
      .def("__repr__", &PyDeviceTensor::repr);

  py::class_<PyDeviceBatch>(m, "DeviceBatch", "A batch staged in device memory (host memory without a GPU)")
      .def("__len__", &PyDeviceBatch::size)
      .def_property_readonly("num_tensors", &PyDeviceBatch::num_tensors)
      .def("tensor", &PyDeviceBatch::tensor, py::arg("i"))
      .def_property_readonly("tensors", &PyDeviceBatch::tensors)
      .def_property_readonly("data", &PyDeviceBatch::data, "the only tensor (raw bytes, tokens or images)")
      .def_property_readonly("inputs", [](const PyDeviceBatch& b) { return b.pair_part(0); },
                             "tokens_shift: int64 [B, T-1], tokens 0..T-2")
      .def_property_readonly("targets", [](const PyDeviceBatch& b) { return b.pair_part(1); },
                             "tokens_shift: int64 [B, T-1], tokens 1..T-1")
      .def_property_readonly("sample_ids", &PyDeviceBatch::sample_ids)
      .def_property_readonly("sample_offsets", &PyDeviceBatch::sample_offsets,
                             "variable-size samples (no conversion): where each starts in data")
      .def_property_readonly("device", &PyDeviceBatch::device, "\"cuda:N\" or \"cpu\"")
      .def("wait", &PyDeviceBatch::wait, py::arg("stream"),
           "make a CUDA stream (integer handle) wait for this batch's copy; no-op on the host path")
      // The batch itself exports its only tensor, like batch.data.
      .def(
          "__dlpack__",
          [](const PyDeviceBatch& b, const py::object& stream, const py::object& max_version,
             const py::object& dl_device, const py::object& copy) {
            return b.data().dlpack(stream, max_version, dl_device, copy);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const PyDeviceBatch& b) { return DLDeviceOf(*b.batch()); });

  py::class_<PyStager>(m, "Stager")
      .def(py::init([](const py::object& client, const py::object& loader, int depth, const py::object& convert,
                       const std::string& token_dtype, std::optional<std::pair<int64_t, int64_t>> image_size,
                       int channels, std::vector<float> mean, std::vector<float> std, const std::string& device,
                       int device_id, bool force_bounce) {
             std::shared_ptr<Client> c = (*g_client_of)(client);
             StagerOptions o = StagerOptionsForClient(*c);
             o.depth = depth;
             o.conversion = ParseConversion(convert, token_dtype, image_size, channels, mean, std);
             o.device = ParseDevice(device, device_id);
             o.force_bounce = force_bounce;
             return std::make_unique<PyStager>(std::move(c), LoaderOptionsFrom(loader), std::move(o));
           }),
           py::arg("client"), py::arg("loader"), py::arg("depth") = 2, py::arg("convert") = py::none(),
           py::arg("token_dtype") = "uint16", py::arg("image_size") = py::none(), py::arg("channels") = 3,
           py::arg("mean") = std::vector<float>{}, py::arg("std") = std::vector<float>{},
           py::arg("device") = "auto", py::arg("device_id") = 0, py::arg("force_bounce") = false,
           "Stages the epoch `loader` describes into device memory, `depth` batches ahead.\n"
           "convert: None (raw uint8), \"tokens_int64\", \"tokens_shift\" (inputs/targets), \"image_f32\",\n"
           "\"image_bf16\" (uint8 HWC -> CHW, (x/255 - mean)/std; needs image_size=(H, W), channels).\n"
           "device: \"auto\" (CUDA when available), \"cuda\" or \"host\".\n"
           "Each batch (and each tensor exported from it) alive occupies one of the `depth` buffers; a\n"
           "loop holds batch k while asking for k+1, so keep at most depth-2 older batches or exports\n"
           "alive while iterating, or next() waits for one of them to go.")
      .def("__iter__", &PyStager::iter, py::return_value_policy::reference_internal)
      .def("__next__", &PyStager::next)
      .def("__len__", &PyStager::len)
      .def("set_epoch", &PyStager::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &PyStager::epoch)
      .def_property_readonly("device", &PyStager::device, "\"cuda:0 (NVIDIA H200, sm_90)\" or \"host\"")
      .def("__dlpack_device__", &PyStager::dlpack_device)
      .def("stats", &PyStager::stats);
}

}  // namespace shardcache
