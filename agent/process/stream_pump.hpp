// StreamPump: carries one tee'd worker stream (stdout or stderr) from its pipe to the log file
// (byte for byte) and to ddprun's console as whole lines, each prefixed like torchrun's
// "[default0]:". Lines matching --duplicate-*-filters also go to filtered_*.log. Reads happen
// on the agent's io_context; no threads.
//
// Lifetime: shared_ptr, kept alive by its pending read. finish() is called when the worker
// exited: it drains what is already in the pipe (without waiting for grandchildren that might
// still hold it), flushes a last unterminated line and closes.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <string>
#include <vector>

#include "agent/process/line_splitter.hpp"
#include "store/sys/fd.hpp"

namespace ddprun::agent {

struct PumpSinks {
  sys::UniqueFd file;                            // the stream's log file (-1: none)
  std::string file_path;                         // its path, for the one line if a write fails
  int console_fd = -1;                           // ddprun's stdout or stderr (-1: not shown)
  std::string prefix;                            // console and filtered-file line prefix
  std::shared_ptr<sys::UniqueFd> filtered_file;  // shared by all ranks of an attempt
  std::vector<std::string> filters;              // substrings selecting lines for filtered_file
};

class StreamPump : public std::enable_shared_from_this<StreamPump> {
 public:
  StreamPump(boost::asio::io_context& io, sys::UniqueFd pipe_read, PumpSinks sinks);
  void start();
  void finish();

  // The log files a pump could not write in full (a full file system, say) since the process
  // started, "path (No space left on device)" each: the job summary names them.
  static const std::vector<std::string>& incomplete_files();

 private:
  void read_some();
  bool drain();  // reads what is available; false at EOF or error
  void consume(const char* data, size_t size);
  void emit_lines(std::string_view data, bool flush);

  boost::asio::posix::stream_descriptor pipe_;
  PumpSinks sinks_;
  LineSplitter lines_;
  std::string console_batch_;
  std::string filtered_batch_;
  bool finished_ = false;
};

}  // namespace ddprun::agent
