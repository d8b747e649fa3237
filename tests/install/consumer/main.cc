// The KVStore API as a user's program calls it, compiled against the installed headers and
// libraries.
#include <cstdio>
#include <memory>
#include <vector>

#include <ps/kvstore.h>

int main() {
  std::unique_ptr<ps::KVStore> kv = ps::KVStore::Create("local");
  const std::size_t n = 8;
  std::vector<float> w(n, 1.0f), g(n, 2.0f), out(n);
  kv->Init(7, ps::Tensor(w.data(), w.size()));
  ps::OptimizerConfig opt;
  opt.name = "sgd";
  opt.learning_rate = 0.5f;
  kv->SetOptimizer(opt);
  kv->PushPull(7, ps::Tensor(g.data(), n), ps::Tensor(out.data(), n));
  kv->WaitAll();
  try {
    kv->Pull(8, ps::Tensor(out.data(), n));
    return 1;
  } catch (const ps::Error& e) {
    std::printf("expected error: %s\n", e.what());
  }
  std::printf("consumer: value=%g rank=%d workers=%d\n", out[0], kv->Rank(), kv->NumWorkers());
  return out[0] == 0.0f ? 0 : 1;
}
