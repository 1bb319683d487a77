// Linked only into the static executables (cmake/DdprunStatic.cmake), which are linked with
// -Wl,--wrap for each function below: every call to one of them in those programs, ours and
// the libraries' (Boost.Asio's resolver in the etcd client, OpenSSL), lands here instead of in
// glibc. A static glibc implements these by loading shared objects of the exact glibc it was
// built with (NSS modules, dlopen), which another distribution or a chroot does not have.
// With them wrapped the link has no such warning left, and the build makes any new one an
// error (--fatal-warnings).
#include <netdb.h>

#include "store/sys/dns_resolver.hpp"

// Name resolution: our NSS-free resolver (dns_resolver.hpp).
extern "C" int __wrap_getaddrinfo(const char* node, const char* service, const addrinfo* hints,
                                  addrinfo** res) {
  return ddprun::sys::dns::get_addr_info(node, service, hints, res,
                                         ddprun::sys::dns::system_config());
}

extern "C" void __wrap_freeaddrinfo(addrinfo* ai) {
  ddprun::sys::dns::free_addr_info(ai);
}

// Referenced by OpenSSL's BIO socket helpers, which ddprun never calls.
extern "C" hostent* __wrap_gethostbyname(const char*) {
  h_errno = NO_RECOVERY;
  return nullptr;
}

// OpenSSL's loader of engines and provider modules: a static program loads none, so OpenSSL's
// built-in default provider is what TLS and HMAC use.
extern "C" void* __wrap_dlopen(const char*, int) {
  return nullptr;
}
