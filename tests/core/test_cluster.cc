// Whole clusters in one process: a Scheduler and Runtimes on threads, over real ZeroMQ on
// loopback.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "ps.pb.h"
#include "ps/error.h"
#include "ps/runtime.h"
#include "ps/scheduler.h"
#include "ps/src/job_authenticator.h"
#include "ps/src/wire.h"
#include "tests/util/child_process.h"

namespace {

using namespace std::chrono_literals;

ps::ClusterConfig SchedulerConfig(int servers, int workers) {
  ps::ClusterConfig config;
  config.role = ps::Role::kScheduler;
  config.root_uri = "127.0.0.1";
  config.root_port = 0;
  config.num_servers = servers;
  config.num_workers = workers;
  config.heartbeat_interval = 100ms;
  config.heartbeat_timeout = 2500ms;
  config.register_timeout = 20s;
  return config;
}

// Waits (bounded) until `condition` holds; for observing another thread's progress in tests.
template <class Condition>
bool Eventually(Condition condition, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Runs `body` on `count` threads, each with its own started Runtime of `role`; collects each
// thread's outcome ("" or an error) for the test thread to check.
class NodeThreads {
 public:
  NodeThreads(const ps::ClusterConfig& config, int count,
              std::function<std::string(ps::Runtime&, int index)> body)
      : outcomes_(count) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, config, i, body] {
        try {
          auto runtime = ps::Runtime::Start(config);
          outcomes_[i] = body(*runtime, i);
        } catch (const std::exception& e) {
          outcomes_[i] = std::string("exception: ") + e.what();
        }
      });
    }
  }
  ~NodeThreads() { Join(); }
  const std::vector<std::string>& Join() {
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
    return outcomes_;
  }

 private:
  std::vector<std::string> outcomes_;
  std::vector<std::thread> threads_;
};

// One node of each config joins `scheduler`'s job, as threads started in this order; returns
// the scheduler's status and what each node's registration ended in.
std::pair<int, std::vector<std::string>> RegisterPair(ps::Scheduler& scheduler,
                                                      const ps::ClusterConfig& first,
                                                      const ps::ClusterConfig& second) {
  const auto registered = [](ps::Runtime&, int) { return std::string("registered"); };
  NodeThreads first_node(first, 1, registered);
  NodeThreads second_node(second, 1, registered);
  const int status = scheduler.Run();
  return {status, {first_node.Join()[0], second_node.Join()[0]}};
}

std::string ServeUntilTerminated(ps::Runtime& runtime, int) { return runtime.WaitForTermination(); }

// A socket of a process outside the job that speaks ZeroMQ's PLAIN mechanism as nodes do,
// with connection key `key` and password `secret` (a job without a secret takes any process
// that knows the convention: the point is what it can do then).
zmq::socket_t OutsiderSocket(zmq::context_t& context, const std::string& key = "outsider",
                             const std::string& secret = ps::kNoJobSecret) {
  zmq::socket_t socket(context, zmq::socket_type::push);
  socket.set(zmq::sockopt::linger, 1000);
  socket.set(zmq::sockopt::plain_username, key);
  socket.set(zmq::sockopt::plain_password, secret);
  return socket;
}

// SO_RCVBUF of every TCP connection this process accepted (a socket whose local port is one of
// the process's listening ports), read from its descriptors.
std::vector<int> AcceptedReceiveBuffers() {
  struct TcpSocket {
    int port;
    bool listening;
    int receive_buffer;
  };
  std::vector<TcpSocket> sockets;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0, listening = 0, receive_buffer = 0;
    socklen_t length = sizeof(int);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) {
      continue;
    }
    sockaddr_in address{};
    socklen_t address_length = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &address_length) != 0 ||
        address.sin_family != AF_INET) {
      continue;
    }
    length = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length);
    length = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, &length);
    sockets.push_back({ntohs(address.sin_port), listening != 0, receive_buffer});
  }
  std::vector<int> accepted;
  for (const TcpSocket& socket : sockets) {
    if (socket.listening) continue;
    const bool on_listening_port = std::any_of(
        sockets.begin(), sockets.end(),
        [&](const TcpSocket& other) { return other.listening && other.port == socket.port; });
    if (on_listening_port) accepted.push_back(socket.receive_buffer);
  }
  return accepted;
}

}  // namespace

TEST_CASE(
    "cluster: 1 scheduler with 2 servers and 3 workers registers and runs 100 barriers and shuts "
    "down",
    "[cluster]") {
  // Sanitizers start a helper thread with the process's first thread: let that happen first.
  std::thread([] {}).join();
  const int baseline_threads = ps::test::ThreadCount();
  {
    ps::Scheduler scheduler(SchedulerConfig(2, 3));
    std::vector<int> worker_ranks(3, -1), server_ranks(2, -1);
    NodeThreads servers(scheduler.NodeConfig(ps::Role::kServer), 2,
                        [&](ps::Runtime& runtime, int i) {
                          server_ranks[i] = runtime.rank();
                          runtime.Barrier(ps::kServerGroup | ps::kWorkerGroup);
                          return runtime.WaitForTermination();
                        });
    NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 3,
                        [&](ps::Runtime& runtime, int i) -> std::string {
                          worker_ranks[i] = runtime.rank();
                          if (runtime.nodes().size() != 6) return "node table has wrong size";
                          runtime.Barrier(ps::kServerGroup | ps::kWorkerGroup);
                          for (int b = 0; b < 100; ++b) runtime.Barrier(ps::kWorkerGroup);
                          runtime.FinishWorker();
                          return "";
                        });
    CHECK(scheduler.Run() == 0);
    CHECK(scheduler.failure().empty());
    for (const auto& outcome : workers.Join()) CHECK(outcome == "");
    for (const auto& outcome : servers.Join()) CHECK(outcome == "");
    std::sort(worker_ranks.begin(), worker_ranks.end());
    std::sort(server_ranks.begin(), server_ranks.end());
    CHECK(worker_ranks == std::vector<int>{0, 1, 2});
    CHECK(server_ranks == std::vector<int>{0, 1});
  }
  CHECK(ps::test::ThreadCount() == baseline_threads);
}

