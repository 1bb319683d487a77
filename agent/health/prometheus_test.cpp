#include "agent/health/prometheus.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "store/sys/fd.hpp"

namespace ddprun::agent {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A page with every feature: counter, gauge, labels, escaping, special values.
PrometheusText sample_page() {
  PrometheusText page;
  page.family("ddprun_restarts_total", "counter", "Worker group restarts since the agent started.");
  page.sample("ddprun_restarts_total", 2);
  page.family("ddprun_workers", "gauge", "Workers by state.");
  page.sample("ddprun_workers", 7, {{"state", "running"}});
  page.sample("ddprun_workers", 1, {{"state", "failed"}});
  page.family("ddprun_heartbeat_age_seconds", "gauge",
              "Seconds since a worker's last \"beat\" (C:\\ path)\nsecond line.");
  page.sample("ddprun_heartbeat_age_seconds", 0.25,
              {{"rank", "0"}, {"note", "say \"hi\" \\ bye\nnext"}});
  page.sample("ddprun_heartbeat_age_seconds", kNaN, {{"rank", "1"}});
  page.sample("ddprun_heartbeat_age_seconds", kInf, {{"rank", "2"}});
  page.sample("ddprun_heartbeat_age_seconds", -kInf, {{"rank", "3"}});
  return page;
}

TEST(PrometheusText, WritesTheExpositionFormat) {
  PrometheusText page;
  page.family("ddprun_restarts_total", "counter", "Worker group restarts since the agent started.");
  page.sample("ddprun_restarts_total", 2);
  page.family("ddprun_workers", "gauge", "Workers by state.");
  page.sample("ddprun_workers", 7, {{"state", "running"}});
  page.sample("ddprun_workers", 1, {{"state", "failed"}, {"node", "n1"}});
  EXPECT_EQ(page.str(),
            "# HELP ddprun_restarts_total Worker group restarts since the agent started.\n"
            "# TYPE ddprun_restarts_total counter\n"
            "ddprun_restarts_total 2\n"
            "# HELP ddprun_workers Workers by state.\n"
            "# TYPE ddprun_workers gauge\n"
            "ddprun_workers{state=\"running\"} 7\n"
            "ddprun_workers{state=\"failed\",node=\"n1\"} 1\n");
}

TEST(PrometheusText, EscapesLabelValuesAndHelp) {
  std::string text = sample_page().str();
  EXPECT_NE(text.find("# HELP ddprun_heartbeat_age_seconds Seconds since a worker's last "
                      "\"beat\" (C:\\\\ path)\\nsecond line.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ddprun_heartbeat_age_seconds{rank=\"0\",note=\"say \\\"hi\\\" \\\\ "
                      "bye\\nnext\"} 0.25\n"),
            std::string::npos)
      << text;
}

TEST(PrometheusText, SpellsValuesWithoutLocale) {
  EXPECT_EQ(prometheus_value(0), "0");
  EXPECT_EQ(prometheus_value(3), "3");
  EXPECT_EQ(prometheus_value(-42), "-42");
  EXPECT_EQ(prometheus_value(0.5), "0.5");
  EXPECT_EQ(prometheus_value(1234567.125), "1234567.125");
  EXPECT_EQ(prometheus_value(1e300), "1e+300");
  EXPECT_EQ(prometheus_value(kNaN), "NaN");
  EXPECT_EQ(prometheus_value(kInf), "+Inf");
  EXPECT_EQ(prometheus_value(-kInf), "-Inf");
  EXPECT_EQ(prometheus_value(1700000000.0), "1700000000");
}

TEST(PrometheusText, CountersMustEndInTotal) {
  PrometheusText page;
  EXPECT_THROW(page.family("ddprun_restarts", "counter", "h"), std::logic_error);
  EXPECT_THROW(page.family("_total", "counter", "h"), std::logic_error);
  EXPECT_NO_THROW(page.family("ddprun_restarts_total", "counter", "h"));
  EXPECT_NO_THROW(page.family("ddprun_workers", "gauge", "h"));  // gauges may be named freely
}

TEST(PrometheusText, RefusesMalformedDefinitions) {
  PrometheusText page;
  EXPECT_THROW(page.family("ddprun workers", "gauge", "h"), std::logic_error);
  EXPECT_THROW(page.family("1workers", "gauge", "h"), std::logic_error);
  EXPECT_THROW(page.family("ddprun_latency", "histogram", "h"), std::logic_error);
  page.family("ddprun_workers", "gauge", "h");
  EXPECT_THROW(page.family("ddprun_workers", "gauge", "again"), std::logic_error);
  EXPECT_THROW(page.sample("ddprun_workers", 1, {{"bad-label", "x"}}), std::logic_error);
  EXPECT_THROW(page.sample("ddprun_workers", 1, {{"__name__", "x"}}), std::logic_error);
  EXPECT_THROW(page.sample("ddprun_workers", 1, {{"a", "x"}, {"a", "y"}}), std::logic_error);
  EXPECT_EQ(page.str(), "# HELP ddprun_workers h\n# TYPE ddprun_workers gauge\n");
}

TEST(PrometheusText, SamplesMustFollowTheirFamily) {
  PrometheusText page;
  EXPECT_THROW(page.sample("ddprun_workers", 1), std::logic_error);  // undeclared
  page.family("ddprun_workers", "gauge", "h");
  page.sample("ddprun_workers", 1);
  page.family("ddprun_restarts_total", "counter", "h");
  EXPECT_THROW(page.sample("ddprun_workers", 2), std::logic_error);  // not the latest family
  EXPECT_THROW(page.sample("ddprun_other", 2), std::logic_error);
}

// The PATH entry holding an executable `name`, or "".
std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

TEST(PrometheusText, PromtoolAcceptsThePage) {
  std::string promtool = find_in_path("promtool");
  ASSERT_FALSE(promtool.empty())
      << "promtool is not in PATH (Debian package `prometheus`): run scripts/setup";
  std::string file = ::testing::TempDir() + "ddprun_health_metrics_XXXXXX";
  sys::UniqueFd fd(::mkstemp(file.data()));
  ASSERT_TRUE(fd) << "cannot create " << file;
  std::string text = sample_page().str();
  ASSERT_TRUE(sys::write_all(fd.get(), text.data(), text.size()));
  fd.reset();

  std::string command = "'" + promtool + "' check metrics < '" + file + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  int status = ::pclose(pipe);
  ::unlink(file.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "promtool check metrics: status " << status << "\n"
      << output << "\npage:\n"
      << text;
}

}  // namespace
}  // namespace ddprun::agent
