// libFuzzer target: three sessions sharing one StoreState, fed interleaved arbitrary bytes
// (both dialects, parked WAITs, barriers, cancels, queues, closes). Checks that nothing
// crashes or leaks and that a closed session never gets output afterwards. The third session
// belongs to a store with a token (the AUTH exchange and its refusals).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "store/session.hpp"

namespace {

using namespace ddprun::store;

struct Peer : OutputListener {
  Peer(StoreState& state, const Limits& limits, std::string_view token)
      : session(state, limits, *this, token) {}
  void on_output() override {
    if (session.output().empty()) std::abort();  // woken with nothing to send
  }
  Session session;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Limits limits;
  limits.max_key = 32;
  limits.max_value = 256;
  limits.max_keys = 8;
  StoreState state;
  std::unique_ptr<Peer> peers[3];
  // Records: [control byte][length byte][bytes...]; control picks the peer, and whether to
  // drain its output or to close it.
  size_t pos = 0;
  while (pos + 2 <= size) {
    uint8_t control = data[pos], length = data[pos + 1];
    pos += 2;
    size_t n = std::min<size_t>(length, size - pos);
    auto& peer = peers[control % 3];
    if (!peer) peer = std::make_unique<Peer>(state, limits, control % 3 == 2 ? "fuzz" : "");
    if (control & 0x80) {
      peer.reset();  // the client disconnects
    } else {
      if (!peer->session.feed(std::string_view(reinterpret_cast<const char*>(data) + pos, n))) {
        if (peer->session.error().empty()) std::abort();
        if (peer->session.refused() && control % 3 != 2) std::abort();  // open store: never
        peer.reset();
      } else if (control & 0x40) {
        peer->session.consume_output(peer->session.output().size());
      }
    }
    pos += n;
  }
  return 0;
}