TEST_CASE("cluster: a barrier of a group without the caller fails naming it, the job goes on",
          "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 1));
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1,
                     [&](ps::Runtime& runtime, int) { return runtime.WaitForTermination(); });
  NodeThreads worker(scheduler.NodeConfig(ps::Role::kWorker), 1,
                     [&](ps::Runtime& runtime, int) -> std::string {
                       std::string error;
                       try {
                         runtime.Barrier(ps::kServerGroup);
                       } catch (const ps::Error& e) {
                         error = e.what();
                       }
                       runtime.Barrier(ps::kWorkerGroup);  // the next barrier is not confused
                       runtime.FinishWorker();
                       return error;
                     });
  CHECK(scheduler.Run() == 0);
  CHECK_THAT(worker.Join()[0], Catch::Contains("barrier group 1 does not include worker 0"));
  CHECK(server.Join()[0] == "");
}

TEST_CASE("cluster: two threads of a node in one group's barrier: the later one fails at once",
          "[cluster][fault]") {
  // Before, the second wait replaced the first's record, which its thread went on reading.
  ps::Scheduler scheduler(SchedulerConfig(1, 2));
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1,
                     [&](ps::Runtime& runtime, int) { return runtime.WaitForTermination(); });
  std::promise<void> one_failed;
  std::vector<std::string> errors(2);
  NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 2,
                      [&](ps::Runtime& runtime, int) -> std::string {
                        if (runtime.rank() == 1) {
                          one_failed.get_future().wait();
                          runtime.Barrier(ps::kWorkerGroup);
                        } else {
                          const auto wait = [&](std::string& error) {
                            try {
                              runtime.Barrier(ps::kWorkerGroup);
                            } catch (const ps::Error& e) {
                              error = e.what();
                              one_failed.set_value();
                            }
                          };
                          std::jthread first(wait, std::ref(errors[0]));
                          std::jthread second(wait, std::ref(errors[1]));
                        }
                        runtime.FinishWorker();
                        return "";
                      });
  CHECK(scheduler.Run() == 0);
  workers.Join();
  server.Join();
  INFO(errors[0] << " | " << errors[1]);
  CHECK(errors[0].empty() != errors[1].empty());
  CHECK_THAT(errors[0] + errors[1],
             Catch::Contains("is in a barrier of the same group: call barriers and collectives "
                             "of one group from one thread"));
}

TEST_CASE("cluster: a server started after one died takes its rank and every node hears of it",
          "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(2, 1));  // replication is on with 2 servers
  std::atomic<int> dead_id{ps::kNoNode};
  // Each server answers a request with its rank, so the worker can tell who answered.
  const auto serve = [](ps::Runtime& runtime) {
    runtime.SetRequestHandler([&runtime](ps::Message&& msg) {
      ps::Message reply;
      reply.meta.body = std::to_string(runtime.rank());
      runtime.Reply(msg.meta, std::move(reply));
    });
    return runtime.WaitForTermination();
  };
  NodeThreads servers(scheduler.NodeConfig(ps::Role::kServer), 2,
                      [&](ps::Runtime& runtime, int) -> std::string {
                        if (runtime.rank() == 1) {
                          dead_id = runtime.id();
                          return "vanished";  // the Runtime is destroyed: its connections close
                        }
                        return serve(runtime);
                      });
  // Started once the scheduler declared the first rank-1 server dead.
  std::unique_ptr<NodeThreads> joined;
  std::atomic<int> joined_id{ps::kNoNode};
  std::thread starter([&] {
    if (!Eventually([&] { return scheduler.dead_nodes().size() == 1; }, 20s)) return;
    joined = std::make_unique<NodeThreads>(
        scheduler.NodeConfig(ps::Role::kServer), 1, [&](ps::Runtime& runtime, int) -> std::string {
          joined_id = runtime.id();
          if (runtime.rank() != 1) return "took rank " + std::to_string(runtime.rank());
          // It heard what the others heard, in the same order: rank 1 died, then it joined.
          if (!Eventually([&] { return runtime.server_event_count() == 2; })) {
            return "heard " + std::to_string(runtime.server_event_count()) + " server events";
          }
          const auto events = runtime.ServerEvents();
          if (events[0].joined || events[0].rank != 1 || !events[1].joined || events[1].rank != 1 ||
              events[1].node_id != runtime.id() || !runtime.IsDead(events[0].node_id)) {
            return "heard other server events";
          }
          return serve(runtime);
        });
  });
  std::string seen_by_worker;
  NodeThreads worker(
      scheduler.NodeConfig(ps::Role::kWorker), 1, [&](ps::Runtime& runtime, int) -> std::string {
        if (!Eventually([&] { return runtime.server_event_count() == 2; }, 30s)) {
          return "heard " + std::to_string(runtime.server_event_count()) + " server events";
        }
        const auto events = runtime.ServerEvents();
        const int new_id = runtime.ServerId(1);
        seen_by_worker = std::to_string(events[0].node_id) + (events[0].joined ? "+" : "-") +
                         std::to_string(events[1].node_id) + (events[1].joined ? "+" : "-") +
                         " rank 1 at node " + std::to_string(new_id);
        ps::Message request;
        request.meta.recipient = new_id;
        const ps::RequestResult answer =
            runtime.RequestAndWait(std::move(request), ps::RequestTracker::Clock::now() + 10s);
        if (!answer.ok()) return "the new server did not answer: " + answer.error;
        if (answer.responses[0].meta.body != "1")
          return "answered by rank " + answer.responses[0].meta.body;
        runtime.FinishWorker();
        return "";
      });
  CHECK(scheduler.Run() == 0);
  starter.join();
  CHECK(worker.Join()[0] == "");
  REQUIRE(joined);
  CHECK(joined->Join()[0] == "");
  CHECK(seen_by_worker == std::to_string(dead_id.load()) + "-" + std::to_string(joined_id.load()) +
                              "+ rank 1 at node " + std::to_string(joined_id.load()));
  auto outcomes = servers.Join();
  std::sort(outcomes.begin(), outcomes.end());
  CHECK(outcomes == std::vector<std::string>{"", "vanished"});
  CHECK(scheduler.dead_nodes().size() == 1);
}

