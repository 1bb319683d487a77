#include "ddprun/record.hpp"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddprun {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct TrainingDiverged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Record, JsonHasTorchelasticShape) {
  ErrorReport r{"std::runtime_error", "bad \"thing\"\n", "trace\tline"};
  EXPECT_EQ(error_file_json(r, 1700000000),
            "{\"message\": {\"message\": \"std::runtime_error: bad \\\"thing\\\"\\n\", "
            "\"extraInfo\": {\"py_callstack\": \"trace\\tline\", \"timestamp\": "
            "\"1700000000\"}}}");
}

TEST(Record, DescribesExceptionTypes) {
  ErrorReport r = describe_exception(std::make_exception_ptr(TrainingDiverged("loss is nan")));
  EXPECT_EQ(r.type, "ddprun::(anonymous namespace)::TrainingDiverged");
  EXPECT_EQ(r.message, "loss is nan");
  EXPECT_THAT(r.callstack, HasSubstr("TrainingDiverged: loss is nan"));

  try {
    TORCH_CHECK(false, "shapes differ");
  } catch (...) {
    ErrorReport c = describe_exception(std::current_exception());
    EXPECT_EQ(c.type, "c10::Error");
    EXPECT_THAT(c.message, StartsWith("shapes differ"));
  }
  ErrorReport odd = describe_exception(std::make_exception_ptr(42));
  EXPECT_EQ(odd.type, "unknown exception");
}

TEST(Record, WritesErrorFileAndReturnsOne) {
  auto dir =
      std::filesystem::temp_directory_path() / ("ddprun_record_test_" + std::to_string(::getpid()));
  auto file = dir / "attempt_0" / "1" / "error.json";
  ::setenv("TORCHELASTIC_ERROR_FILE", file.c_str(), 1);
  int rc = record([]() -> int { throw TrainingDiverged("loss is nan at step 7"); });
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(rc, 1);
  std::string json = slurp(file);
  EXPECT_THAT(json, HasSubstr("\"message\": \"ddprun::(anonymous namespace)::TrainingDiverged: "
                              "loss is nan at step 7\""));
  EXPECT_THAT(json, HasSubstr("\"timestamp\": \""));
  std::filesystem::remove_all(dir);
}

TEST(Record, PassesResultThroughAndWritesNothingOnSuccess) {
  EXPECT_EQ(record([] { return 3; }), 3);
  EXPECT_FALSE(write_error_file(ErrorReport{"t", "m", "c"}, ""));  // no path known
}

}  // namespace
}  // namespace ddprun
