// Collectives over serialisable objects: Python's all_gather_object, broadcast_object_list and
// gather_object for C++ workers.
//
//   std::vector<std::string> names;
//   ddprun::all_gather_object(*pg, names, my_name);   // names[r] is rank r's my_name
//
//   std::vector<at::Tensor> state;                   // filled on rank 0 only
//   ddprun::broadcast_object_list(*pg, state, 0);     // now rank 0's list on every rank
//
//   std::vector<std::string> reports;
//   ddprun::gather_object(*pg, my_report, &reports, 0);  // reports filled on rank 0 only
//
// An object crosses the wire as bytes made by ObjectCodec<T> (below): std::string as is,
// at::Tensor and std::vector<at::Tensor> in torch::save's format (so a tensor's shape, dtype
// and values arrive, each rank's object may have a different size). Anything else: write
// `template <> struct ddprun::ObjectCodec<MyType>` with the same two functions, or pass a codec
// as the second template argument. A torch::serialize::OutputArchive travels as the std::string
// its save_to() writes (see worker-sdk/README.md).
//
// These are collectives: every rank calls the same function in the same order with the same
// root, from the thread that issues the group's other collectives. They block until done and
// throw ddprun::Error (a bad root, a missing output list) or the backend's error.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

#include "ddprun/env.hpp"
#include "ddprun/process_group.hpp"

namespace ddprun {

// How an object of type T becomes bytes and back. decode() receives exactly what encode()
// returned on some rank.
template <class T>
struct ObjectCodec;  // no default: a type must opt in

template <>
struct ObjectCodec<std::string> {
  static std::string encode(const std::string& s) { return s; }
  static std::string decode(std::string_view bytes) { return std::string(bytes); }
};

// Tensors arrive on the device they were sent from (a CPU tensor on CPU), like unpickling.
template <>
struct ObjectCodec<at::Tensor> {
  static std::string encode(const at::Tensor& t);
  static at::Tensor decode(std::string_view bytes);
};

template <>
struct ObjectCodec<std::vector<at::Tensor>> {
  static std::string encode(const std::vector<at::Tensor>& tensors);
  static std::vector<at::Tensor> decode(std::string_view bytes);
};

namespace detail {
// A list of byte strings as one length-prefixed string, and back (ddprun::Error when `packed`
// is not something pack() wrote).
std::string pack(const std::vector<std::string>& parts);
std::vector<std::string> unpack(std::string_view packed);
}  // namespace detail

// Python: dist.all_gather_object(object_list, obj). Afterwards `out` holds one object per rank,
// in rank order (`out[pg.rank()]` is a copy of `obj`); its previous contents are replaced.
template <class T, class Codec = ObjectCodec<T>>
void all_gather_object(ProcessGroup& pg, std::vector<T>& out, const T& obj) {
  std::vector<std::string> parts = pg.all_gather_bytes(Codec::encode(obj));
  std::vector<T> objects;
  objects.reserve(parts.size());
  for (const auto& p : parts) objects.push_back(Codec::decode(p));
  out = std::move(objects);
}

// Python: dist.broadcast_object_list(object_list, src). On `src`, `objects` is sent and left
// as it is; on every other rank it is replaced by src's list (resized to its length: unlike
// Python, the other ranks' lists need not have the right length beforehand).
template <class T, class Codec = ObjectCodec<T>>
void broadcast_object_list(ProcessGroup& pg, std::vector<T>& objects, int src = 0) {
  if (src < 0 || src >= pg.size()) {
    throw Error("broadcast_object_list: src " + std::to_string(src) +
                " is not a rank of this group");
  }
  std::string packed;
  if (pg.rank() == src) {
    std::vector<std::string> parts;
    parts.reserve(objects.size());
    for (const auto& o : objects) parts.push_back(Codec::encode(o));
    packed = detail::pack(parts);
  }
  packed = pg.broadcast_bytes(packed, src);
  if (pg.rank() == src) return;
  std::vector<T> received;
  for (const auto& p : detail::unpack(packed)) received.push_back(Codec::decode(p));
  objects = std::move(received);
}

// Python: dist.gather_object(obj, object_gather_list, dst). On `dst`, `*out` (which must not
// be null there) is replaced by one object per rank in rank order; on the other ranks `out` is
// ignored and may be null.
template <class T, class Codec = ObjectCodec<T>>
void gather_object(ProcessGroup& pg, const T& obj, std::vector<T>* out, int dst = 0) {
  if (pg.rank() == dst && out == nullptr) {
    throw Error("gather_object: rank " + std::to_string(dst) +
                " is the destination and needs an output list");
  }
  std::vector<std::string> parts = pg.gather_bytes(Codec::encode(obj), dst);
  if (pg.rank() != dst) return;
  std::vector<T> objects;
  objects.reserve(parts.size());
  for (const auto& p : parts) objects.push_back(Codec::decode(p));
  *out = std::move(objects);
}

}  // namespace ddprun
