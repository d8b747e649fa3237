// Placeholder until the distributed store lands; replaced by the real CreateDistKVStore.
#include "dist_kvstore_factory.h"

namespace ps {

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type,
                                           const ClusterConfig* /*config*/) {
  throw Error("KVStore::Create(\"" + type + "\"): dist kvstore not built yet");
}

}  // namespace ps
