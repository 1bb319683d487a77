// torch's flight-recorder dumps in their default form, a pickle (what `_dump_fr_trace()` returns
// and what torch writes to TORCH_FR_DUMP_TEMP_FILE<rank>, e.g. NCCL's dump on a collective's
// timeout), read into the same JSON shape as the JSON dumps (collective_judge.hpp).
//
// Only the subset of pickle torch's own pickler writes for plain data is read (protocol 2:
// PROTO, MARK, EMPTY_DICT/LIST/TUPLE, SETITEM(S), APPEND(S), TUPLE/TUPLE1-3, BINUNICODE,
// SHORT_BINUNICODE, BININT/BININT1/BININT2, LONG1 up to 8 bytes, BINFLOAT, NONE, NEWTRUE,
// NEWFALSE, BINPUT/LONG_BINPUT/MEMOIZE, BINGET/LONG_BINGET, FRAME, STOP). Anything else (GLOBAL,
// REDUCE, BUILD: objects that would run code in Python) is refused: the reader never executes
// anything and is bounded by its input (nesting at most 64 deep).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::agent {

// Tuples become arrays; dictionary keys become strings (integers in decimal). nullopt, and why
// in `error`, for anything else than one complete pickle of that subset.
std::optional<nlohmann::json> read_pickle(std::string_view data, std::string* error);

}  // namespace ddprun::agent
