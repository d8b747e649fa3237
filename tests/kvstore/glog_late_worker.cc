// ps-test-glog-late-worker: a dist_sync KVStore worker that sets glog up only after it created
// its store, as a user's program may. With PS_VERBOSE=1 the library logs before and after that
// call; it must neither make glog print "Logging before InitGoogleLogging()" nor make the
// program's own InitGoogleLogging abort (ps/src/glog_or_stderr.h).
#include <glog/logging.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "ps/kvstore.h"

int main(int /*argc*/, char** argv) {
  try {
    std::unique_ptr<ps::KVStore> kv = ps::KVStore::Create("dist_sync");
    std::vector<float> w(4, 1.0f), out(4);
    kv->Init(1, ps::Tensor(w.data(), w.size()));
    FLAGS_logtostderr = true;
    google::InitGoogleLogging(argv[0]);
    LOG(INFO) << "the program set up glog";
    kv->PushPull(1, ps::Tensor(w.data(), w.size()), ps::Tensor(out.data(), out.size()));
    kv->WaitAll();
    std::printf("glog late worker: ok, pulled %g\n", out[0]);
    return 0;
  } catch (const ps::Error& e) {
    std::fprintf(stderr, "glog late worker: error: %s\n", e.what());
    return 1;
  }
}
