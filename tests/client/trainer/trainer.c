/* The C API from plain C, built against the installed library with pkg-config. */
#include <shardcache/c_api.h>
#include <stdio.h>

int main(int argc, char** argv) {
  sc_client* c;
  sc_loader* l;
  sc_batch* b;
  sc_loader_options o;
  unsigned long long samples = 0, bytes = 0, sum = 0;
  int rc;
  if (argc != 3) return 2;
  if (sc_client_connect(argv[1], &c) != SC_OK) {
    fprintf(stderr, "%s\n", sc_last_error());
    return 1;
  }
  sc_loader_options_init(&o);
  o.dataset = argv[2];
  o.batch_size = 16;
  o.shuffle = SC_SHUFFLE_BLOCK;
  if (sc_loader_open(c, &o, &l) != SC_OK) {
    fprintf(stderr, "%s\n", sc_last_error());
    return 1;
  }
  while ((rc = sc_loader_next(l, &b)) == SC_OK) {
    for (size_t i = 0; i < sc_batch_size(b); ++i) {
      size_t n;
      const uint8_t* p = sc_batch_sample(b, i, &n);
      for (size_t k = 0; k < n; ++k) sum += p[k];
      bytes += n;
    }
    samples += sc_batch_size(b);
    sc_batch_release(b);
  }
  sc_loader_close(l);
  sc_client_close(c);
  if (rc != SC_END_OF_EPOCH) return 1;
  printf("samples=%llu bytes=%llu sum=%llu\n", samples, bytes, sum);
  return 0;
}
