#include "chaos/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace spillway::chaos {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

RequestRecord Request(std::string id, int64_t sent_ms, int64_t latency_ms, int http_status) {
  RequestRecord r;
  r.id = std::move(id);
  r.scenario = "gpu-kill";
  r.service = "chat";
  r.kind = "chat";
  r.sent_ms = sent_ms;
  r.latency_ms = latency_ms;
  r.http_status = http_status;
  r.acknowledged = http_status != 0;
  r.connection_survived = http_status == 200;
  return r;
}

ScenarioResult Scenario() {
  ScenarioResult r;
  r.name = "gpu-kill";
  r.description = "kill -9 the GPU worker under load";
  r.target = "spillway";
  r.seed = 7;
  r.duration_ms = 10000;
  r.requests.push_back(Request("a", 100, 250, 200));
  RequestRecord degraded = Request("b", 2500, 900, 200);
  degraded.degraded_signal = true;
  degraded.placement = "cpu";
  degraded.attempts = 2;
  degraded.attempt_placements = {"gpu", "cpu"};
  degraded.deterministic = true;
  degraded.equivalent = true;
  degraded.output = "bad utf-8: \xff\xfe";
  r.requests.push_back(degraded);
  r.requests.push_back(Request("c", 3000, 40, 503));
  RequestRecord cancelled = Request("d", 4000, 120, 200);
  cancelled.cancelled_by_client = true;
  r.requests.push_back(cancelled);
  r.requests.push_back(Request("e", 5000, -1, 0));
  r.faults.push_back({2000, "kill -9 gpu worker", 1500});
  r.faults.push_back({6000, "sim hold <200 MiB> & \"co\"", -1});
  for (int i = 0; i < 5; ++i) {
    Sample s;
    s.t_ms = i * 2000;
    s.device_used_bytes = (100 + 50 * i) * 1048576ull;
    s.device_capacity_bytes = 1024 * 1048576ull;
    s.rss_bytes = {{"chat.0", 300 * 1048576ull}, {"embed.0", 80 * 1048576ull}};
    s.cpu_path_ram_bytes = 200 * 1048576ull;
    s.cpu_path_budget_bytes = 512 * 1048576ull;
    s.cpu_queue_waiting = i % 3;
    s.cpu_queue_running = i > 1 ? 1 : 0;
    r.samples.push_back(s);
  }
  Verdict& v = r.verdict;
  v.sent = 5, v.acknowledged = 4, v.succeeded = 2, v.failed_controlled = 1, v.cancelled = 1, v.lost = 0, v.unknown = 1;
  v.retried = 1, v.deterministic_compared = 1, v.deterministic_equal = 1, v.degraded_served = 1,
  v.degraded_signalled = 1;
  v.success_rate = 0.4, v.p50_ms = 250, v.p95_ms = 900, v.goodput_per_min = 12;
  v.host_ram_peak_bytes = 380 * 1048576ull, v.host_ram_budget_bytes = 512 * 1048576ull;
  v.host_ram_measured_peak_bytes = 300 * 1048576ull;
  v.faults_armed = 2, v.faults_fired = 1;
  v.recovery_median_ms = 1500, v.recovery_max_ms = 1500;
  v.passed = false;
  v.failures = {"1 request unknown (e)", "success rate 40% < 90%"};
  return r;
}

ScenarioResult Baseline(std::string target, double goodput, double p95) {
  ScenarioResult b;
  b.name = "gpu-kill";
  b.target = std::move(target);
  b.verdict.goodput_per_min = goodput;
  b.verdict.p95_ms = p95;
  b.verdict.success_rate = 0.2;
  return b;
}

void ExpectSvg(const std::string& svg) {
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
  ASSERT_GE(svg.size(), 7u);
  EXPECT_TRUE(svg.ends_with("</svg>\n")) << svg.substr(svg.size() - 20);
}

TEST(RecordTest, JsonHasEveryFieldAndNullForUnknownEquivalence) {
  ScenarioResult r = Scenario();
  nlohmann::json j = ToJson(r);
  EXPECT_EQ(j["name"], "gpu-kill");
  EXPECT_EQ(j["requests"].size(), 5u);
  EXPECT_TRUE(j["requests"][0]["equivalent"].is_null());
  EXPECT_EQ(j["requests"][1]["equivalent"], true);
  EXPECT_EQ(j["requests"][1]["attempt_placements"][1], "cpu");
  EXPECT_EQ(j.size(), 12u);
  EXPECT_EQ(j["requests"][0].size(), 28u);
  EXPECT_EQ(j["faults"][0].size(), 7u);
  EXPECT_TRUE(j["faults"][0]["fired"].is_null());  // a kill: not armed
  EXPECT_EQ(j["samples"][0].size(), 15u);
  EXPECT_EQ(j["verdict"].size(), 41u);
  EXPECT_EQ(j["requests"][1]["cancelled_by_client"], false);
  EXPECT_EQ(j["requests"][1]["degraded_signal"], true);
  EXPECT_EQ(j["samples"][4]["cpu_queue_running"], 1);
  EXPECT_EQ(j["verdict"]["retried_not_exactly_once"], 0);
  EXPECT_EQ(j["faults"][0]["kind"], "kill -9 gpu worker");
  EXPECT_EQ(j["samples"][1]["rss_bytes"]["chat.0"], 300 * 1048576ull);
  EXPECT_EQ(j["verdict"]["failures"].size(), 2u);
  EXPECT_EQ(j["verdict"]["recovery_max_ms"], 1500);
}

