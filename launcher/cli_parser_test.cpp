#include "launcher/cli_parser.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <map>

namespace ddprun::launcher {
namespace {

struct Env {
  std::map<std::string, std::string> vars;
  GetEnv get() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = vars.find(n);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  }
};

LaunchConfig parse(std::vector<std::string> args, const Env& env = {}) {
  return parse_command_line(args, env.get());
}

std::string error_of(std::vector<std::string> args, const Env& env = {}) {
  try {
    parse(std::move(args), env);
  } catch (const CliError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CliParser, TorchrunDefaults) {
  auto c = parse({"train.py"});
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.nproc_per_node, "1");
  EXPECT_EQ(c.rdzv_backend, agent::Backend::kStatic);
  EXPECT_EQ(c.rdzv_id, "none");
  EXPECT_EQ(c.max_restarts, 0);
  EXPECT_EQ(c.role, "default");
  EXPECT_EQ(c.master_addr, "127.0.0.1");
  EXPECT_FALSE(c.master_port);
  EXPECT_EQ(c.signals, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.redirects.for_rank(0), agent::Std::kNone);
  EXPECT_FALSE(c.standalone);
  EXPECT_EQ(c.entrypoint, "train.py");
  EXPECT_TRUE(c.entrypoint_args.empty());
}

TEST(CliParser, DashUnderscoreEqualsAndSpaceSpellings) {
  for (auto args : std::vector<std::vector<std::string>>{{"--nproc_per_node=4", "x.py"},
                                                         {"--nproc-per-node=4", "x.py"},
                                                         {"--nproc_per_node", "4", "x.py"},
                                                         {"--nproc-per-node", "4", "x.py"},
                                                         {"--nproc-per", "4", "x.py"}}) {
    EXPECT_EQ(parse(args).nproc_per_node, "4") << args[0];
  }
}

TEST(CliParser, ShortFlags) {
  auto c = parse({"-r", "3", "-t1", "-m", "pkg.mod", "a"});
  EXPECT_EQ(c.redirects.for_rank(0), agent::Std::kAll);
  EXPECT_EQ(c.tee.for_rank(5), agent::Std::kOut);
  EXPECT_TRUE(c.module);
  EXPECT_EQ(c.entrypoint, "pkg.mod");
  EXPECT_EQ(c.entrypoint_args, (std::vector<std::string>{"a"}));
  EXPECT_EQ(parse({"-r=0:1,1:2", "x"}).redirects.for_rank(1), agent::Std::kErr);
}

TEST(CliParser, EverythingAfterTheEntrypointIsVerbatim) {
  auto c = parse({"--standalone", "train.py", "--nnodes=5", "-m", "${local_rank}", "--", "x y"});
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.entrypoint_args,
            (std::vector<std::string>{"--nnodes=5", "-m", "${local_rank}", "--", "x y"}));
  auto d = parse({"--", "-weird-name", "--flag"});
  EXPECT_EQ(d.entrypoint, "-weird-name");
  EXPECT_EQ(d.entrypoint_args, (std::vector<std::string>{"--flag"}));
}

TEST(CliParser, PetVariablesAreDefaultsTheCommandLineWins) {
  Env env{{{"PET_NPROC_PER_NODE", "3"},
           {"PET_MAX_RESTARTS", "2"},
           {"PET_STANDALONE", "1"},
           {"PET_NO_PYTHON", "0"},
           {"PET_RDZV_ENDPOINT", ""}}};
  auto c = parse({"--max-restarts=5", "x.py"}, env);
  EXPECT_EQ(c.nproc_per_node, "3");
  EXPECT_EQ(c.max_restarts, 5);
  EXPECT_TRUE(c.standalone);
  EXPECT_FALSE(c.no_python);
  EXPECT_TRUE(c.given.count("nproc_per_node"));
  EXPECT_FALSE(c.given.count("rdzv_endpoint"));
  EXPECT_NE(error_of({"x.py"}, Env{{{"PET_NNODES", "0"}}}).find("PET_NNODES=0"), std::string::npos);
  EXPECT_NE(error_of({"x.py"}, Env{{{"PET_STANDALONE", "yes"}}}).find("PET_STANDALONE"),
            std::string::npos);
}

