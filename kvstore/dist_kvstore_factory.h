#pragma once
// The seam between KVStore::Create and the distributed store (kvstore/dist_kvstore*.cc).
#include <memory>
#include <string>

#include "ps/kvstore.h"

namespace ps {

// type: "dist_sync" or "dist_async" (KVStore::Create checked it). config: the cluster, or
// null to read it from the DMLC_* environment. In a server or scheduler process this runs
// that role and exits (see KVStore::Create).
std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const ClusterConfig* config);

}  // namespace ps
