#pragma once
// ClusterConfig: everything a node needs to know about the job, read once at the edge
// (a main, or KVStore::Create) from flags and the DMLC_* environment, validated, then passed
// down. Nothing below the edge reads the environment.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ps {

enum class Role { kScheduler = 1, kServer = 2, kWorker = 3 };

// "scheduler", "server", "worker".
std::string RoleName(Role role);
// The role RoleName gives `name` (as DMLC_ROLE holds it); nullopt for any other text.
std::optional<Role> RoleFromName(std::string_view name);

// Looks a setting up by its environment-variable name (e.g. "DMLC_ROLE"); nullopt when unset.
using SettingLookup = std::function<std::optional<std::string>(std::string_view name)>;

struct ClusterConfig {
  Role role = Role::kWorker;
  std::string root_uri;         // DMLC_PS_ROOT_URI: scheduler host name or IP
  int root_port = 0;            // DMLC_PS_ROOT_PORT: 0 lets the scheduler pick a free port
  int num_servers = 0;          // DMLC_NUM_SERVER
  int num_workers = 0;          // DMLC_NUM_WORKER
  std::string node_host;        // DMLC_NODE_HOST: the address this node advertises ("" = derive)
  std::string interface;        // DMLC_INTERFACE: derive the advertised address from this NIC
  int verbose = 0;              // PS_VERBOSE: 1 connections, 2 every message
  bool use_kubernetes = false;  // DMLC_USE_KUBERNETES: the scheduler binds 0.0.0.0
  std::chrono::milliseconds heartbeat_interval{2000};  // PS_HEARTBEAT_INTERVAL (s); 0: off
  std::chrono::milliseconds heartbeat_timeout{20000};  // PS_HEARTBEAT_TIMEOUT (s)
  std::chrono::milliseconds register_timeout{60000};   // PS_REGISTER_TIMEOUT (s)
  // PS_STALL_TIMEOUT (s), read by the scheduler: how long dist_sync workers whose pushes come
  // from several threads may wait for each other's pushes, none of their threads pushing,
  // before the job ends (another thread may still push, so the scheduler cannot be sure
  // earlier); 0: never. Workers that push from the waiting thread only end the job at once.
  std::chrono::milliseconds stall_timeout{600000};
  // A wait for other workers that lasts (a collective on the scheduler, a dist_sync round on a
  // worker) is logged, naming what it waits for, after half of stall_timeout (at most a minute;
  // a minute when it is 0), then every kLongWaitNoteEvery while it lasts.
  std::chrono::milliseconds long_wait_note() const {
    constexpr std::chrono::milliseconds kAtMost{60000};
    return stall_timeout.count() > 0 ? std::min(kAtMost, stall_timeout / 2) : kAtMost;
  }
  static constexpr std::chrono::milliseconds kLongWaitNoteEvery{300000};
  // MXNET_KVSTORE_BIGARRAY_BOUND: keys of at least this many elements are sliced over all
  // servers; smaller ones live whole on one.
  std::size_t big_array_bound = 1000000;
  // PS_CHUNK_BYTES: the largest slice of a big key in one message (pipelining granularity).
  std::size_t chunk_bytes = std::size_t{4} << 20;
  // PS_SERVER_WEIGHTS: each server rank's share of the keys, relative to the others (a server
  // on a host with a slower link or CPU takes less), scaled so the largest is 1000; empty when
  // all are equal (the default).
  std::vector<std::uint32_t> server_weights;
  // PS_RANK: the rank this node asks for within its role (-1: none; a server's or worker's
  // must be below its role's count). Ranks are assigned by sorting on (requested rank, host,
  // port), so requests order nodes without gaps.
  int rank_hint = -1;
  // PS_USE_IPC: same-host peers exchange messages over ipc:// instead of TCP loopback.
  bool use_ipc = true;
  // PS_USE_SHM: same-host workers and servers exchange KVStore values of at least
  // kShmMinBytes through shared memory, with only the control messages on the socket.
  bool use_shm = true;
  // PS_SHM_MAX_SEGMENTS: the most shared-memory segments a node maps (0: a quarter of the
  // kernel's vm.max_map_count). A worker makes one per server at each Init call, and a server
  // maps each worker's: past the kernel's limit on a process's mappings every mmap fails, its
  // memory allocations included. Past this one, further values travel over the socket.
  int shm_max_segments = 0;
  // PS_TCP_RCVBUF: SO_RCVBUF of every TCP connection this node receives on, in bytes, which caps
  // each sender's window into it (0: the kernel's autotuning). Many flows into one link (every
  // worker pushing to one server) overflow a shallow switch queue, and a flow that loses a
  // packet falls behind the round; windows whose sum fits the queue lose none.
  int tcp_receive_buffer = 0;
  // PS_IO_THREADS: ZeroMQ I/O threads of this node. Two let a node's outgoing copies into the
  // kernel run beside its incoming ones (a push streams up while earlier replies stream down).
  int io_threads = 2;
  // PS_WAIT_SPIN_US: how long KVStore::WaitAll polls for completion before it sleeps, while its
  // previous wait was that short (0: never polls). Sleeping and being woken costs tens of
  // microseconds; a small push round-trips in about as long.
  std::chrono::microseconds wait_spin{200};
  // PS_JOB_SECRET, or the first line of the file PS_JOB_SECRET_FILE: the password every
  // connection of the job must give. A process without it cannot register, nor read or write
  // any node ("": the job has none, and any process that reaches a port may join).
  std::string job_secret;
  // PS_ENCRYPT: every connection encrypted with ZeroMQ's CURVE, keys derived from job_secret
  // (which it needs). Every node of a job must agree.
  bool encrypt = false;
  // PS_REPLICATION: with two or more servers, every key range also lives on a replica (the next
  // live server in rank order) that applies each update before it is acknowledged, so a dead
  // server's ranges go on from its replica instead of ending the job. Every node must agree.
  bool replication = true;
  // Whether this job replicates: PS_REPLICATION and at least two servers.
  bool replicated() const { return replication && num_servers >= 2; }
  // The type of KVStore a worker's program created ("dist_sync" or "dist_async"): set by
  // KVStore::Create, never read from the environment; "" for other nodes and for a Runtime used
  // on its own. Every worker that created one must agree: a worker waiting for rounds and one
  // that pushes without them would wait on each other for ever.
  std::string kvstore_type;

