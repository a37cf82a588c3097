/* libshardcache C API: opaque handles over the C++ client (shardcache/client.h), for FFI from
 * languages that cannot call C++.
 *
 * Every fallible call returns a status code (0 = OK; otherwise a shardcache::StatusCode, the
 * gRPC numbering: 3 invalid argument, 5 not found, 7 permission denied, 8 resource exhausted,
 * 11 out of range, 14 unavailable, ...). sc_last_error() gives the message of the last failure
 * on the calling thread. sc_loader_next returns SC_END_OF_EPOCH (11) when the epoch is done.
 *
 * Ownership: each handle is freed by its own close/release call, in any order: a loader stays
 * open in the daemon until its batches are released, the connection until its loaders and
 * batches are gone. A batch's bytes stay valid until sc_batch_release.
 *
 * Thread safety: handles may be used from several threads, but one handle must not be freed
 * while another thread uses it. */
#ifndef SHARDCACHE_C_API_H_
#define SHARDCACHE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SC_OK 0
#define SC_END_OF_EPOCH 11

#define SC_SHUFFLE_NONE 0
#define SC_SHUFFLE_GLOBAL 1
#define SC_SHUFFLE_BLOCK 2

typedef struct sc_client sc_client;
typedef struct sc_loader sc_loader;
typedef struct sc_batch sc_batch;

typedef struct sc_loader_options {
  const char* dataset;
  uint32_t batch_size;
  uint64_t seed;
  uint64_t epoch;
  int shuffle; /* SC_SHUFFLE_* */
  uint32_t rank;
  uint32_t world_size;
  int drop_last;
  uint64_t samples_consumed; /* resume point */
  uint32_t block_window_shards;
  uint32_t next_timeout_ms;
} sc_loader_options;

/* Fills defaults: batch_size 32, world_size 1, everything else 0. */
void sc_loader_options_init(sc_loader_options* options);

/* Message of the last failure on this thread ("" when none). Valid until the next call. */
const char* sc_last_error(void);

/* socket_path NULL = the default /run/shardcache/shardcached.sock. */
int sc_client_connect(const char* socket_path, sc_client** out);
void sc_client_close(sc_client* client);
uint64_t sc_client_arena_bytes(const sc_client* client);
const uint8_t* sc_client_arena_data(const sc_client* client);

int sc_loader_open(sc_client* client, const sc_loader_options* options, sc_loader** out);
void sc_loader_close(sc_loader* loader);
/* SC_END_OF_EPOCH when the epoch is done (*out is NULL then). */
int sc_loader_next(sc_loader* loader, sc_batch** out);
void sc_loader_state(const sc_loader* loader, uint64_t* epoch, uint64_t* samples_consumed);
uint64_t sc_loader_samples_per_epoch(const sc_loader* loader);
uint64_t sc_loader_record_bytes(const sc_loader* loader);

size_t sc_batch_size(const sc_batch* batch);
uint64_t sc_batch_sample_id(const sc_batch* batch, size_t i);
/* Pointer to sample i's bytes; its length in *length. */
const uint8_t* sc_batch_sample(const sc_batch* batch, size_t i, size_t* length);
const uint64_t* sc_batch_sample_ids(const sc_batch* batch);
const uint8_t* sc_batch_data(const sc_batch* batch);
uint64_t sc_batch_payload_bytes(const sc_batch* batch);
/* > 0 when the payload is a dense [size, record_bytes] block. */
uint64_t sc_batch_record_bytes(const sc_batch* batch);
/* Returns the batch's slot to the daemon and frees the handle. NULL is ignored. */
void sc_batch_release(sc_batch* batch);

#ifdef __cplusplus
}
#endif

#endif /* SHARDCACHE_C_API_H_ */
