// The metrics registry (common/metrics.h): the names follow Prometheus's
// conventions and are documented, the text format carries what was
// recorded, and the endpoint serves it over HTTP. Torch-free.
#include "common/metrics.h"
#include "common/text_endpoint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tests/support/http.h"

namespace conveyor::metrics {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string EndOf(const std::string& name, std::size_t n) { return name.size() >= n ? name.substr(name.size() - n) : ""; }

TEST(MetricsTable, NamesFollowPrometheusConventions) {
  std::set<std::string> names;
  for (const Definition& d : Definitions()) {
    const std::string name = d.name;
    SCOPED_TRACE(name);
    EXPECT_TRUE(names.insert(name).second) << "defined twice";
    EXPECT_TRUE(std::regex_match(name, std::regex("conveyor_[a-z_]+")));
    if (d.type == Type::kCounter) EXPECT_EQ(EndOf(name, 6), "_total");
    if (d.type != Type::kCounter) EXPECT_NE(EndOf(name, 6), "_total");
    if (d.type == Type::kHistogram) EXPECT_EQ(EndOf(name, 8), "_seconds");
    if (name.find("bytes") != std::string::npos) EXPECT_TRUE(EndOf(name, 6) == "_bytes" || EndOf(name, 12) == "_bytes_total");
    // `job` is the label Prometheus gives every series of a scrape target.
    const std::string labels = std::string(",") + d.labels + ",";
    EXPECT_EQ(labels.find(",job,"), std::string::npos);
    EXPECT_GT(std::string(d.help).size(), 10u);
  }
}

TEST(MetricsTable, EverySeriesIsDocumented) {
  const std::string doc = ReadText(std::string(CONVEYOR_SOURCE_DIR) + "/docs/operations.md");
  ASSERT_FALSE(doc.empty());
  for (const Definition& d : Definitions()) {
    EXPECT_NE(doc.find(std::string("`") + d.name + "`"), std::string::npos)
        << d.name << " is not in docs/operations.md's list of metrics";
  }
}

TEST(MetricsTable, TheDashboardAsksOnlyForSeriesThatExist) {
  const std::string dashboard = ReadText(std::string(CONVEYOR_SOURCE_DIR) + "/deploy/grafana/conveyor.json");
  ASSERT_FALSE(dashboard.empty());
  std::set<std::string> defined;
  for (const Definition& d : Definitions()) {
    defined.insert(d.name);
    if (d.type == Type::kHistogram)
      for (const char* suffix : {"_bucket", "_sum", "_count"}) defined.insert(std::string(d.name) + suffix);
  }
  const std::regex name("conveyor_[a-z_]+");
  int asked = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), name); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(defined.count(it->str())) << it->str() << " is in deploy/grafana/conveyor.json but no series";
    ++asked;
  }
  EXPECT_GT(asked, 15);
}

TEST(MetricsText, CarriesWhatWasRecorded) {
  if (!Available()) GTEST_SKIP() << "built without prometheus-cpp";
  const Labels job = {{"job_id", "job-text-1"}};
  Add(Id::kSteps, job, 2);
  Add(Id::kSteps, job);
  Set(Id::kLoss, job, 0.5);
  Observe(Id::kStepSeconds, job, 0.02);
  Observe(Id::kStepSeconds, job, 7);
  CountRpcError("Coordinator/GetJob", absl::NotFoundError("no job"));
  CountRpcError("Coordinator/GetJob", absl::OkStatus());  // not an error: not counted
  const std::string text = Text();
  EXPECT_NE(text.find("# TYPE conveyor_steps_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_steps_total{job_id=\"job-text-1\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE conveyor_loss gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_loss{job_id=\"job-text-1\"} 0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_step_seconds_bucket{job_id=\"job-text-1\",le=\"0.025\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_step_seconds_bucket{job_id=\"job-text-1\",le=\"10\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_step_seconds_count{job_id=\"job-text-1\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("conveyor_rpc_errors_total{code=\"NOT_FOUND\",method=\"Coordinator/GetJob\"} 1"),
            std::string::npos)
      << text;

  Forget(Id::kLoss, job);
  EXPECT_EQ(Text().find("conveyor_loss{job_id=\"job-text-1\"}"), std::string::npos);
}

TEST(MetricsText, AWrongTypeOfUpdateChangesNothing) {
  if (!Available()) GTEST_SKIP() << "built without prometheus-cpp";
  const Labels job = {{"job_id", "job-text-2"}};
  Set(Id::kSteps, job, 42);  // a counter is not set
  Add(Id::kSteps, job, -5);  // nor decreased
  EXPECT_NE(Text().find("conveyor_steps_total{job_id=\"job-text-2\"} 0"), std::string::npos) << Text();
}

TEST(MetricsEndpoint, ServesTheTextOverHttp) {
  const std::string port_file = ::testing::TempDir() + "/metrics-endpoint.port";
  struct Removed {  // nothing left in /tmp when run outside ctest
    const std::string& path;
    ~Removed() { std::remove(path.c_str()); }
  } removed{port_file};
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", port_file);
  if (!Available()) {
    ASSERT_FALSE(endpoint.ok());
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(endpoint.status().message().find("prometheus-cpp-dev"), std::string::npos) << endpoint.status();
    return;
  }
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_EQ(ReadText(port_file), (*endpoint)->address() + "\n");
  EXPECT_NE((*endpoint)->address(), "127.0.0.1:0");
  Set(Id::kLoss, {{"job_id", "job-http"}}, 1.25);
  auto reply = testing::HttpGet((*endpoint)->address(), "/metrics");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code, 200);
  EXPECT_NE(reply->body.find("conveyor_loss{job_id=\"job-http\"} 1.25"), std::string::npos) << reply->body;
}

// The endpoint behind --metrics-listen (common/text_endpoint.h): its own
// path only, GET only, and a client that never sends its request does not
// keep others waiting forever.
TEST(TextEndpoint, AnswersItsPathAndNothingElse) {
  int made = 0;
  auto e = TextEndpoint::Start("127.0.0.1:0", "/metrics", "text/plain", [&made] {
    return "made " + std::to_string(++made) + "\n";
  });
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string at = "127.0.0.1:" + std::to_string((*e)->port());
  auto ok = testing::HttpGet(at, "/metrics?x=1");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->code, 200);
  EXPECT_EQ(ok->body, "made 1\n");
  auto missing = testing::HttpGet(at, "/other");
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->code, 404);
  EXPECT_EQ(made, 1);
  auto taken = TextEndpoint::Start(at, "/metrics", "text/plain", [] { return std::string(); });
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable) << taken.status();
  EXPECT_NE(taken.status().message().find(at), std::string::npos) << taken.status();
}

TEST(MetricsEndpoint, RefusesABadAddressByName) {
  auto endpoint = MetricsEndpoint::Start("no-port-here");
  ASSERT_FALSE(endpoint.ok());
  EXPECT_NE(endpoint.status().message().find("--metrics-listen"), std::string::npos) << endpoint.status();
  EXPECT_TRUE(MetricsEndpoint::Start("").ok());  // none asked for: none started
  EXPECT_EQ(*MetricsEndpoint::Start(""), nullptr);
}

TEST(MetricsEndpoint, AnAddressInUseIsUnavailable) {
  if (!Available()) GTEST_SKIP() << "built without prometheus-cpp";
  auto first = MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsEndpoint::Start((*first)->address());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

}  // namespace
}  // namespace conveyor::metrics