  // Parses and validates every setting; throws ps::Error naming the variable and the accepted
  // values. `lookup` answers by environment-variable name; a main maps its flags onto those
  // names so that a flag given on the command line wins.
  static ClusterConfig Parse(const SettingLookup& lookup);
  // Parse() over the process environment. Call only at the edge.
  static ClusterConfig FromEnvironment();
  // Checks a config filled in by hand as Parse checks the environment, each field as the
  // variable named beside it; throws ps::Error naming the first bad one. Runtime::Start and
  // the Scheduler call it.
  void Validate() const;

  // "host:port" of the scheduler, for messages.
  std::string SchedulerAddress() const;

  // The settings every node of a job must share, by environment-variable name, each with its
  // value as that variable would spell it. A node sends them when it registers and the
  // scheduler refuses one that disagrees: nodes that size their rounds, their heartbeats or
  // their key layout differently would otherwise hang or declare each other dead.
  struct SharedSetting {
    std::string_view name;
    std::string value;
    // Who must agree on it. kAllNodes: compared with the scheduler's own. kDataNodes: servers
    // and workers (how a key is sliced, hence the largest frame a server accepts), compared
    // with the first of them to register. kStoreWorkers: the workers that created a KVStore
    // (its type), compared with the first of them.
    enum class Among { kAllNodes, kDataNodes, kStoreWorkers };
    Among among = Among::kAllNodes;
  };
  std::vector<SharedSetting> SharedSettings() const;
  // The name SharedSettings gives kvstore_type (not an environment variable).
  static constexpr std::string_view kKVStoreTypeSetting = "KVSTORE_TYPE";
};

// PS_SERVER_WEIGHTS's text ("" or one positive number per server rank, comma-separated) as
// ClusterConfig::server_weights: scaled to integers (the largest 1000, none below 1) so every
// node deals key slices with the same arithmetic; empty when all are alike. Throws ps::Error.
std::vector<std::uint32_t> ParseServerWeights(const std::string& text, int num_servers);

// SharedSettings() as text, a "NAME=VALUE" line each, and back. Parse returns nullopt on text
// that is not made of such lines.
std::string EncodeSharedSettings(const std::vector<ClusterConfig::SharedSetting>& settings);
std::optional<std::vector<std::pair<std::string, std::string>>> ParseSharedSettings(
    std::string_view text);

}  // namespace ps
