#include "ps/src/curve_keys.h"

#include <sodium.h>
#include <zmq.h>

#include <array>

#include "ps/error.h"

namespace ps {
namespace {

constexpr std::size_t kKeyBytes = 32;
constexpr std::size_t kZ85KeyChars = 40;

void RequireCurve() {
  if (zmq_has("curve") == 0) {
    throw Error(
        "PS_ENCRYPT=1 needs a libzmq built with CURVE (libsodium), and this one has none: "
        "install Debian's libzmq5, or set PS_ENCRYPT=0");
  }
}

}  // namespace

std::string Z85(const unsigned char* bytes, std::size_t size) {
  std::string text(size * 5 / 4 + 1, '\0');
  zmq_z85_encode(text.data(), bytes, size);
  text.pop_back();  // the terminating NUL
  return text;
}

CurveKeyPair JobServerKeys(const std::string& job_secret) {
  RequireCurve();
  // The hash's key names the purpose, so the secret yields other keys for other uses.
  static constexpr unsigned char kPurpose[] = "ps: the job's CURVE server key";
  std::array<unsigned char, kKeyBytes> secret{};
  crypto_generichash(secret.data(), secret.size(),
                     reinterpret_cast<const unsigned char*>(job_secret.data()), job_secret.size(),
                     kPurpose, sizeof(kPurpose) - 1);
  CurveKeyPair keys;
  keys.secret_key = Z85(secret.data(), secret.size());
  std::array<char, kZ85KeyChars + 1> public_key{};
  if (zmq_curve_public(public_key.data(), keys.secret_key.c_str()) != 0) {
    throw Error(std::string("cannot derive the job's CURVE key: ") + zmq_strerror(zmq_errno()));
  }
  keys.public_key = public_key.data();
  sodium_memzero(secret.data(), secret.size());
  return keys;
}

CurveKeyPair NewNodeKeys() {
  RequireCurve();
  std::array<char, kZ85KeyChars + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    throw Error(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()));
  }
  return {public_key.data(), secret_key.data()};
}

}  // namespace ps
