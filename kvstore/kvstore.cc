// KVStore::Create: picks the implementation for a type name.
#include "ps/kvstore.h"

#include <cstdlib>

#include "kvstore/compression.h"
#include "kvstore/dist_kvstore_factory.h"
#include "kvstore/local_kvstore.h"
#include "ps/config.h"

namespace ps {
namespace {

bool IsDist(const std::string& type) { return type == "dist_sync" || type == "dist_async"; }

[[noreturn]] void UnknownType(const std::string& type) {
  throw Error("KVStore::Create: unknown type '" + type +
              "' (accepted: local, dist_sync, dist_async)");
}

// A process launched as a server or the scheduler (DMLC_ROLE, as with launch.py
// --same-cmd-for-all-roles) that asks for a local store would train on its own beside the job,
// unseen by it: refused, naming the role.
std::unique_ptr<KVStore> LocalUnlessRole(const std::string& role) {
  if (role == RoleName(Role::kServer) || role == RoleName(Role::kScheduler)) {
    throw Error(std::string("KVStore::Create: type 'local' in a process launched as the job's ") +
                role + " (DMLC_ROLE=" + role +
                "): a local store has no servers, so this process would train alone, unseen by "
                "the job. Create a dist_sync or dist_async store (it runs the " +
                role + " role), or start the program without DMLC_ROLE");
  }
  return std::make_unique<LocalKVStore>();
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
  if (type == "local") {
    const char* role = std::getenv("DMLC_ROLE");
    return LocalUnlessRole(role != nullptr ? role : "");
  }
  if (IsDist(type)) return CreateDistKVStore(type, nullptr);
  UnknownType(type);
}

std::unique_ptr<KVStore> KVStore::Create(const std::string& type, const ClusterConfig& config) {
  if (type == "local") return LocalUnlessRole(RoleName(config.role));  // no cluster to use
  if (IsDist(type)) return CreateDistKVStore(type, &config);
  UnknownType(type);
}

}  // namespace ps