TEST(ReportTest, MarkdownHasRowsVerdictsRatiosAndFailures) {
  ScenarioResult ok = Scenario();
  ok.name = "steady";
  ok.verdict.passed = true;
  ok.verdict.failures.clear();
  ScenarioResult skipped = Baseline("llama-server", 0, 0);
  skipped.skipped_reason = "cannot kill a worker it does not have";
  ScenarioResult profile = Scenario();
  profile.target = "resident";
  std::string md = MarkdownSummary({Scenario(), ok}, {Baseline("plain-proxy", 6, 1800), skipped}, {profile}, 42);
  EXPECT_TRUE(Contains(md, "spillway chaos --seed 42")) << md;
  EXPECT_TRUE(Contains(md, "**Overall: FAIL**")) << md;
  EXPECT_TRUE(Contains(md, "| gpu-kill ")) << md;
  EXPECT_TRUE(Contains(md, "| FAIL ")) << md;
  EXPECT_TRUE(Contains(md, "| PASS ")) << md;
  EXPECT_TRUE(Contains(md, "- success rate 40% < 90%")) << md;
  EXPECT_TRUE(Contains(md, "2.00x")) << md;  // goodput 12 / 6
  EXPECT_TRUE(Contains(md, "0.50x")) << md;  // p95 900 / 1800
  EXPECT_TRUE(Contains(md, "n/a")) << md;
  EXPECT_TRUE(Contains(md, "cannot kill a worker it does not have")) << md;
  // No success: its p95 of 0 gives no ratio (it printed 0.00x, read as Spillway's favour).
  ScenarioResult none = Scenario();
  none.verdict.succeeded = 0;
  none.verdict.p95_ms = 0;
  EXPECT_FALSE(Contains(MarkdownSummary({none}, {Baseline("plain-proxy", 6, 1800)}, {}, 42), "0.00x"));
  EXPECT_TRUE(Contains(md, "| resident ")) << md;
  EXPECT_TRUE(Contains(md, " 300 |")) << md;  // device peak MiB of the profile
  EXPECT_TRUE(Contains(md, " 1/1 |")) << md;
  EXPECT_TRUE(Contains(md, " 380 (300) / 512 |")) << md;
  EXPECT_TRUE(Contains(md, " 1/2 |")) << md;  // faults fired / armed

  std::string pass = MarkdownSummary({ok}, {}, {}, 1);
  EXPECT_TRUE(Contains(pass, "**Overall: PASS**")) << pass;
  EXPECT_TRUE(Contains(pass, "No baseline runs")) << pass;
}

TEST(ReportTest, JsonHasEverything) {
  nlohmann::json j = ReportJson({Scenario()}, {Baseline("plain-proxy", 6, 1800)}, {}, 42);
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["spillway"][0]["requests"].size(), 5u);
  EXPECT_EQ(j["spillway"][0]["samples"].size(), 5u);
  EXPECT_EQ(j["spillway"][0]["faults"].size(), 2u);
  EXPECT_EQ(j["baselines"][0]["target"], "plain-proxy");
  EXPECT_TRUE(j["profiles"].empty());
}

