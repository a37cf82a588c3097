// Python binding of the GPU stager (gpu/stager.h): shardcache.Stager,
// shardcache.DeviceBatch, shardcache.DeviceTensor and shardcache.cuda_available().
//
// Kept in its own translation unit (module.cc is the client's binding, this one GPU staging's).
// The module's init calls RegisterStager once, after it has registered Client and Error, and
// passes how to get the C++ Client out of a shardcache.Client object (its type is private to
// module.cc).
//
// Thread safety: called once, with the GIL held, from the module's init.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

namespace shardcache {

class Client;

// Returns the libshardcache Client behind a shardcache.Client; throws (pybind11 cast error)
// for any other object.
using PyClientAccessor = std::function<std::shared_ptr<Client>(pybind11::handle)>;

void RegisterStager(pybind11::module_& m, PyClientAccessor client_of);

}  // namespace shardcache
