#pragma once
// JobAuthenticator: ZeroMQ's authentication handler (ZAP, RFC 27) for one transport's context,
// which decides which connections a node accepts and tags their messages with who sent them.
//
// Every socket of a node speaks ZeroMQ's PLAIN mechanism. A send socket gives:
//   - as user name, a token for that connection alone: ConnectionToken of its node's
//     connection key (random, made when the node starts, handed to the job's nodes in the node
//     table, NodeInfo::connection_key) and of the receiver's key;
//   - as password, the job secret (PS_JOB_SECRET), or kNoJobSecret when the job has none.
// The handler admits a connection whose password is the job's and stamps every message that
// arrives on it with the user name (ZeroMQ's "User-Id" property). The receiver compares that
// with the token the node the message claims to come from gives it (Message::connection_key),
// so a message is accepted only from the connection of the node it names, secret or not; a
// process without the secret cannot even complete the handshake, so it can neither join, nor
// read what a node sends it, nor write to one. A token is good on one connection only: the
// one the scheduler gives a process it connects back to (a registrant it may refuse) opens no
// other node's door, and neither does one read from a capture of a connection.
//
// The keys themselves are known to the job's nodes (the table): a node of the job could pose
// as another. The check keeps out processes that are not of the job.
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
#include <string_view>
#include <thread>

#include <zmq.hpp>

#include "ps/src/wake_fd.h"

namespace ps {

// The password of a job that has no secret: PLAIN cannot carry an empty one.
inline constexpr const char* kNoJobSecret = "ps-job-without-secret";

// 32 random hex digits, for a node's connection key.
std::string NewConnectionKey();

// The PLAIN user name the node whose connection key is `from_key` gives on its connection to
// the node whose key is `to_key` ("" for the scheduler: a registrant knows its key only from
// the table): 32 hex digits of a hash keyed with `from_key`, so a token reveals neither key
// nor any other connection's token.
std::string ConnectionToken(std::string_view from_key, std::string_view to_key);

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