// Declared a friend by ps::Runtime: the requests it holds for a handler not set yet.
namespace ps {
struct RuntimeTestAccess {
  static std::size_t HeldRequests(Runtime& runtime) {
    MutexLock lock(runtime.handler_mu_);
    return runtime.early_requests_.size();
  }
};
}  // namespace ps

TEST_CASE("cluster: a handler that throws fails its node, and the job hears why",
          "[cluster][fault]") {
  // Out of memory in a request handler (the receive thread) used to end the process in
  // std::terminate: the node fails instead (Runtime::FailOn), and its failure ends the job on
  // every node, naming it, where a request waited for an answer that would never come.
  // A request that came before the handler was set is held, then handed to it on the thread
  // that sets it: what it throws there fails the node the same way, not that thread.
  const bool held = GENERATE(false, true);
  INFO((held ? "the request was held for the handler" : "the handler was set first"));
  ps::Scheduler scheduler(SchedulerConfig(1, 1));
  NodeThreads server(
      scheduler.NodeConfig(ps::Role::kServer), 1, [&](ps::Runtime& runtime, int) -> std::string {
        if (held &&
            !Eventually([&] { return ps::RuntimeTestAccess::HeldRequests(runtime) == 1; }, 20s)) {
          return "no request was held";
        }
        runtime.SetRequestHandler([](ps::Message&&) { throw std::bad_alloc(); });
        return runtime.WaitForTermination();
      });
  NodeThreads worker(
      scheduler.NodeConfig(ps::Role::kWorker), 1, [](ps::Runtime& runtime, int) -> std::string {
        ps::Message request;
        request.meta.recipient = runtime.ServerId(0);
        return runtime.RequestAndWait(std::move(request), ps::RequestTracker::Clock::now() + 30s)
            .error;
      });
  CHECK(scheduler.Run() == 1);
  const std::string what = "while handling a message: out of memory (std::bad_alloc)";
  CHECK_THAT(server.Join()[0],
             Catch::StartsWith("server 0 (node ") && Catch::Contains(" failed " + what));
  CHECK_THAT(scheduler.failure(),
             Catch::StartsWith("server 0 (node ") && Catch::Contains(" failed: " + what));
  CHECK_THAT(worker.Join()[0], Catch::Contains(" failed: " + what));
}

// Declared a friend by ps::Scheduler: a notice of the test's making, sent as the scheduler's.
namespace ps {
struct SchedulerTestAccess {
  static void SendNotice(Scheduler& scheduler, Control control, int recipient,
                         const NodeInfo& about) {
    scheduler.Send(Scheduler::Notice(control, recipient, about));
  }
};
}  // namespace ps

TEST_CASE("cluster: server notices heard out of the job's order are counted in it",
          "[cluster][fault]") {
  // A reset of the scheduler's connection can lose a notice, which the scheduler sends again
  // (in order) after the ones that followed it. Here the worker first hears of the death of a
  // server it has not heard join (the join lost): it drops it. Then it hears the join before
  // the death of the server it replaces (the death lost): it counts that death first, as every
  // other node does, and ignores the notice when it comes.
  ps::Scheduler scheduler(SchedulerConfig(2, 1));  // replication is on with 2 servers
  std::atomic<int> vanishing_id{ps::kNoNode};
  std::atomic<bool> join_sent{false};
  NodeThreads servers(scheduler.NodeConfig(ps::Role::kServer), 2,
                      [&](ps::Runtime& runtime, int) -> std::string {
                        if (runtime.rank() != 1) return runtime.WaitForTermination();
                        vanishing_id = runtime.id();
                        if (!Eventually([&] { return join_sent.load(); }, 20s)) return "no join";
                        return "vanished";  // the Runtime is destroyed: its connections close
                      });
  NodeThreads worker(
      scheduler.NodeConfig(ps::Role::kWorker), 1, [&](ps::Runtime& runtime, int) -> std::string {
        if (!Eventually([&] { return vanishing_id.load() != ps::kNoNode; }, 20s)) {
          return "server 1 did not start";
        }
        const int vanished_id = vanishing_id.load();
        ps::NodeInfo joined;
        joined.id = static_cast<int>(runtime.nodes().size());
        joined.role = ps::Role::kServer;
        joined.rank = 1;
        joined.host = "127.0.0.1";
        joined.port = 9;  // nothing listens there: connecting is asynchronous, nothing is sent
        joined.host_id = "another-host";
        const auto dropped_before = runtime.dropped_messages();
        ps::SchedulerTestAccess::SendNotice(scheduler, ps::Control::kNodeDead, runtime.id(),
                                            joined);
        ps::SchedulerTestAccess::SendNotice(scheduler, ps::Control::kNodeJoined, runtime.id(),
                                            joined);
        join_sent = true;
        const auto heard = [&] {
          std::string text;
          for (const auto& event : runtime.ServerEvents()) {
            text += std::to_string(event.node_id) + (event.joined ? "+ " : "- ");
          }
          return text;
        };
        const std::string expected =
            std::to_string(vanished_id) + "- " + std::to_string(joined.id) + "+ ";
        if (!Eventually([&] { return runtime.server_event_count() == 2; })) {
          return "heard " + heard();
        }
        if (heard() != expected || !runtime.IsDead(vanished_id)) return "heard " + heard();
        if (runtime.dropped_messages() != dropped_before + 1) return "the early death not dropped";
        if (runtime.ServerId(1) != joined.id) return "rank 1 is not the joined server";
        // The scheduler's own notice of the death comes before the release of a barrier
        // entered after it was declared (one connection, in order), and changes nothing.
        if (!Eventually([&] { return scheduler.dead_nodes().size() == 1; }, 20s)) {
          return "the server was not declared dead";
        }
        runtime.Barrier(ps::kWorkerGroup, 10s);
        if (heard() != expected) return "heard " + heard() + "after the death notice";
        runtime.FinishWorker();
        return "";
      });
  CHECK(scheduler.Run() == 0);
  CHECK(worker.Join()[0] == "");
  auto outcomes = servers.Join();
  std::sort(outcomes.begin(), outcomes.end());
  CHECK(outcomes == std::vector<std::string>{"", "vanished"});
}

