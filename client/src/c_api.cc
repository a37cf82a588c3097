// The C API as a thin shell over the C++ client; errors become codes plus a thread-local
// message.
#include "shardcache/c_api.h"

#include <memory>
#include <string>

#include "shardcache/client.h"

struct sc_client {
  std::unique_ptr<shardcache::Client> impl;
};
struct sc_loader {
  std::unique_ptr<shardcache::Loader> impl;
};
struct sc_batch {
  shardcache::Batch impl;
};

namespace {

thread_local std::string g_last_error;

int Fail(const shardcache::Status& s) {
  g_last_error = s.ToString();
  return static_cast<int>(s.code());
}

}  // namespace

extern "C" {

void sc_loader_options_init(sc_loader_options* o) {
  *o = sc_loader_options{};
  o->batch_size = 32;
  o->world_size = 1;
}

const char* sc_last_error(void) { return g_last_error.c_str(); }

int sc_client_connect(const char* socket_path, sc_client** out) {
  *out = nullptr;
  auto c = shardcache::Client::Connect(socket_path ? socket_path : shardcache::kDefaultSocketPath);
  if (!c.ok()) return Fail(c.status());
  *out = new sc_client{std::move(*c)};
  return SC_OK;
}

void sc_client_close(sc_client* client) { delete client; }
uint64_t sc_client_arena_bytes(const sc_client* c) { return c->impl->arena_bytes(); }
const uint8_t* sc_client_arena_data(const sc_client* c) { return c->impl->arena_data(); }

int sc_loader_open(sc_client* client, const sc_loader_options* o, sc_loader** out) {
  *out = nullptr;
  if (o == nullptr || o->dataset == nullptr) return Fail(shardcache::InvalidArgument("no dataset named"));
  if (o->shuffle < SC_SHUFFLE_NONE || o->shuffle > SC_SHUFFLE_BLOCK) {
    return Fail(shardcache::InvalidArgument("shuffle must be SC_SHUFFLE_NONE, _GLOBAL or _BLOCK"));
  }
  shardcache::LoaderOptions lo;
  lo.dataset = o->dataset;
  lo.batch_size = o->batch_size;
  lo.seed = o->seed;
  lo.epoch = o->epoch;
  lo.shuffle = static_cast<shardcache::Shuffle>(o->shuffle);
  lo.rank = o->rank;
  lo.world_size = o->world_size;
  lo.drop_last = o->drop_last != 0;
  lo.samples_consumed = o->samples_consumed;
  lo.block_window_shards = o->block_window_shards;
  lo.next_timeout_ms = o->next_timeout_ms;
  auto l = client->impl->OpenLoader(lo);
  if (!l.ok()) return Fail(l.status());
  *out = new sc_loader{std::move(*l)};
  return SC_OK;
}

void sc_loader_close(sc_loader* loader) { delete loader; }

int sc_loader_next(sc_loader* loader, sc_batch** out) {
  *out = nullptr;
  auto b = loader->impl->Next();
  if (!b.ok()) return Fail(b.status());
  *out = new sc_batch{std::move(*b)};
  return SC_OK;
}

void sc_loader_state(const sc_loader* loader, uint64_t* epoch, uint64_t* samples_consumed) {
  const auto s = loader->impl->state();
  if (epoch) *epoch = s.epoch;
  if (samples_consumed) *samples_consumed = s.samples_consumed;
}

uint64_t sc_loader_samples_per_epoch(const sc_loader* l) { return l->impl->samples_per_epoch(); }
uint64_t sc_loader_record_bytes(const sc_loader* l) { return l->impl->record_bytes(); }

size_t sc_batch_size(const sc_batch* b) { return b->impl.size(); }
uint64_t sc_batch_sample_id(const sc_batch* b, size_t i) { return b->impl.sample_id(i); }
const uint8_t* sc_batch_sample(const sc_batch* b, size_t i, size_t* length) {
  const auto v = b->impl.sample(i);
  if (length) *length = v.size;
  return v.data;
}
const uint64_t* sc_batch_sample_ids(const sc_batch* b) { return b->impl.sample_ids().data(); }
const uint8_t* sc_batch_data(const sc_batch* b) { return b->impl.data(); }
uint64_t sc_batch_payload_bytes(const sc_batch* b) { return b->impl.payload_bytes(); }
uint64_t sc_batch_record_bytes(const sc_batch* b) { return b->impl.record_bytes(); }
void sc_batch_release(sc_batch* b) { delete b; }

}  // extern "C"
