// Token authentication's cryptography: nonces, the two HMAC-SHA256 proofs and their
// constant-time comparison (OpenSSL libcrypto). The exchange itself is in Session (server)
// and the two clients; the bytes are in PROTOCOL.md, "AUTH". Internal to store/; pure
// functions, thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::store::auth {

// kAuthBytes random bytes from the kernel (getrandom); throws std::system_error if refused.
std::string nonce();

// HMAC-SHA256(token, "ddprun-store-server" || client_nonce || server_nonce): the server's
// answer to a client's challenge.
std::string server_proof(std::string_view token, std::string_view client_nonce,
                         std::string_view server_nonce);

// HMAC-SHA256(token, "ddprun-store-client" || server_nonce || client_nonce): the client's
// answer to the server's challenge. The labels differ, so neither side's proof can be
// reflected back as the other's.
std::string client_proof(std::string_view token, std::string_view server_nonce,
                         std::string_view client_nonce);

// Equal contents, compared in time independent of where they differ (CRYPTO_memcmp); sizes
// are not secret.
bool same(std::string_view a, std::string_view b);

}  // namespace ddprun::store::auth
