#include "ps/src/job_authenticator.h"

#include <sodium.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "ps/error.h"
#include "ps/src/curve_keys.h"
#include "ps/src/glog_or_stderr.h"
#include "ps/src/log_text.h"
#include "ps/src/start_thread.h"

namespace ps {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

// Compares in time independent of where the texts differ: a peer must not learn the secret
// a byte at a time from how fast it is refused.
bool SameText(const std::string& a, const std::string& b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return difference == 0;
}

// Two lowercase hex digits per byte.
std::string Hex(std::span<const unsigned char> bytes) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  for (const unsigned char byte : bytes) {
    text += kHex[byte >> 4];
    text += kHex[byte & 0xF];
  }
  return text;
}

}  // namespace

std::string NewConnectionKey() {
  std::random_device device;  // the kernel's random source
  std::array<unsigned char, 16> bytes{};
  for (unsigned char& byte : bytes) byte = static_cast<unsigned char>(device());
  return Hex(bytes);
}

std::string ConnectionToken(std::string_view from_key, std::string_view to_key) {
  // BLAKE2b takes a key of 16 to 64 bytes; a node's key is 32 hex digits (NewConnectionKey).
  // One that is not (a registrant's own, refused later) yields a token no node expects.
  static constexpr std::string_view kPurpose = "ps: a connection to the node of key ";
  std::array<unsigned char, 16> hash{};
  std::string message(kPurpose);
  message += to_key;
  const bool keyed = from_key.size() >= crypto_generichash_KEYBYTES_MIN &&
                     from_key.size() <= crypto_generichash_KEYBYTES_MAX;
  crypto_generichash(hash.data(), hash.size(),
                     reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                     keyed ? reinterpret_cast<const unsigned char*>(from_key.data()) : nullptr,
                     keyed ? from_key.size() : 0);
  return keyed ? Hex(hash) : "unkeyed-" + Hex(hash);
}

JobAuthenticator::JobAuthenticator(zmq::context_t& context, Mechanism mechanism,
                                   const std::string& secret, int verbose)
    : mechanism_(mechanism),
      password_(secret.empty() ? kNoJobSecret : secret),
      verbose_(verbose),
      wake_("the connection authenticator") {
  try {
    socket_ = zmq::socket_t(context, zmq::socket_type::rep);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    throw Error(std::string("cannot start the connection authenticator: ") + e.what());
  }
  thread_ = internal::StartThread("the connection authenticator",
                                  [this](std::stop_token stop) { Run(stop); });
}

JobAuthenticator::~JobAuthenticator() {
  thread_.request_stop();
  wake_.Wake();
  if (thread_.joinable()) thread_.join();
}

void JobAuthenticator::Run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::array<zmq_pollitem_t, 2> items{zmq_pollitem_t{nullptr, wake_.fd(), ZMQ_POLLIN, 0},
                                        zmq_pollitem_t{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items.data(), static_cast<int>(items.size()), -1) < 0) {
      if (zmq_errno() == ETERM) return;  // the context is ending
      if (zmq_errno() == EINTR) continue;
      PS_LOG(WARNING) << "the connection authenticator's poll failed: "
                      << zmq_strerror(zmq_errno());
      return;
    }
    if ((items[1].revents & ZMQ_POLLIN) != 0) {
      try {
        Answer();
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        PS_LOG(WARNING) << "the connection authenticator failed: " << e.what();
      }
    }
  }
}

void JobAuthenticator::Answer() {
  // Request: version, request id, domain, address, routing id, mechanism, credentials...
  std::vector<zmq::message_t> request;
  do {
    zmq::message_t frame;
    if (!socket_.recv(frame)) return;
    request.push_back(std::move(frame));
  } while (socket_.get(zmq::sockopt::rcvmore));
  std::string status = "400";
  std::string status_text = "wrong or missing PS_JOB_SECRET";
  std::string user;
  if (request.size() >= 6) {
    const std::string mechanism = request[5].to_string();
    constexpr std::size_t kCurveKeyBytes = 32;
    if (mechanism_ == Mechanism::kPlain && mechanism == "PLAIN" && request.size() == 8) {
      user = request[6].to_string();
      if (SameText(request[7].to_string(), password_)) {
        status = "200";
        status_text = "OK";
      }
    } else if (mechanism_ == Mechanism::kCurve && mechanism == "CURVE" && request.size() == 7 &&
               request[6].size() == kCurveKeyBytes) {
      // The handshake succeeded, so the client knew the job's server key.
      user = Z85(static_cast<const unsigned char*>(request[6].data()), kCurveKeyBytes);
      status = "200";
      status_text = "OK";
    } else {
      status_text = "mechanism " + mechanism + " is not this job's (" +
                    (mechanism_ == Mechanism::kCurve ? "CURVE: PS_ENCRYPT=1" : "PLAIN") + ")";
    }
  }
  if (status != "200") {
    user.clear();
    if (const auto count = ++refused_; LogOccurrence(count)) {
      const std::string address = request.size() >= 4 ? request[3].to_string() : "?";
      PS_LOG(WARNING) << "refused a connection from "
                      << (address.empty() ? "a local peer" : address) << " (#" << count
                      << "): " << status_text
                      << "; every node of a job must be given its PS_JOB_SECRET";
    }
  } else if (verbose_ >= 2) {
    // Not the user name: a token written in a log would open the connection it is for.
    PS_LOG(INFO) << "admitted a connection";
  }
  // Reply: version, request id, status code, status text, user id, metadata.
  const std::string version = request.empty() ? "1.0" : request[0].to_string();
  const std::string request_id = request.size() >= 2 ? request[1].to_string() : "";
  socket_.send(zmq::buffer(version), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(status), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(status_text), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
  socket_.send(zmq::message_t(), zmq::send_flags::none);
}

}  // namespace ps
