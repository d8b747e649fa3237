// KVStore::Create: picks the implementation for a type name.
#include "ps/kvstore.h"

#include "kvstore/compression.h"
#include "kvstore/dist_kvstore_factory.h"
#include "kvstore/local_kvstore.h"

namespace ps {
namespace {

bool IsDist(const std::string& type) { return type == "dist_sync" || type == "dist_async"; }

[[noreturn]] void UnknownType(const std::string& type) {
  throw Error("KVStore::Create: unknown type '" + type +
              "' (accepted: local, dist_sync, dist_async)");
}

}  // namespace

void KVStore::SetGradientCompression(const GradientCompression& config) {
  const std::string store = Type() + " kvstore: ";
  try {
    compression::Parse(config);  // a bad setting is named first, as on the dist stores
  } catch (const Error& e) {
    throw Error(store + e.what());
  }
  throw Error(store +
              "SetGradientCompression: gradient compression is for the distributed stores "
              "(dist_sync, dist_async), as in MXNet: a \"" +
              Type() + "\" store sends nothing over a network link");
}

std::unique_ptr<KVStore> KVStore::Create(const std::string& type) {
  if (type == "local") return std::make_unique<LocalKVStore>();
  if (IsDist(type)) return CreateDistKVStore(type, nullptr);
  UnknownType(type);
}

std::unique_ptr<KVStore> KVStore::Create(const std::string& type, const ClusterConfig& config) {
  if (type == "local") return std::make_unique<LocalKVStore>();  // no cluster to use
  if (IsDist(type)) return CreateDistKVStore(type, &config);
  UnknownType(type);
}

}  // namespace ps