TEST_CASE("cluster: ranks follow host then port order whoever registers first", "[cluster]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 3));
  std::vector<std::vector<ps::NodeInfo>> tables(3);
  std::vector<int> ids(3);
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 3, [&](ps::Runtime& runtime, int i) {
    tables[i].assign(runtime.nodes().begin(), runtime.nodes().end());
    ids[i] = runtime.id();
    runtime.FinishWorker();
    return std::string();
  });
  REQUIRE(scheduler.Run() == 0);
  workers.Join();
  server.Join();
  std::vector<ps::NodeInfo> ranked;
  for (const auto& node : tables[0]) {
    if (node.role == ps::Role::kWorker) ranked.push_back(node);
  }
  std::sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
  REQUIRE(ranked.size() == 3);
  for (std::size_t r = 1; r < ranked.size(); ++r) {
    CHECK(std::tie(ranked[r - 1].host, ranked[r - 1].port) <
          std::tie(ranked[r].host, ranked[r].port));
  }
  CHECK(tables[1] == tables[0]);  // everyone got the same table
  CHECK(tables[2] == tables[0]);
}

TEST_CASE("cluster: an unreachable scheduler is a clear error within the timeout",
          "[cluster][fault]") {
  auto config = SchedulerConfig(1, 1);
  config.role = ps::Role::kWorker;
  config.root_port = ps::test::FindFreePort();  // nothing listens there
  config.register_timeout = 1s;
  const auto start = std::chrono::steady_clock::now();
  try {
    ps::Runtime::Start(config);
    FAIL("Start succeeded without a scheduler");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot reach the scheduler at 127.0.0.1:" +
                                         std::to_string(config.root_port) + " within 1 s"));
    CHECK_THAT(e.what(), Catch::Contains("DMLC_PS_ROOT_URI"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("cluster: a DMLC_NODE_HOST nobody can resolve is a clear error at the node",
          "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 1));
  auto config = scheduler.NodeConfig(ps::Role::kWorker);
  config.node_host = "no-such-host.invalid";
  config.register_timeout = 1s;  // a name may appear later (a pod's DNS record): it is retried
  try {
    ps::Runtime::Start(config);
    FAIL("Start succeeded with an unresolvable DMLC_NODE_HOST");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("cannot resolve DMLC_NODE_HOST='no-such-host.invalid' within 1") &&
                   Catch::Contains("to an IPv4 address"));
  }
  // Refused at once, with the reason (nodes speak IPv4), also with brackets or a zone, which
  // the resolver does not recognise as addresses.
  for (const char* ipv6 : {"::1", "[::1]", "fe80::1%lo"}) {
    INFO(ipv6);
    config.node_host = ipv6;
    try {
      ps::Runtime::Start(config);
      FAIL("Start succeeded with an IPv6 DMLC_NODE_HOST");
    } catch (const ps::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("DMLC_NODE_HOST='" + std::string(ipv6) +
                                           "' is an IPv6 address, and the job's nodes speak IPv4"));
    }
  }
}

TEST_CASE("cluster: a scheduler port in use is a clear error", "[cluster][fault]") {
  ps::Scheduler first(SchedulerConfig(1, 1));
  auto config = SchedulerConfig(1, 1);
  config.root_port = first.port();
  try {
    ps::Scheduler second(config);
    FAIL("a second scheduler bound the same port");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("port " + std::to_string(first.port()) +
                                         " on 127.0.0.1 is already in use"));
  }
  first.Stop("test over");
}

TEST_CASE("cluster: too many workers are refused with the count to fix", "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 1));
  std::atomic<bool> first_registered{false};
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  NodeThreads worker(scheduler.NodeConfig(ps::Role::kWorker), 1, [&](ps::Runtime& runtime, int) {
    first_registered = true;
    runtime.Barrier(ps::kWorkerGroup);
    return std::string();
  });
  REQUIRE(Eventually([&] { return first_registered.load(); }));
  try {
    ps::Runtime::Start(scheduler.NodeConfig(ps::Role::kWorker));
    FAIL("an extra worker was accepted");
  } catch (const ps::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("refused this node"));
    CHECK_THAT(e.what(), Catch::Contains("DMLC_NUM_WORKER"));
  }
  scheduler.Stop("test over");
}

TEST_CASE("cluster: a node that stops heartbeating is declared dead and nothing hangs",
          "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 3));
  std::atomic<int> victim_rank{-1};
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 3,
                      [&](ps::Runtime& runtime, int i) -> std::string {
                        if (i == 0) {
                          victim_rank = runtime.rank();
                          return "vanished";  // the Runtime is destroyed: no more heartbeats
                        }
                        try {
                          runtime.Barrier(ps::kWorkerGroup);
                        } catch (const ps::Error& e) {
                          return e.what();
                        }
                        return "barrier passed without the dead worker";
                      });
  const auto start = std::chrono::steady_clock::now();
  CHECK(scheduler.Run() == 1);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  const auto outcomes = workers.Join();
  const std::string victim = "worker " + std::to_string(victim_rank.load());
  CHECK_THAT(scheduler.failure(), Catch::Contains(victim));
  CHECK_THAT(outcomes[1], Catch::Contains("barrier failed") && Catch::Contains(victim + " (") &&
                              Catch::Contains("died"));
  CHECK_THAT(outcomes[2], Catch::Contains(victim + " ("));
  REQUIRE(scheduler.dead_nodes().size() == 1);
  CHECK(scheduler.dead_nodes()[0].rank == victim_rank.load());
  CHECK_THAT(server.Join()[0], Catch::Contains("the job failed"));
}