TEST(ReportTest, ServicesCompetingGetAStackedMemoryChartWithTheirEvictionsAndATable) {
  ScenarioResult r = Scenario();
  r.name = "competing_services";
  for (size_t i = 0; i < r.samples.size(); ++i) {
    r.samples[i].service_device_bytes = {{"chat", 20ull << 20}, {i % 2 ? "search" : "embed", 40ull << 20}};
  }
  r.events = {{1200, "evict", "embed", "embed.0", "gives its room to search", "search"},
              {1300, "unload", "embed", "embed.0", "evicted", ""}};
  r.verdict.interactive_p95_alone_ms = 200;
  r.verdict.interactive_p95_pressure_ms = 220;
  r.verdict.interactive_alone = 12;
  r.verdict.evictions = 1;
  const std::string memory = MemorySvg(r);
  ExpectSvg(memory);
  EXPECT_TRUE(Contains(memory, "Device memory by service (stacked)"));
  EXPECT_TRUE(Contains(memory, "<polygon"));
  EXPECT_TRUE(Contains(memory, "evict embed for search"));
  for (const char* name : {"chat", "embed", "search"}) EXPECT_TRUE(Contains(memory, std::string(">") + name + "<")) << name;
  // One service only: no stacked panel.
  EXPECT_FALSE(Contains(MemorySvg(Scenario()), "stacked"));
  ScenarioResult swap = r;
  swap.target = "swap-all";
  swap.verdict.interactive_p95_pressure_ms = 900;
  const std::string md = MarkdownSummary({r}, {swap}, {}, 1);
  EXPECT_TRUE(Contains(md, "## Services competing for one device")) << md;
  EXPECT_TRUE(Contains(md, "1.10x")) << md;
  EXPECT_TRUE(Contains(md, "4.50x")) << md;
}

TEST(ReportTest, SvgsAreWellFormedWithEscapedFaultLabels) {
  ScenarioResult r = Scenario();
  std::string latency = LatencySvg(r), memory = MemorySvg(r), queue = QueueSvg(r);
  for (const std::string* svg : {&latency, &memory, &queue}) {
    ExpectSvg(*svg);
    EXPECT_TRUE(Contains(*svg, "kill -9 gpu worker"));
    EXPECT_TRUE(Contains(*svg, "sim hold &lt;200 MiB&gt; &amp; &quot;co&quot;"));
    EXPECT_FALSE(Contains(*svg, "<200 MiB>"));
    EXPECT_FALSE(Contains(*svg, "no data"));
  }
  EXPECT_TRUE(Contains(latency, "<circle"));
  EXPECT_TRUE(Contains(latency, "succeeded (degraded)"));
  EXPECT_TRUE(Contains(latency, "never ended"));
  EXPECT_TRUE(Contains(memory, "<polyline"));
  EXPECT_TRUE(Contains(memory, "RSS chat.0"));
  EXPECT_TRUE(Contains(memory, "RSS embed.0"));
  EXPECT_TRUE(Contains(memory, "CPU path budget"));
  EXPECT_TRUE(Contains(queue, "<polyline"));
}

TEST(ReportTest, EmptyResultsGiveNoDataSvgs) {
  ScenarioResult empty;
  empty.faults.push_back({100, "a & b", -1});
  for (const std::string& svg : {LatencySvg(empty), MemorySvg(empty), QueueSvg(empty), LatencySvg(ScenarioResult{})}) {
    ExpectSvg(svg);
    EXPECT_TRUE(Contains(svg, "no data")) << svg;
    EXPECT_FALSE(Contains(svg, "<circle"));
  }
}

TEST(ReportTest, FileNamesAreSanitized) {
  EXPECT_EQ(FileNameFor("GPU Kill/../x"), "gpu_kill____x");
  EXPECT_EQ(FileNameFor("cpu-queue_2"), "cpu-queue_2");
  EXPECT_EQ(FileNameFor(""), "scenario");
}

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ReportTest, WritesTheReportFiles) {
  fs::path dir = fs::temp_directory_path() / ("spillway-report-test-" + std::to_string(getpid())) / "nested";
  ScenarioResult r = Scenario();
  r.name = "GPU Kill";
  ASSERT_TRUE(WriteReport(dir.string(), {r}, {Baseline("plain-proxy", 6, 1800)}, {}, 42).ok());
  for (const char* name : {"summary.md", "report.json", "gpu_kill-latency.svg", "gpu_kill-memory.svg",
                           "gpu_kill-queue.svg"}) {
    EXPECT_TRUE(fs::exists(dir / name)) << name;
  }
  nlohmann::json j = nlohmann::json::parse(ReadFile(dir / "report.json"));
  EXPECT_EQ(j["spillway"][0]["requests"].size(), 5u);
  EXPECT_TRUE(Contains(ReadFile(dir / "summary.md"), "spillway chaos --seed 42"));

  ASSERT_TRUE(WriteScenario(dir.string(), r).ok());
  ASSERT_TRUE(WriteScenario(dir.string(), Baseline("plain-proxy", 6, 1800)).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir / "gpu_kill.json"))["requests"].size(), 5u);
  EXPECT_TRUE(fs::exists(dir / "gpu-kill-plain-proxy.json"));

  // A file where the directory should be: an error, not an exception.
  EXPECT_FALSE(WriteReport((dir / "summary.md" / "sub").string(), {r}, {}, {}, 42).ok());
  fs::remove_all(dir.parent_path());
}

}  // namespace
}  // namespace spillway::chaos