TEST(CliParser, NodesAndRanges) {
  auto c = parse({"--nnodes=2:4", "x"});
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(parse({"--nnodes", "3", "x"}).max_nodes, 3);
}

TEST(CliParser, BadInputIsOneClearLine) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const auto& [args, expect] : std::vector<Case>{
           {{"--nnodes=0", "x"}, "at least 1"},
           {{"--nnodes=3:2", "x"}, "MIN must not exceed MAX"},
           {{"--nnodes=a", "x"}, "MIN:MAX"},
           {{"--nnodes=1:2:3", "x"}, "MIN:MAX"},
           {{"--max_restarts=-1", "x"}, "0 or more"},
           {{"--max_restarts=x", "x"}, "not an integer"},
           {{"--nproc_per_node=0", "x"}, "between 1 and"},
           {{"--nproc_per_node=many", "x"}, "cpu, gpu or auto"},
           {{"--redirects=5", "x"}, "per-rank map"},
           {{"--tee=0:9", "x"}, "per-rank map"},
           {{"-r", "0:1,", "x"}, "per-rank map"},
           {{"--bogus", "x"}, "unrecognized option --bogus"},
           {{"-z", "x"}, "unrecognized option -z"},
           {{"--no", "x"}, "ambiguous option --no"},
           {{"--standalone=1", "x"}, "takes no value"},
           {{"--master_port=70000", "x"}, "0 to 65535"},
           {{"--signals_to_handle=SIGFOO", "x"}, "not a signal name"},
           {{"--signals_to_handle=SIGKILL", "x"}, "cannot be handled"},
           {{"--local_ranks_filter=a", "x"}, "comma-separated list"},
           {{"--start_method=thread", "x"}, "spawn, fork or forkserver"},
           {{"--rdzv_backend=zookeeper", "x"}, "unknown rendezvous backend"},
           {{"--rdzv_conf=foo", "x"}, "KEY=VALUE"},
           {{"--shutdown_timeout=-5", "x"}, "0 or more"},
           {{"--monitor_interval=fast", "x"}, "seconds"},
           {{"--nproc_per_node"}, "needs a value"},
           {{"-m", "--no_python", "x"}, "cannot be used together"},
           {{"--nproc_per_node=2"}, "missing the entrypoint"},
           {{}, "missing the entrypoint"},
       }) {
    std::string err = error_of(args);
    EXPECT_NE(err.find(expect), std::string::npos)
        << "args[0]=" << (args.empty() ? "" : args[0]) << " error=" << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

TEST(CliParser, HelpAndVersionNeedNoEntrypoint) {
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--version"}).version);
}

TEST(CliParser, ListsAndFilters) {
  auto c = parse({"--local_ranks_filter=0,2", "--duplicate_stdout_filters=a,,b,c",
                  "--rdzv_conf=join_timeout=5,read_timeout=7", "x"});
  EXPECT_EQ(*c.local_ranks_filter, (std::set<int>{0, 2}));
  EXPECT_EQ(c.duplicate_stdout_filters, (std::vector<std::string>{"a,b", "c"}));
  EXPECT_EQ(c.rdzv_conf.at("join_timeout"), "5");
  EXPECT_EQ(c.rdzv_conf.at("read_timeout"), "7");
}

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

TEST(CliParser, PrintCompletion) {
  EXPECT_EQ(parse({"--print-completion", "zsh"}).print_completion, "zsh");
  EXPECT_EQ(parse({"--print-completion=bash"}).print_completion, "bash");  // no entrypoint needed
  try {
    parse({"--print-completion", "fish", "x"});
    FAIL() << "fish accepted";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("expected bash, zsh or tcsh"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddprun::launcher
