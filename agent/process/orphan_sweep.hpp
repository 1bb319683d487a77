// Orphan sweep: what a worker started outside its process group does not outlive the job.
//
// A worker's process group is killed when the worker ends, and the orphan guardian kills the
// groups if ddprun dies. A process that left the group (setsid: a double-forked daemon, a
// `setsid cmd &`) escapes both, and used to be adopted by init and live on. ddprun makes
// itself the child subreaper of its tree (become_subreaper, at start): such a process becomes
// ddprun's child when its parent dies, and sweep_orphans, at the end of each attempt and of
// the job, kills and reaps every child ddprun did not start itself, and what falls to it
// from them in turn. It also reaps the zombies the group kills leave (a worker's children
// reparented to ddprun), which would otherwise pile up over restarts.
//
// What a process detached from ddprun's tree altogether (a double fork under another
// subreaper, a systemd unit, a job of another scheduler) is beyond reach, as it should be.
//
// Threads: the agent's io_context.
#pragma once

#include <sys/types.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <set>
#include <string>
#include <vector>

namespace ddprun::agent {

// Makes this process the subreaper of its descendants; false if the kernel refused.
bool become_subreaper();
// Whether it is one (sweeps are only for a subreaper: another process's children are not ours).
bool is_subreaper();

// Kills (SIGKILL) and reaps every child of this process whose pid is not in `own`, and those
// that become its children meanwhile, for at most `limit`; reaps, without a word, those that
// had exited already. Returns what it killed, one "pid 4133 (sleep)" each.
boost::asio::awaitable<std::vector<std::string>> sweep_orphans(boost::asio::io_context& io,
                                                               std::set<pid_t> own,
                                                               std::chrono::milliseconds limit);

}  // namespace ddprun::agent
