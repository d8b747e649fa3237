// ps-test-exit-worker: a dist_sync worker that does its work and then ends its process with
// std::exit(0) while its KVStore still exists (never destroyed, so never finished). The job
// must count it as dead, and the launcher must say why (tests/launcher/test_launch_e2e.py).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "ps/kvstore.h"

int main() {
  try {
    std::unique_ptr<ps::KVStore> kv = ps::KVStore::Create("dist_sync");
    std::vector<float> w(4, 1.0f), out(4);
    kv->Init(1, ps::Tensor(w.data(), w.size()));
    kv->PushPull(1, ps::Tensor(w.data(), w.size()), ps::Tensor(out.data(), out.size()));
    kv->WaitAll();
    std::printf("exit worker: done, exiting without destroying the store\n");
    std::fflush(stdout);
    std::exit(0);  // the point: `kv` is never destroyed
  } catch (const ps::Error& e) {
    std::fprintf(stderr, "exit worker: error: %s\n", e.what());
    return 1;
  }
}