TEST_CASE(
    "cluster: garbage and truncated and absurd messages are dropped while the node keeps serving",
    "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 2));
  std::atomic<ps::Runtime*> target{nullptr};
  std::atomic<bool> attacked{false};
  std::atomic<int> target_port{0};
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 2,
                      [&](ps::Runtime& runtime, int i) -> std::string {
                        if (i == 0) {
                          target_port = runtime.nodes()[runtime.id()].port;
                          target = &runtime;
                          // Stay alive through the attack, then prove the node still works.
                          if (!Eventually([&] { return attacked.load(); }, 30s)) return "no attack";
                        }
                        for (int b = 0; b < 5; ++b) runtime.Barrier(ps::kWorkerGroup);
                        runtime.FinishWorker();
                        return "";
                      });
  REQUIRE(Eventually([&] { return target.load() != nullptr; }));
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(target_port.load());
  {
    zmq::context_t context;
    zmq::socket_t attacker = OutsiderSocket(context);
    attacker.connect(endpoint);
    // 1. plain garbage
    attacker.send(zmq::str_buffer("\xde\xad\xbe\xef not a header"));
    // 2. a truncated header
    ps::Meta meta;
    meta.sender = 1;
    meta.recipient = 2;
    meta.body = std::string(100, 'x');
    const std::string full = ps::wire::EncodeHeader(meta, {});
    attacker.send(zmq::buffer(full.substr(0, full.size() / 2)));
    // 3. a header claiming a terabyte-sized frame, followed by 8 bytes
    std::vector<ps::Blob> fake = {ps::Blob::Copy("12345678", 8, ps::DType::kUInt8)};
    std::string absurd = ps::wire::EncodeHeader(meta, fake);
    ps::pb::Header header;
    REQUIRE(header.ParseFromString(absurd));
    header.mutable_data(0)->set_count(std::uint64_t{1} << 39);
    absurd = header.SerializeAsString();
    attacker.send(zmq::buffer(absurd), zmq::send_flags::sndmore);
    attacker.send(zmq::str_buffer("12345678"));
    // 4. a header describing two frames followed by none
    fake.push_back(fake[0]);
    attacker.send(zmq::buffer(ps::wire::EncodeHeader(meta, fake)));
    // 5. a well-formed message from a node id that does not exist
    meta.sender = 999;
    attacker.send(zmq::buffer(ps::wire::EncodeHeader(meta, {})));
  }
  // 6. raw bytes that are not even ZeroMQ's handshake
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(target_port.load()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    const std::string junk(4096, '\x7f');
    CHECK(write(fd, junk.data(), junk.size()) > 0);
    close(fd);
  }
  CHECK(Eventually([&] { return target.load()->dropped_messages() >= 5; }));
  attacked = true;
  CHECK(scheduler.Run() == 0);
  for (const auto& outcome : workers.Join()) CHECK(outcome == "");
  CHECK(server.Join()[0] == "");
}

TEST_CASE("cluster: bogus registrations are refused or dropped and the job still runs",
          "[cluster][fault]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 1));
  {
    zmq::context_t context;
    // Authenticated as a node of key "bogus" would be, so its registrations are judged.
    zmq::socket_t attacker = OutsiderSocket(context, ps::ConnectionToken("bogus", ""));
    attacker.connect("tcp://127.0.0.1:" + std::to_string(scheduler.port()));
    const auto send_register = [&](std::vector<ps::NodeInfo> nodes) {
      ps::Meta meta;
      meta.control = ps::Control::kRegister;
      meta.request = true;
      meta.recipient = 0;
      meta.nodes = std::move(nodes);
      attacker.send(zmq::buffer(ps::wire::EncodeHeader(meta, {})));
    };
    const auto node = [](ps::Role role, std::string host, int port) {
      return ps::NodeInfo{ps::kNoNode, role, std::move(host), port, -1, "", "", "bogus"};
    };
    send_register({});  // no entry
    send_register({node(ps::Role::kWorker, "127.0.0.1", 1),
                   node(ps::Role::kWorker, "127.0.0.1", 2)});             // two entries
    send_register({node(ps::Role::kScheduler, "127.0.0.1", 1)});          // a scheduler
    send_register({node(ps::Role::kWorker, "", 5)});                      // no host
    send_register({node(ps::Role::kWorker, "127.0.0.1", 0)});             // no port
    send_register({node(ps::Role::kServer, "no-such-host.invalid", 5)});  // unresolvable
    send_register({node(ps::Role::kWorker, "[::1", 5)});                  // unresolvable too
    send_register({node(ps::Role::kScheduler, "a/b", 5)});  // refused, and ZeroMQ rejects a/b
  }
  // Every bogus registration handled before the real nodes come: 4 dropped, 4 refused.
  REQUIRE(Eventually(
      [&] { return scheduler.dropped_messages() == 4 && scheduler.refused_registrations() == 4; }));
  // The real nodes register after the bogus ones, and the job runs to its end.
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  NodeThreads workers(scheduler.NodeConfig(ps::Role::kWorker), 1,
                      [](ps::Runtime& runtime, int) -> std::string {
                        runtime.Barrier(ps::kWorkerGroup);
                        runtime.FinishWorker();
                        return "";
                      });
  CHECK(scheduler.Run() == 0);
  CHECK(scheduler.failure().empty());
  CHECK(workers.Join()[0] == "");
  CHECK(server.Join()[0] == "");
}

