#include "store/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

#include "store/protocol.hpp"
#include "store/sys/random.hpp"

namespace ddprun::store::auth {
namespace {

std::string hmac(std::string_view token, std::string_view label, std::string_view first,
                 std::string_view second) {
  std::string message;
  message.reserve(label.size() + first.size() + second.size());
  message.append(label).append(first).append(second);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  static const unsigned char kEmpty = 0;  // HMAC() wants a key pointer even for no key
  const auto* key = token.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(token.data());
  if (HMAC(EVP_sha256(), key, static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
           &length) == nullptr ||
      length != kAuthBytes) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

}  // namespace

std::string nonce() {
  std::string out(kAuthBytes, '\0');
  sys::random_bytes(reinterpret_cast<unsigned char*>(out.data()), out.size());
  return out;
}

std::string server_proof(std::string_view token, std::string_view client_nonce,
                         std::string_view server_nonce) {
  return hmac(token, "ddprun-store-server", client_nonce, server_nonce);
}

std::string client_proof(std::string_view token, std::string_view server_nonce,
                         std::string_view client_nonce) {
  return hmac(token, "ddprun-store-client", server_nonce, client_nonce);
}

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ddprun::store::auth
