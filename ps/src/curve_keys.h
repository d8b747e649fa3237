#pragma once
// CURVE keys of a job with PS_ENCRYPT=1 (ZeroMQ's CurveZMQ: every connection encrypted and
// authenticated).
//
// Every node listens with the same server key pair, derived from the job secret: a peer can
// complete a CURVE handshake only if it knows the server's public key, which only the secret
// yields, so the secret keeps intruders out as with PLAIN, and nothing crosses the network
// in clear. Each node connects with a key pair of its own, made at random when it starts;
// its public key (Z85 text) is the node's connection key (NodeInfo::connection_key), which
// ZeroMQ reports as the "User-Id" of every message on its connections.
#include <cstddef>
#include <string>

namespace ps {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// The job's server key pair: a keyed BLAKE2b hash of the secret (libsodium) as the secret key.
// Throws ps::Error when this libzmq has no CURVE.
CurveKeyPair JobServerKeys(const std::string& job_secret);
// A new random key pair for one node's connections.
CurveKeyPair NewNodeKeys();
// `size` bytes (a multiple of 4) as Z85 text.
std::string Z85(const unsigned char* bytes, std::size_t size);

}  // namespace ps