TEST_CASE(
    "cluster: the advertised address follows DMLC_NODE_HOST then DMLC_INTERFACE then the route",
    "[cluster]") {
  auto config = SchedulerConfig(1, 3);
  config.root_uri = "localhost";  // a host name, resolved by DNS
  ps::Scheduler scheduler(config);
  std::vector<std::string> hosts(3);
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  std::vector<ps::ClusterConfig> worker_configs(3, scheduler.NodeConfig(ps::Role::kWorker));
  worker_configs[0].node_host = "127.0.0.2";  // explicit
  worker_configs[1].interface = "lo";         // from the interface
  // worker 2: the local end of the route to the scheduler
  std::vector<std::thread> threads;
  std::vector<std::string> errors(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto runtime = ps::Runtime::Start(worker_configs[static_cast<std::size_t>(i)]);
        hosts[static_cast<std::size_t>(i)] =
            runtime->nodes()[static_cast<std::size_t>(runtime->id())].host;
        runtime->FinishWorker();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(scheduler.Run() == 0);
  server.Join();
  CHECK(errors == std::vector<std::string>(3));
  CHECK(hosts[0] == "127.0.0.2");
  CHECK(hosts[1] == "127.0.0.1");
  CHECK(hosts[2] == "127.0.0.1");
}

TEST_CASE("cluster: an unknown interface or host name is a clear error", "[cluster][fault]") {
  auto config = SchedulerConfig(1, 1);
  config.role = ps::Role::kWorker;
  config.root_port = 9;
  config.interface = "nosuch0";
  CHECK_THROWS_WITH(
      ps::Runtime::Start(config),
      Catch::Contains("DMLC_INTERFACE='nosuch0' is not an interface") && Catch::Contains("lo"));
  config.interface.clear();
  config.root_uri = "no-such-host.invalid";
  config.register_timeout = 1s;
  CHECK_THROWS_WITH(ps::Runtime::Start(config),
                    Catch::Contains("cannot resolve DMLC_PS_ROOT_URI='no-such-host.invalid'"));
}

TEST_CASE("cluster: same-host peers talk over ipc and PS_USE_IPC=0 keeps them on TCP",
          "[cluster]") {
  for (const bool use_ipc : {true, false}) {
    INFO("use_ipc=" << use_ipc);
    auto config = SchedulerConfig(1, 1);
    config.use_ipc = use_ipc;
    ps::Scheduler scheduler(config);
    std::string endpoint;
    NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, [](ps::Runtime& runtime, int) {
      runtime.Barrier(ps::kWorkerGroup | ps::kServerGroup);
      return runtime.WaitForTermination();
    });
    NodeThreads worker(scheduler.NodeConfig(ps::Role::kWorker), 1, [&](ps::Runtime& runtime, int) {
      endpoint = runtime.EndpointOf(runtime.ServerId(0));
      runtime.Barrier(ps::kWorkerGroup | ps::kServerGroup);
      runtime.FinishWorker();
      return std::string();
    });
    // The server joins the barrier too, proving messages flow both ways on that path.
    CHECK(scheduler.Run() == 0);
    CHECK(worker.Join()[0] == "");
    server.Join();
    if (use_ipc) {
      CHECK_THAT(endpoint, Catch::StartsWith("ipc://@ps-"));
    } else {
      CHECK_THAT(endpoint, Catch::StartsWith("tcp://127.0.0.1:"));
    }
  }
}

TEST_CASE("cluster: PS_TCP_RCVBUF sets the receive buffer of every accepted connection",
          "[cluster]") {
  // 20000 is no kernel default: Linux doubles a requested SO_RCVBUF for its bookkeeping.
  for (const int requested : {0, 20000}) {
    INFO("tcp_receive_buffer=" << requested);
    auto config = SchedulerConfig(1, 1);
    config.use_ipc = false;  // every connection on TCP
    config.tcp_receive_buffer = requested;
    ps::Scheduler scheduler(config);
    std::vector<int> buffers;
    NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, [](ps::Runtime& runtime, int) {
      runtime.Barrier(ps::kWorkerGroup | ps::kServerGroup);
      return runtime.WaitForTermination();
    });
    NodeThreads worker(scheduler.NodeConfig(ps::Role::kWorker), 1, [&](ps::Runtime& runtime, int) {
      // Past this barrier every node has accepted the connections of the others.
      runtime.Barrier(ps::kWorkerGroup | ps::kServerGroup);
      buffers = AcceptedReceiveBuffers();
      runtime.FinishWorker();
      return std::string();
    });
    CHECK(scheduler.Run() == 0);
    CHECK(worker.Join()[0] == "");
    server.Join();
    // At least the scheduler's two (the server and the worker registered) and one each of the
    // server and the worker (the scheduler's node table and barrier release reached them).
    CHECK(buffers.size() >= 4);
    for (const int buffer : buffers) {
      if (requested > 0) {
        CHECK(buffer == 2 * requested);
      } else {
        CHECK(buffer != 2 * 20000);
      }
    }
  }
}

