// Linked only into the static executables (cmake/DdprunStatic.cmake), which are linked with
// -Wl,--wrap for each function below: every call to one of them in those programs, ours and
// the libraries' (Boost.Asio's resolver in the etcd client, OpenSSL, c-ares), lands here instead
// of in glibc. A static glibc implements these by loading shared objects of the exact glibc it
// was built with (NSS modules, dlopen), which another distribution or a chroot does not have.
// With them wrapped the link has no such warning left, and the build makes any new one an
// error (--fatal-warnings).
#include <netdb.h>

#include <cerrno>

#include "store/sys/cares_resolver.hpp"

// Name resolution: our NSS-free resolver over c-ares (cares_resolver.hpp).
extern "C" int __wrap_getaddrinfo(const char* node, const char* service, const addrinfo* hints,
                                  addrinfo** res) {
  return ddprun::sys::cares::get_addr_info(node, service, hints, res);
}

extern "C" void __wrap_freeaddrinfo(addrinfo* ai) {
  ddprun::sys::cares::free_addr_info(ai);
}

// Referenced by OpenSSL's BIO socket helpers, which ddprun never calls.
extern "C" hostent* __wrap_gethostbyname(const char*) {
  h_errno = NO_RECOVERY;
  return nullptr;
}

// Service names, which ddprun never asks c-ares for (services are numeric; the resolver sets
// the port itself): getservbyname() is c-ares's getaddrinfo's, getservbyport_r() its
// getnameinfo's, linked in with it (one object file). No such service.
extern "C" servent* __wrap_getservbyname(const char*, const char*) {
  return nullptr;
}

extern "C" int __wrap_getservbyport_r(int, const char*, servent*, char*, size_t, servent** result) {
  *result = nullptr;
  return ENOENT;
}

// OpenSSL's loader of engines and provider modules: a static program loads none, so OpenSSL's
// built-in default provider is what TLS and HMAC use.
extern "C" void* __wrap_dlopen(const char*, int) {
  return nullptr;
}
