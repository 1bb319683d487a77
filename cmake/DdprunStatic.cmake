# DDPRUN_STATIC=ON: ddprun and ddpstore linked fully static (glibc, libstdc++, OpenSSL, Boost,
# c-ares), so they run on any x86-64 Linux, in a bare chroot or container, with nothing but the
# kernel. scripts/package builds them this way, in a build directory of their own.
#
# A static glibc's getaddrinfo() would load the NSS modules of the glibc it was linked with;
# the static executables route every getaddrinfo() to an NSS-free resolver over c-ares instead
# (store/sys/cares_resolver.hpp) by wrapping the symbol at link time, which also covers callers
# we do not write (Boost.Asio's resolver). OpenSSL's unused gethostbyname() and dlopen(), and
# c-ares's getservbyname() and getservbyport_r() (services are numeric), are wrapped too
# (store/sys/static_link_wraps.cpp). gethostname() is a system call and nothing else in ddprun
# asks NSS (no getpwuid, getgrnam): --fatal-warnings turns the linker's warning about any new
# static NSS or dlopen user into a build error.

if(DDPRUN_STATIC)
  # Included before the find_package() calls, so these pick the .a files.
  set(OPENSSL_USE_STATIC_LIBS TRUE)
  set(Boost_USE_STATIC_LIBS ON)
  # A directory configured without DDPRUN_STATIC first has the shared libraries cached.
  foreach(lib OPENSSL_CRYPTO_LIBRARY OPENSSL_SSL_LIBRARY CARES_LIBRARY)
    if(${lib} MATCHES "[.]so")
      unset(${lib} CACHE)
    endif()
  endforeach()
endif()

# ddprun_link_static(target ...): links each executable with -static, the resolver and the
# wraps.
function(ddprun_link_static)
  foreach(target ${ARGN})
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/store/sys/static_link_wraps.cpp)
    target_link_libraries(${target} PRIVATE ddprun_cares_resolver)
    target_link_options(${target} PRIVATE -static -Wl,--wrap=getaddrinfo -Wl,--wrap=freeaddrinfo
      -Wl,--wrap=gethostbyname -Wl,--wrap=getservbyname -Wl,--wrap=getservbyport_r
      -Wl,--wrap=dlopen -Wl,--fatal-warnings)
  endforeach()
endfunction()