TEST_CASE("cluster: PS_RANK requests order ranks before host and port", "[cluster]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 3));
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  std::vector<int> ranks(3, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto config = scheduler.NodeConfig(ps::Role::kWorker);
      config.rank_hint = 2 - i;  // reversed: thread 0 asks for rank 2
      auto runtime = ps::Runtime::Start(config);
      ranks[static_cast<std::size_t>(i)] = runtime->rank();
      runtime->FinishWorker();
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(scheduler.Run() == 0);
  server.Join();
  CHECK(ranks == std::vector<int>{2, 1, 0});
}

TEST_CASE("cluster: heartbeat settings or key layouts that differ are refused by name",
          "[cluster][fault]") {
  // A refused job still waits for its other nodes (to tell them why) until the registration
  // deadline: keep that short here.
  ps::ClusterConfig job = SchedulerConfig(1, 2);
  job.register_timeout = 3s;
  ps::Scheduler scheduler(job);
  ps::ClusterConfig odd = scheduler.NodeConfig(ps::Role::kWorker);
  odd.heartbeat_timeout = 5000ms;
  CHECK_THROWS_WITH(ps::Runtime::Start(odd),
                    Catch::Contains("was started with PS_HEARTBEAT_TIMEOUT=5, the scheduler "
                                    "with PS_HEARTBEAT_TIMEOUT=2.5"));
  CHECK(scheduler.Run() == 1);
  CHECK_THAT(scheduler.failure(), Catch::Contains("PS_HEARTBEAT_TIMEOUT=5"));

  // Replication too: a node without it would answer pushes its replica never saw.
  ps::Scheduler replicated_job(job);
  ps::ClusterConfig unreplicated = replicated_job.NodeConfig(ps::Role::kWorker);
  unreplicated.replication = false;
  CHECK_THROWS_WITH(ps::Runtime::Start(unreplicated),
                    Catch::Contains("was started with PS_REPLICATION=0, the scheduler "
                                    "with PS_REPLICATION=1"));
  CHECK(replicated_job.Run() == 1);

  // Workers must slice keys alike: each worker's layout is compared with the first one's,
  // whichever registers first.
  ps::Scheduler second_job(job);
  ps::ClusterConfig sliced = second_job.NodeConfig(ps::Role::kWorker);
  sliced.big_array_bound = 1000;
  const auto [sliced_status, sliced_outcomes] =
      RegisterPair(second_job, second_job.NodeConfig(ps::Role::kWorker), sliced);
  CHECK(sliced_status == 1);
  for (const std::string& outcome : sliced_outcomes) {
    CHECK_THAT(outcome, Catch::Matches(".*BOUND=1000[,:] .*") &&
                            Catch::Contains("MXNET_KVSTORE_BIGARRAY_BOUND=1000000") &&
                            Catch::Contains("an earlier node"));
  }

  // A server sizes the largest frame it accepts from the same layout: it is compared too.
  ps::ClusterConfig one_worker = SchedulerConfig(1, 1);
  one_worker.register_timeout = 3s;
  ps::Scheduler third_job(one_worker);
  ps::ClusterConfig small_chunks = third_job.NodeConfig(ps::Role::kServer);
  small_chunks.chunk_bytes = 8192;
  const auto [chunk_status, chunk_outcomes] =
      RegisterPair(third_job, small_chunks, third_job.NodeConfig(ps::Role::kWorker));
  CHECK(chunk_status == 1);
  for (const std::string& outcome : chunk_outcomes) {
    CHECK_THAT(outcome, Catch::Contains("PS_CHUNK_BYTES=8192") &&
                            Catch::Contains("PS_CHUNK_BYTES=" + std::to_string(4 << 20)) &&
                            Catch::Contains("servers and workers must slice keys alike"));
  }

  // Server weights set which server holds which slice: compared too (in a job of two
  // servers, as a node's own weights must name one per server).
  ps::ClusterConfig two_servers = SchedulerConfig(2, 2);
  two_servers.register_timeout = 3s;
  ps::Scheduler fourth_job(two_servers);
  ps::ClusterConfig weighted = fourth_job.NodeConfig(ps::Role::kWorker);
  weighted.server_weights = {1000, 125};
  const auto [weights_status, weights_outcomes] =
      RegisterPair(fourth_job, fourth_job.NodeConfig(ps::Role::kWorker), weighted);
  CHECK(weights_status == 1);
  for (const std::string& outcome : weights_outcomes) {
    // In the variable's terms, the largest scaled to 1 (not the internal thousandths).
    CHECK_THAT(outcome, Catch::Contains("PS_SERVER_WEIGHTS=1,0.125") &&
                            Catch::Contains("PS_SERVER_WEIGHTS=equal"));
  }

  // The type of KVStore the workers created: a dist_sync worker would wait for rounds that a
  // dist_async one never joins. Compared among the workers that created one.
  ps::Scheduler fifth_job(job);
  ps::ClusterConfig sync_worker = fifth_job.NodeConfig(ps::Role::kWorker);
  sync_worker.kvstore_type = "dist_sync";
  ps::ClusterConfig async_worker = sync_worker;
  async_worker.kvstore_type = "dist_async";
  const auto [type_status, type_outcomes] = RegisterPair(fifth_job, sync_worker, async_worker);
  CHECK(type_status == 1);
  for (const std::string& outcome : type_outcomes) {
    CHECK_THAT(outcome,
               Catch::Matches(".*created a dist_(sync|async) KVStore, an earlier worker \\(worker "
                              "at .*\\) a dist_(sync|async): every worker of a job must create "
                              "the same type.*"));
  }
}

TEST_CASE("cluster: workers of one KVStore type, or without a KVStore, register together",
          "[cluster]") {
  ps::Scheduler scheduler(SchedulerConfig(1, 3));
  NodeThreads server(scheduler.NodeConfig(ps::Role::kServer), 1, ServeUntilTerminated);
  std::vector<std::thread> workers;
  std::vector<std::string> outcomes(3);
  for (const std::string type : {"dist_async", "", "dist_async"}) {
    ps::ClusterConfig config = scheduler.NodeConfig(ps::Role::kWorker);
    config.kvstore_type = type;
    workers.emplace_back([config, &outcome = outcomes[workers.size()]] {
      try {
        ps::Runtime::Start(config)->FinishWorker();
        outcome = "finished";
      } catch (const ps::Error& e) {
        outcome = e.what();
      }
    });
  }
  for (auto& worker : workers) worker.join();
  CHECK(scheduler.Run() == 0);
  server.Join();
  CHECK(outcomes == std::vector<std::string>(3, "finished"));
}

// A job of one server and one worker, attacked while it runs: the worker waits until the
// attack is over, then runs barriers and finishes; the job must end cleanly.
class JobUnderAttack {
 public:
  explicit JobUnderAttack(ps::Scheduler& scheduler)
      : scheduler_(scheduler),
        server_(scheduler.NodeConfig(ps::Role::kServer), 1,
                [this](ps::Runtime& runtime, int) {
                  server_runtime_ = &runtime;
                  std::string outcome = runtime.WaitForTermination();
                  // The test thread reads this runtime until it ends the attack: keep it until
                  // then (a happens-before edge the sockets that end the job do not give).
                  Eventually([&] { return attack_over_.load(); }, 30s);
                  return outcome;
                }),
        worker_(scheduler.NodeConfig(ps::Role::kWorker), 1,
                [this](ps::Runtime& runtime, int) -> std::string {
                  if (!Eventually([&] { return attack_over_.load(); }, 30s)) return "no attack";
                  for (int b = 0; b < 3; ++b) runtime.Barrier(ps::kWorkerGroup);
                  runtime.FinishWorker();
                  return "";
                }) {}

  // The server's runtime, once it runs (the attack's target).
  ps::Runtime& Target() {
    REQUIRE(Eventually([&] { return server_runtime_.load() != nullptr; }));
    return *server_runtime_.load();
  }
  // Sends `meta` to the target from an outsider's connection (key, secret).
  // Sends `meta` to the target from a process outside the job, and keeps that connection
  // trying (ZeroMQ reconnects every 100 ms) until `seen` holds, for 10 s at most: a refused
  // handshake may be noticed on the outsider's side first, so one attempt proves nothing.
  bool SendToTarget(const ps::Meta& meta, const std::string& key, const std::string& secret,
                    const std::function<bool()>& seen) {
    ps::Runtime& target = Target();
    zmq::context_t context;
    zmq::socket_t outsider = OutsiderSocket(context, key, secret);
    outsider.connect("tcp://127.0.0.1:" + std::to_string(target.nodes()[target.id()].port));
    outsider.send(zmq::buffer(ps::wire::EncodeHeader(meta, {})), zmq::send_flags::dontwait);
    return Eventually(seen);
  }
  void CheckEndsCleanly() {
    attack_over_ = true;
    CHECK(scheduler_.Run() == 0);
    CHECK(worker_.Join()[0] == "");
    CHECK(server_.Join()[0] == "");
  }

 private:
  ps::Scheduler& scheduler_;
  std::atomic<ps::Runtime*> server_runtime_{nullptr};
  std::atomic<bool> attack_over_{false};
  NodeThreads server_;  // after the atomics its threads use
  NodeThreads worker_;
};

// "terminate" from the scheduler, to the target: it would end the server in mid-job.
ps::Meta ForgedTerminate(const ps::Runtime& target) {
  ps::Meta meta;
  meta.sender = ps::kSchedulerId;
  meta.recipient = target.id();
  meta.control = ps::Control::kTerminate;
  return meta;
}

TEST_CASE("cluster: a message forged as the scheduler's is dropped, secret or not",
          "[cluster][fault][security]") {
  for (const std::string secret : {"", "the-secret-of-this-job"}) {
    INFO("PS_JOB_SECRET='" << secret << "'");
    ps::ClusterConfig config = SchedulerConfig(1, 1);
    config.job_secret = secret;
    ps::Scheduler scheduler(config);
    JobUnderAttack job(scheduler);
    ps::Runtime& target = job.Target();
    // Even with the job's secret, a connection that did not authenticate as the scheduler
    // cannot speak for it: not with a name of its own, nor with the scheduler's key (a node
    // of the job knows it from the table), nor with the token the scheduler gave another
    // connection (a process it connected back to, to refuse it, saw that one).
    const std::string scheduler_key = target.nodes()[ps::kSchedulerId].connection_key;
    const std::string password = secret.empty() ? ps::kNoJobSecret : secret;
    std::size_t dropped = target.dropped_messages();
    for (const std::string& user : {std::string("forger"), scheduler_key,
                                    ps::ConnectionToken(scheduler_key, ps::NewConnectionKey())}) {
      INFO("user name " << user);
      CHECK(job.SendToTarget(ForgedTerminate(target), user, password,
                             [&] { return target.dropped_messages() > dropped; }));
      dropped = target.dropped_messages();
    }
    job.CheckEndsCleanly();
  }
}

TEST_CASE("cluster: with PS_JOB_SECRET a node with a wrong or no secret cannot join, read or write",
          "[cluster][fault][security]") {
  ps::ClusterConfig config = SchedulerConfig(1, 1);
  config.job_secret = "the-secret-of-this-job";
  ps::Scheduler scheduler(config);
  for (const std::string wrong : {"", "a-wrong-secret"}) {
    INFO("intruder's secret: '" << wrong << "'");
    ps::ClusterConfig intruder = scheduler.NodeConfig(ps::Role::kWorker);
    intruder.job_secret = wrong;
    intruder.register_timeout = 2s;
    CHECK_THROWS_WITH(ps::Runtime::Start(intruder),
                      Catch::Contains("refused this node's connection: its PS_JOB_SECRET is not "
                                      "the job's"));
  }
  JobUnderAttack job(scheduler);
  ps::Runtime& target = job.Target();
  // A process without the secret cannot complete a connection to a node: its message does
  // not even reach the node to be dropped there.
  const auto dropped_before = target.dropped_messages();
  CHECK(job.SendToTarget(ForgedTerminate(target), "intruder", "a-wrong-secret",
                         [&] { return target.refused_connections() >= 1; }));
  CHECK(target.dropped_messages() == dropped_before);
  job.CheckEndsCleanly();
}

// A job of 1 server and 1 worker with a secret and PS_ENCRYPT.
ps::ClusterConfig EncryptedJob() {
  ps::ClusterConfig config = SchedulerConfig(1, 1);
  config.job_secret = "the-secret-of-this-job";
  config.encrypt = true;
  return config;
}

TEST_CASE("cluster: with PS_ENCRYPT every node speaks CURVE and a PLAIN node cannot join",
          "[cluster][fault][security]") {
  const ps::ClusterConfig config = EncryptedJob();
  ps::Scheduler scheduler(config);
  ps::ClusterConfig plain = scheduler.NodeConfig(ps::Role::kWorker);
  plain.encrypt = false;  // the right secret, but in clear
  plain.register_timeout = 2s;
  CHECK_THROWS_WITH(ps::Runtime::Start(plain), Catch::Contains("PS_ENCRYPT"));
  // The job runs: every message is accepted on its sender's connection, whose key is now the
  // sender's CURVE public key, and a forged one is still dropped.
  JobUnderAttack job(scheduler);
  ps::Runtime& target = job.Target();
  CHECK(target.nodes()[target.id()].connection_key.size() == 40);  // Z85 of 32 bytes
  // A PLAIN connection to a CURVE node, with the right secret: refused, so its message never
  // arrives. (The refusing side counts it when it reads the greeting before the peer hangs
  // up, which a busy machine may not do: the next case checks the count.)
  const auto dropped_before = target.dropped_messages();
  job.SendToTarget(ForgedTerminate(target), "plain-node", config.job_secret,
                   [&] { return target.refused_connections() >= 1; });
  CHECK(target.dropped_messages() == dropped_before);
  CHECK_FALSE(target.terminated());
  job.CheckEndsCleanly();
}

TEST_CASE("cluster: with PS_ENCRYPT a node counts a peer that greets it with PLAIN",
          "[cluster][fault][security]") {
  // A ZeroMQ peer notices the mismatch too, and may close before the node has read its
  // greeting; this peer sends a ZMTP 3.0 greeting naming PLAIN and waits, so the node must.
  ps::Scheduler scheduler(EncryptedJob());
  JobUnderAttack job(scheduler);
  ps::Runtime& target = job.Target();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(target.nodes()[target.id()].port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0);
  // Signature (0xFF, 8 bytes, 0x7F), version 3.0, mechanism (20 bytes), as-server, filler.
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;
  greeting.replace(12, 5, "PLAIN");
  REQUIRE(write(fd, greeting.data(), greeting.size()) == static_cast<ssize_t>(greeting.size()));
  CHECK(Eventually([&] { return target.refused_connections() >= 1; }));
  close(fd);
  job.CheckEndsCleanly();
}
