// The launch plan tests' fixture: a temporary PATH with a python3 and an executable, a script,
// and make_launch_plan() over a command line with these variables.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_plan.hpp"

namespace ddprun::launcher::test {

namespace fs = std::filesystem;

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddprun_plan_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "bin");
    write(dir_ / "bin" / "python3", "#!/bin/sh\n", 0755);
    write(dir_ / "bin" / "train", "#!/bin/sh\n", 0755);
    write(dir_ / "script.py", "print(1)\n", 0644);
    write(dir_ / "notexec", "x\n", 0644);
    vars_["PATH"] = (dir_ / "bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& p, const std::string& text, mode_t mode) {
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
  }
  GetEnv env() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = vars_.find(n);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    };
  }
  LaunchPlan plan(std::vector<std::string> args) {
    return make_launch_plan(parse_command_line(args, env()), env(), {"PATH=" + vars_["PATH"]});
  }
  std::string error_of(std::vector<std::string> args) {
    try {
      plan(std::move(args));
    } catch (const CliError& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path dir_;
  std::map<std::string, std::string> vars_;
};

}  // namespace ddprun::launcher::test
