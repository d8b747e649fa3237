#pragma once
// JobAuthenticator: ZeroMQ's authentication handler (ZAP, RFC 27) for one transport's context,
// which decides which connections a node accepts and tags their messages with who sent them.
//
// Every socket of a node speaks ZeroMQ's PLAIN mechanism. A send socket gives:
//   - as user name, its node's connection key: random, made when the node starts, and handed to
//     the other nodes in the node table (NodeInfo::connection_key);
//   - as password, the job secret (PS_JOB_SECRET), or kNoJobSecret when the job has none.
// The handler admits a connection whose password is the job's and stamps every message that
// arrives on it with the user name (ZeroMQ's "User-Id" property). The receiver compares that
// with the key of the node the message claims to come from (Message::connection_key), so a
// message is accepted only from the connection of the node it names, secret or not; a process
// without the secret cannot even complete the handshake, so it can neither join, nor read
// what a node sends it, nor write to one.
//
// PLAIN sends the password in clear text: it keeps out whoever can reach a port, not whoever
// can read the network. With PS_ENCRYPT=1 every socket speaks CURVE instead (curve_keys.h):
// the same checks, and every byte encrypted.
//
// Threads: one thread of its own serves ZeroMQ's requests (ZeroMQ's I/O threads wait for each
// answer, so it waits for nothing else). Destruction stops and joins it; it must happen before
// the ZeroMQ context ends.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "ps/src/wake_fd.h"

namespace ps {

// The password of a job that has no secret: PLAIN cannot carry an empty one.
inline constexpr const char* kNoJobSecret = "ps-job-without-secret";

// 32 random hex digits, for a node's connection key.
std::string NewConnectionKey();

class JobAuthenticator {
 public:
  // The job's mechanism. kCurve (PS_ENCRYPT=1): a client that completed the handshake knew
  // the job's server key, which only the secret yields; its user name is its public key.
  enum class Mechanism { kPlain, kCurve };
  // Binds the context's ZAP endpoint and starts serving it. `secret` "" means the job has
  // none (kNoJobSecret). Throws ps::Error when ZeroMQ cannot set it up.
  JobAuthenticator(zmq::context_t& context, Mechanism mechanism, const std::string& secret,
                   int verbose);
  ~JobAuthenticator();
  JobAuthenticator(const JobAuthenticator&) = delete;
  JobAuthenticator& operator=(const JobAuthenticator&) = delete;

  // Connections turned away for a wrong or missing secret.
  std::uint64_t refused() const { return refused_.load(); }

 private:
  void Run(std::stop_token stop);
  // Answers one ZAP request read from socket_.
  void Answer();

  const Mechanism mechanism_;
  const std::string password_;
  const int verbose_;
  zmq::socket_t socket_;  // the ZAP REP socket: the handler thread's alone once it runs
  WakeFd wake_;           // wakes the thread to stop
  std::atomic<std::uint64_t> refused_{0};
  std::jthread thread_;  // last: started when the members above exist
};

}  // namespace ps
