// TimerRequest: one line of torch's FileTimer protocol (torch.distributed.elastic.timer.
// FileTimerClient, torch 1.13 and 2.x), as its client writes it:
//   {"version": 1, "pid": 4121, "scope_id": "train.py#42", "expiration_time": 1718000000.25,
//    "signal": 9}
// expiration_time is absolute wall-clock time in seconds (Python's time.time()); a negative one
// releases the (pid, scope_id) timer. signal is what the client asks the server to kill the pid
// with; <= 0 asks for no kill. "version" is not checked (torch's server does not either).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::agent {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;
  int signal = 0;

  bool is_release() const { return expiration_time < 0; }
};

// Either a request or why the line is not one ("not valid JSON", "'pid' is missing or not a
// positive integer"...). Never throws, whatever the bytes.
struct ParsedTimerRequest {
  std::optional<TimerRequest> request;
  std::string error;
};

ParsedTimerRequest parse_timer_request(std::string_view line);

}  // namespace ddprun::agent
