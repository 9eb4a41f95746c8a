// The whole request lifecycle in one process: a real Gateway and Journal,
// in-process fake workers (tests/fakes/) for a service with a primary on a
// simulated device and a CPU fallback, and a stepped clock. Each test is one
// path through the lifecycle table in gateway_internal.h, checked from both
// ends: what the client got and what the journal says.
#include "gateway/gateway.h"
#include "gateway/reply_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sqlite3.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <condition_variable>
#include <thread>
#include <tuple>

#include "api/ollama_response.h"
#include "api/openai_response.h"
#include "common/clock.h"
#include "config/config.h"
#include "devices/sim_ledger.h"
#include "fake_worker.h"
#include "fake_workers.h"
#include "journal/journal.h"
#include "protocol/worker_protocol.h"
#include "recording_exchange.h"
#include "scoped_sim_dir.h"

namespace spillway::gateway {
namespace {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using nlohmann::json;
using spillway::testing::FakeWorker;
using spillway::testing::FakeWorkers;
using spillway::testing::RecordingExchange;

constexpr const char* kConfig = R"(
[[service]]
name = "chat"
model = "/nonexistent/chat.gguf"
max_tokens = 64
[service.cpu_path]
ram_budget_mib = 1024
host_headroom_mib = 0
[[service.placement]]
role = "primary"
device = "sim:0"
ctx = 256
slots = 2
[[service.placement]]
role = "fallback"
device = "cpu"
ctx = 256
slots = 2
)";

std::string Chunk(const std::string& text, int token) {
  return api::SseEvent({{"choices", {{{"index", 0}, {"text", text}}}}, {"spillway", {{"tokens", {token}}}}});
}

// How a fake worker answers a generation: the test sets it per worker.
using Behaviour = std::function<void(http::Request& req, std::shared_ptr<http::Exchange> ex)>;

// A worker that counts prompt tokens like a real one (5 per prompt) and
// answers generations as its current behaviour says; it remembers the
// bodies and request ids it was sent.
struct Worker {
  std::mutex mu;
  Behaviour behaviour;
  std::vector<json> bodies;
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<http::Exchange>> held;  // by call: answers held back until a cancel
  std::atomic<bool> hang_tokenize{false};             // a hung worker: /tokenize is never answered
  std::vector<std::shared_ptr<http::Exchange>> hung;
  std::set<std::string> cancelled_early;  // cancels that found nothing running
  std::atomic<int> cancels{0};            // DELETEs of a request received
  // While set, a cancelled request's 499 waits for ReleaseCancelled(): a
  // test sees what the gateway does between a cancel and its request's end.
  std::atomic<bool> hold_cancelled{false};
  std::vector<std::shared_ptr<http::Exchange>> cancelled_held;
  std::atomic<int> tokenizes{0};          // prompts counted
  std::atomic<int> drops{0};              // a chat's oldest messages its count leaves out ("truncate")
  std::vector<std::string> tokenize_targets;
  // When set, what a count says for the context it is asked to cut for
  // (fit_cells; 0 when none is given; prompt_tokens < 0: no tail fits, a
  // 400); otherwise 5 tokens and `drops`.
  std::function<protocol::TokenizeReply(uint32_t)> count;
  std::vector<bool> handled;  // by call: its behaviour has returned (its answer held, or given)
  std::condition_variable handled_cv;
  // A behaviour that holds the request running until it is cancelled.
  void Hold(const http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const std::string id(req["x-request-id"]);
    {
      std::lock_guard<std::mutex> lk(mu);
      // Cancelled between its call being counted and held here: ended as a
      // real worker ends it (held, it was never answered).
      if (cancelled_early.erase(id) == 0) {
        for (size_t i = ids.size(); i-- > 0;) {
          if (ids[i] == id) {
            held[i] = std::move(ex);
            return;
          }
        }
      }
    }
    if (ex) ex->Respond(http::MakeResponse(499, api::ErrorBody(Status::Cancelled("cancelled")).dump(), "application/json"));
  }
  FakeWorker server{[this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const std::string target(req.target());
    if (target.rfind(protocol::kTokenizePath, 0) == 0) {
      ++tokenizes;
      {
        std::lock_guard<std::mutex> lk(mu);
        tokenize_targets.push_back(target);
      }
      if (hang_tokenize) {
        std::lock_guard<std::mutex> lk(mu);
        hung.push_back(std::move(ex));
        return;
      }
      protocol::TokenizeReply reply{5, 256, 16, drops.load()};
      if (count) {
        const size_t at = target.find("fit_cells=");
        reply = count(at == std::string::npos ? 0 : static_cast<uint32_t>(std::stoul(target.substr(at + 10))));
        if (reply.prompt_tokens < 0) {
          const Status none = Status::InvalidArgument("no tail of it fits").WithReason(kContextLengthExceeded);
          return ex->Respond(http::MakeResponse(400, api::ErrorBody(none).dump(), "application/json"));
        }
      }
      return ex->Respond(http::MakeResponse(200, reply.ToJson().dump(), "application/json"));
    }
    if (target.rfind(protocol::kCancelPrefix, 0) == 0) {
      ++cancels;
      // As a real worker does: the cancelled request ends with 499.
      const std::string id = target.substr(protocol::kCancelPrefix.size());
      std::shared_ptr<http::Exchange> running;
      {
        std::lock_guard<std::mutex> lk(mu);
        for (size_t i = 0; i < held.size(); ++i) {
          if (ids[i] == id && held[i]) running = std::exchange(held[i], nullptr);
        }
      }
      if (running && hold_cancelled) {
        std::lock_guard<std::mutex> lk(mu);
        cancelled_held.push_back(std::move(running));
      } else if (running) {
        running->Respond(http::MakeResponse(499, api::ErrorBody(Status::Cancelled("cancelled")).dump(), "application/json"));
      } else {
        // A cancel that came before its request (the gateway sends it as
        // soon as it is asked): the request is refused when it arrives, as
        // a real worker's cancelled_early_ does. (Held instead, it was never
        // answered: a flaky timeout in BusyLifecycleTest.)
        std::lock_guard<std::mutex> lk(mu);
        cancelled_early.insert(id);
      }
      return ex->Respond(http::MakeResponse(200, "{}", "application/json"));
    }
    Behaviour b;
    size_t call = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      call = bodies.size();
      handled.push_back(false);
      bodies.push_back(json::parse(req.body(), nullptr, false));
      auto id = req.find("x-request-id");
      ids.push_back(id == req.end() ? "" : std::string(id->value()));
      held.push_back(nullptr);
      b = behaviour;
      if (cancelled_early.erase(ids.back()) > 0) {
        b = [](http::Request&, std::shared_ptr<http::Exchange> early) {
          early->Respond(http::MakeResponse(499, api::ErrorBody(Status::Cancelled("cancelled before it arrived")).dump(),
                                            "application/json"));
        };
      }
    }
    b(req, std::move(ex));
    {
      std::lock_guard<std::mutex> lk(mu);
      handled[call] = true;
    }
    handled_cv.notify_all();
  }};
  // The 499s held by hold_cancelled, answered now (and no more held).
  void ReleaseCancelled() {
    hold_cancelled = false;
    std::vector<std::shared_ptr<http::Exchange>> release;
    {
      std::lock_guard<std::mutex> lk(mu);
      release.swap(cancelled_held);
    }
    for (auto& ex : release) {
      ex->Respond(http::MakeResponse(499, api::ErrorBody(Status::Cancelled("cancelled")).dump(), "application/json"));
    }
  }
  // Call `i`'s held answer, taken to answer it (null when none is held).
  // A call counted (calls()) is waited for until its behaviour has run: its
  // answer is held only then (taken in between, there was none: a crash).
  std::shared_ptr<http::Exchange> TakeHeld(size_t i) {
    std::unique_lock<std::mutex> lk(mu);
    handled_cv.wait_for(lk, std::chrono::seconds(10), [&] { return i >= handled.size() || handled[i]; });
    return i < held.size() ? std::exchange(held[i], nullptr) : nullptr;
  }
  size_t calls() {
    std::lock_guard<std::mutex> lk(mu);
    return bodies.size();
  }
  // Answers still held (a cancel that came before its request was held
  // finds nothing to end) go before the server whose connections they
  // post to: after it, their destructors used a freed strand (valgrind;
  // a heap corruption now and then in a later test).
  ~Worker() {
    std::lock_guard<std::mutex> lk(mu);
    held.clear();
    hung.clear();
  }
};

void Answer(std::shared_ptr<http::Exchange> ex, const std::string& text) {
  if (!ex) return ADD_FAILURE() << "no answer held to give \"" << text << "\"";
  ex->Respond(http::MakeResponse(200, json{{"object", "text_completion"}, {"choices", {{{"text", text}}}}}.dump(),
                                 "application/json"));
}
void Refuse(std::shared_ptr<http::Exchange> ex, Status st) {
  if (!ex) return ADD_FAILURE() << "no answer held to refuse with " << st.ToString();
  ex->Respond(http::MakeResponse(static_cast<unsigned>(HttpStatusFor(st.code())), api::ErrorBody(st).dump(),
                                 "application/json"));
}

// A worker's stream that delivers `chunks` (text, token id) and then fails
// with `failure` (an allocation failure in compute unless said otherwise).
Behaviour CutStream(std::vector<std::pair<std::string, int>> chunks,
                    Status failure = Status::ResourceExhausted("compute").WithPhase(FailurePhase::kCompute)) {
  return [chunks = std::move(chunks), failure](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    for (const auto& [text, token] : chunks) ex->Write(Chunk(text, token));
    ex->Write(api::SseEvent(api::ErrorBody(failure)));
    ex->End();
  };
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // (A parameterized test's name is "Name/0": one directory, not one in another that stays behind.)
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() / ("spillway-lifecycle-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto cfg = config::ParseConfig(config_text_, "lifecycle.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    journal::JournalOptions jo;
    jo.faults = faults_;  // none until a test asks (on SQLite's default VFS underneath)
    jo.deferred_sync_ms = deferred_sync_ms_;
    auto j = journal::Journal::Open((dir_ / "journal.db").string(), jo, clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(*j);
    workers_.SetReady("chat.0", primary_.server.port());
    workers_.SetReady("chat.1", fallback_.server.port());
    primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "primary"); };
    fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
    gateway_ = std::make_unique<Gateway>(config_, *journal_, workers_, clock_, admissions_);
    gateway_->SetAttemptBounds(attempt_bounds_);
    gateway_->Start(ioc_.get_executor(), Recovered());
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }
  void TearDown() override {
    guard_.reset();
    ioc_.stop();
    for (auto& t : threads_) t.join();
    gateway_->Shutdown();
    std::filesystem::remove_all(dir_);
    // The I/O context goes first (see the members' order): destroying it
    // ends suspended lifecycles, which give back what they held to the
    // gateway, as `spillway serve` does.
  }

  // (Before SetUp.) chat on demand, and another service, other, on demand
  // on chat's device sim:0 (which is `exclusive` or shared, without headroom).
  void ChatAndOtherOnDemand(bool exclusive) {
    const std::string on_demand = "max_tokens = 64\nresidency = \"on_demand\"\n";
    ASSERT_NE(config_text_.find("max_tokens = 64\n"), std::string::npos);
    config_text_.replace(config_text_.find("max_tokens = 64\n"), 16, on_demand);
    config_text_ = "[[device]]\nname = \"sim:0\"\nexclusive = " + std::string(exclusive ? "true" : "false") +
                   "\nheadroom_mib = 0\nheadroom_pct = 0\n" + config_text_ +
                   "[[service]]\nname = \"other\"\nmodel = \"/nonexistent/other.gguf\"\nresidency = \"on_demand\"\n"
                   "[[service.placement]]\ndevice = \"sim:0\"\nctx = 256\nslots = 1\n";
    workers_.SetOnDemand("chat.0");
    workers_.SetOnDemand("other.0");
  }
  // What the journal holds from "before a restart" (run by Start).
  virtual std::vector<journal::RequestRecord> Recovered() { return {}; }
  // For Recovered: completions for chat accepted "before the restart", as Recover returns them.
  std::vector<journal::RequestRecord> RecoverCompletions(const std::vector<std::string>& ids, int64_t deadline_ms = 0) {
    for (const auto& id : ids) {
      journal::RequestRecord r;
      r.id = id;
      r.payload_hash = "h";
      r.service = "chat";
      r.endpoint = "completion";
      r.body = json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump();
      r.deadline_ms = deadline_ms;
      EXPECT_TRUE(journal_->Accept(r).ok());
    }
    auto recovered = journal_->Recover();
    EXPECT_TRUE(recovered.ok());
    return recovered.ok() ? *recovered : std::vector<journal::RequestRecord>{};
  }

  std::shared_ptr<RecordingExchange> Send(const std::string& target, const std::string& body, const std::string& method = "POST",
                                          std::vector<std::pair<std::string, std::string>> headers = {}) {
    http::Request req{bhttp::string_to_verb(method), target, 11};
    req.set(bhttp::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    auto ex = std::make_shared<RecordingExchange>();
    ex->peer = peer_;
    gateway_->Handle(std::move(req), ex);
    return ex;
  }
  std::shared_ptr<RecordingExchange> Complete(const std::string& id, bool stream = false,
                                              std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("X-Request-Id", id);
    return Send("/v1/completions",
                json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}, {"stream", stream}}.dump(), "POST", headers);
  }
  journal::RequestRecord Journaled(const std::string& id) {
    auto r = journal_->Get(id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : journal::RequestRecord{};
  }
  // Both slots of the primary and the CPU line's one, taken by requests
  // (ids `prefix`0..2) their workers hold until cancelled; empty when they
  // did not all reach their workers.
  std::vector<std::shared_ptr<RecordingExchange>> TakeEveryPlace(const std::string& prefix) {
    primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
    fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
    std::vector<std::shared_ptr<RecordingExchange>> running;
    for (int i = 0; i < 3; ++i) running.push_back(Complete(prefix + std::to_string(i)));
    if (!Eventually([&] { return primary_.calls() + fallback_.calls() == 3; })) running.clear();
    return running;
  }
  // GET /v1/requests/{id}'s answer, waited for (a journal read: answered
  // from the blocking pool, after Handle returns); "" if none came.
  std::string Queried(const std::string& id) {
    auto q = Send("/v1/requests/" + id, "", "GET");
    return q->Wait() ? q->body() : "";
  }
  // Until request `id` waits with a reason (queued at once; its reason once
  // admission has decided to wait).
  bool ToldWhyItWaits(const std::string& id) {
    return Eventually([&] {
      const std::string answer = Queried(id);
      return !answer.empty() && json::parse(answer).value("queue", json::object()).contains("reason");
    });
  }
  // Worker `key` was killed and its replacement (on `port`) is ready 0.7 s
  // later, as the supervisor's ready callback says: its breaker is half-open.
  void KilledAndBack(const std::string& key, uint16_t port) {
    workers_.Exit(key, "signal 9");
    clock_.Advance(700);  // its backoff, its load
    workers_.SetReadyAgain(key, port);
    gateway_->WorkerReady(key);
  }
  // Both workers begin to load (a model loading since now), and are ready again.
  void EveryWorkerStarting() {
    workers_.SetStarting("chat.0", clock_.NowMs());
    workers_.SetStarting("chat.1", clock_.NowMs());
  }
  void EveryWorkerReadyAgain() {
    workers_.SetReadyAgain("chat.0", primary_.server.port());
    workers_.SetReadyAgain("chat.1", fallback_.server.port());
  }
  // The accelerator placement gone; the CPU fallback holds what it is sent until the test answers it.
  void OnlyTheHoldingCpuFallback() {
    workers_.Exit("chat.0", "exit 1");
    fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
  }
  std::shared_ptr<RecordingExchange> Embed(const std::string& id) {
    return Send("/v1/embeddings", json{{"model", "chat"}, {"input", "hello"}}.dump(), "POST", {{"X-Request-Id", id}});
  }
  // The service's CPU line as /v1/status shows it.
  json CpuLine() { return StatusNow()["services"][0]["cpu_path"]; }
  json StatusNow() {
    auto st = Send("/v1/status", "", "GET");
    EXPECT_TRUE(st->Wait());
    return json::parse(st->body(), nullptr, false);
  }
  // Waits (briefly, for a condition the gateway reaches on its own threads).
  template <typename F>
  bool Eventually(F f, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  std::filesystem::path dir_;
  std::string peer_ = "127.0.0.1";  // the address the next Send comes from
  std::string config_text_ = kConfig;  // (a fixture may change it before SetUp)
  int64_t deferred_sync_ms_ = 50;  // JournalOptions' default
  AttemptBounds attempt_bounds_;   // the gateway's own (a fixture may step them down before SetUp)
  std::map<std::string, PlacementAdmission> admissions_;  // (none: every placement admitted, 0 bytes predicted)
  FakeClock clock_;
  config::GatewayConfig config_;
  std::shared_ptr<journal::StorageFaults> faults_ = journal::StorageFaults::Create();
  std::unique_ptr<journal::Journal> journal_;
  Worker primary_, fallback_;
  FakeWorkers workers_;
  std::unique_ptr<Gateway> gateway_;  // outlives the I/O context
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> guard_{ioc_.get_executor()};
  std::vector<std::thread> threads_;
};

TEST_F(LifecycleTest, AnAdmittedRequestRunsOnThePrimaryAndIsJournaledBeforeItsAnswer) {
  auto ex = Complete("r-ok");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  EXPECT_NE(ex->body().find("primary"), std::string::npos);
  EXPECT_EQ(ex->header("X-Request-Id"), "r-ok");
  EXPECT_EQ(ex->header("X-Spillway-Placement"), "sim:0/0");
  EXPECT_EQ(ex->header("X-Spillway-Attempts"), "1");
  const auto rec = Journaled("r-ok");
  EXPECT_EQ(rec.state, journal::State::kCompleted);
  EXPECT_EQ(rec.result_body, ex->body()) << "the journal holds the answer the client got";
  EXPECT_EQ(primary_.ids, std::vector<std::string>{"r-ok"});
}

// A request with no id of its own is journaled with its first attempt in one
// commit-log record, written while the worker computes; its end is the second.
TEST_F(LifecycleTest, ARequestWithoutAnIdIsJournaledWithItsFirstAttemptInOneCommit) {
  const int64_t logged = journal_->stats().logged;
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  const std::string id = ex->header("X-Request-Id");
  ASSERT_FALSE(id.empty());
  const auto rec = Journaled(id);
  EXPECT_EQ(rec.state, journal::State::kCompleted);
  EXPECT_EQ(rec.result_body, ex->body());
  auto attempts = journal_->Attempts(id);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 1u);
  EXPECT_EQ((*attempts)[0].outcome, "completed");
  EXPECT_EQ(journal_->stats().logged - logged, 2) << "accept + attempt, then the finish";
}

// The gateway's ids: `req_` and 24 hex digits, led by the time in seconds so
// that the journal's indexes take them in order; the rest is random.
TEST_F(LifecycleTest, TheGatewaysIdsAreLedByTheTimeAndRandomAfterIt) {
  auto id_of_next = [&] {
    auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
    EXPECT_TRUE(ex->Wait());
    return ex->header("X-Request-Id");
  };
  const std::string a = id_of_next(), b = id_of_next();
  clock_.Advance(2000);
  const std::string c = id_of_next();
  for (const auto& id : {a, b, c}) EXPECT_TRUE(std::regex_match(id, std::regex("req_[0-9a-f]{24}"))) << id;
  char now[9];
  std::snprintf(now, sizeof now, "%08x", static_cast<unsigned>((clock_.NowMs() - 2000) / 1000));
  EXPECT_EQ(a.substr(4, 8), now);
  EXPECT_EQ(a.substr(0, 12), b.substr(0, 12)) << "the same second";
  EXPECT_NE(a.substr(12), b.substr(12)) << "random after the time";
  EXPECT_LT(b, c) << "a later second sorts after";
}

// The worker answers while the commit covering the request is still on its
// way to the disk: the client hears nothing until it is durable.
TEST_F(LifecycleTest, NothingReachesTheClientBeforeTheRequestIsDurable) {
  faults_->BlockSyncs();
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(faults_->WaitForHeldSyncs(1, std::chrono::seconds(10)));
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; })) << "the attempt runs while its commit syncs";
  EXPECT_FALSE(ex->Wait(std::chrono::milliseconds(200))) << "an answer reached the client before its request was durable";
  faults_->Unblock();
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  EXPECT_EQ(Journaled(ex->header("X-Request-Id")).state, journal::State::kCompleted);
}

// At FULL a non-streamed request costs one fdatasync: its first record
// (request + attempt) asks for none and becomes durable in its end's sync,
// before the answer leaves. A stream shows its first byte only once its
// request is durable, so its first record is synced on its own.
// The gateway's own bounds on an attempt (an hour's answer without a
// deadline; 600 s of a stream's silence), one of them stepped down to 300 ms
// by each test's fixture.
class AttemptBoundLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    LifecycleTest::SetUp();
    primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  }
  // The request ended 504 on its one attempt, said why, and cancelled the
  // worker's generation; nothing took the healthy placement for a crashed one.
  void EndedAtTheBound(const std::shared_ptr<RecordingExchange>& ex, const std::string& id, const std::string& why) {
    ASSERT_TRUE(ex->Wait());
    EXPECT_NE(ex->body().find(why), std::string::npos) << ex->body();
    const auto rec = Journaled(id);
    EXPECT_EQ(rec.state, journal::State::kFailed);
    EXPECT_EQ(primary_.calls(), 1u) << "not run again from scratch";
    EXPECT_EQ(fallback_.calls(), 0u) << "not moved to the CPU as if the primary had crashed";
    EXPECT_TRUE(workers_.suspected().empty()) << "the worker answers its health checks";
    EXPECT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["state"], "closed");
    EXPECT_TRUE(Eventually([&] { return primary_.cancels > 0; })) << "its generation is cancelled";
  }
};

// An answer that outlasts the gateway's bound on a request without
// X-Request-Timeout ends it 504: it was taken for a crash of the placement
// (breaker tripped, the request run again three times before a 503).
class AnswerBoundLifecycleTest : public AttemptBoundLifecycleTest {
 protected:
  void SetUp() override {
    attempt_bounds_.answer = std::chrono::milliseconds(300);
    AttemptBoundLifecycleTest::SetUp();
  }
};
class SilenceBoundLifecycleTest : public AttemptBoundLifecycleTest {
 protected:
  void SetUp() override {
    attempt_bounds_.stream_silence = std::chrono::milliseconds(300);
    AttemptBoundLifecycleTest::SetUp();
  }
};

TEST_F(AnswerBoundLifecycleTest, AnAnswerPastTheGatewaysBoundEndsTheRequest) {
  auto ex = Complete("r-hour");
  EndedAtTheBound(ex, "r-hour", "gave no answer within 300 ms (the gateway's bound on a request without X-Request-Timeout)");
  EXPECT_EQ(ex->status(), 504);
}

// The bound on an answer is for a request without X-Request-Timeout: one
// with a deadline runs until it. Capped by the bound, X-Request-Timeout: 7200
// ended 504 "did not finish within its X-Request-Timeout" at an hour.
TEST_F(AnswerBoundLifecycleTest, ARequestWithADeadlineRunsPastTheBoundUntilItsDeadline) {
  for (const bool stream : {false, true}) {
    const std::string id = stream ? "r-long-stream" : "r-long";
    const size_t call = primary_.calls();
    auto ex = Complete(id, stream, {{"X-Request-Timeout", "60"}});
    ASSERT_TRUE(Eventually([&] { return primary_.calls() > call; }));
    EXPECT_FALSE(ex->Wait(std::chrono::milliseconds(600))) << "ended at the answer's bound: " << ex->body();
    auto held = primary_.TakeHeld(call);
    ASSERT_TRUE(held) << "cancelled at the answer's bound";
    if (stream) {
      held->StartStream(http::MakeResponse(200, "", "text/event-stream"));
      held->Write(Chunk("late", 7));
      held->Write("data: [DONE]\n\n");
      held->End();
    } else {
      Answer(held, "late");
    }
    ASSERT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 200u) << ex->body();
    EXPECT_NE(ex->body().find("late"), std::string::npos) << ex->body();
    EXPECT_EQ(Journaled(id).state, journal::State::kCompleted);
  }
}

// A stream with a deadline whose worker is silent past the gateway's bound
// on a stream's silence, well before its deadline: the same. It was counted
// as the worker's failure, and ran again elsewhere.
TEST_F(SilenceBoundLifecycleTest, ABoundedStreamSilentPastTheGatewaysBoundEndsTheRequest) {
  auto ex = Complete("r-silent", true, {{"X-Request-Timeout", "60"}});
  EndedAtTheBound(ex, "r-silent", "sent nothing for 300 ms (the gateway's bound on a stream's silence)");
}

// A stream the client has tokens of, silent past the bound where it goes on
// (a continuation replaying many tokens on a slow CPU), ends resumable with
// its checkpoint, as a cut stream that goes no further does: it ended
// failed, with none.
TEST_F(SilenceBoundLifecycleTest, AContinuationSilentPastTheBoundEndsResumable) {
  primary_.behaviour = CutStream({{"a", 11}, {"b", 12}});
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));  // and nothing more: replaying
    fallback_.Hold(req, std::move(ex));
  };
  auto ex = Complete("r-slow-replay", true, {{"X-Request-Timeout", "60"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("checkpoint"), std::string::npos) << ex->body();
  EXPECT_NE(ex->body().find("the gateway's bound on a stream's silence"), std::string::npos) << ex->body();
  EXPECT_EQ(Journaled("r-slow-replay").state, journal::State::kFailedResumable);
}

// The same past delivered tool calls: resumable with its checkpoint (which
// says they were delivered), as a cut stream past them ends; it ended
// failed, with no checkpoint.
TEST_F(SilenceBoundLifecycleTest, AStreamSilentAfterItsToolCallsEndsResumable) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"delta", {{"tool_calls", {{{"index", 0}, {"function", {{"name", "add"}}}}}}}}}}},
                             {"spillway", {{"tokens", {21, 22}}}}}));
    primary_.Hold(req, std::move(ex));  // and then nothing
  };
  auto ex = Complete("r-tool-silent", true, {{"X-Request-Timeout", "60"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("checkpoint"), std::string::npos) << ex->body();
  EXPECT_NE(ex->body().find("tool calls were delivered"), std::string::npos) << ex->body();
  EXPECT_EQ(Journaled("r-tool-silent").state, journal::State::kFailedResumable);
  EXPECT_EQ(fallback_.calls(), 0u) << "replayed past a delivered tool call";
}

class OneSyncLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    deferred_sync_ms_ = 600'000;  // no deadline: only the end's record may sync the first
    LifecycleTest::SetUp();
  }
};

TEST_F(OneSyncLifecycleTest, ANonStreamedRequestSharesOneSyncWithItsEnd) {
  journal_->Flush();
  int64_t before = faults_->syncs();
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  EXPECT_EQ(faults_->syncs() - before, 1) << "the request's first record was synced on its own";
  EXPECT_EQ(Journaled(ex->header("X-Request-Id")).state, journal::State::kCompleted);

  journal_->Flush();
  before = faults_->syncs();
  auto stream = Send("/v1/completions",
                     json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}, {"stream", true}}.dump());
  ASSERT_TRUE(stream->Wait());
  EXPECT_EQ(faults_->syncs() - before, 2) << "a stream's first byte needs its request durable first";
}

// A query for such a request while it runs asks for its first record's
// sync (it waited for its end's): the next query finds it. A 200 means the
// journal holds it, so the first may still be a 404.
TEST_F(OneSyncLifecycleTest, ARunningRequestWhoseRecordWaitsForItsEndIsFoundByItsId) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  std::string id;
  {
    std::lock_guard<std::mutex> lk(primary_.mu);
    id = primary_.ids[0];
  }
  std::shared_ptr<RecordingExchange> query;
  EXPECT_TRUE(Eventually([&] {
    query = Send("/v1/requests/" + id, "", "GET");
    return query->Wait() && query->status() == 200u;
  })) << "never found: " << query->body();
  EXPECT_EQ(json::parse(query->body(), nullptr, false).value("state", ""), "running") << query->body();
  auto cancel = Send("/v1/requests/" + id, "", "DELETE");  // (lets the held request end)
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(ex->Wait());
}

// A non-streamed request's first record is written while the worker
// computes, not on the request's way to it: with every write held, the
// worker has the request already. Its answer waits for the record (the
// client hears nothing the journal does not hold). A stream's record goes
// first: its events reach the client as they come.
TEST_F(LifecycleTest, ARequestReachesItsWorkerWhileItsRecordIsWritten) {
  faults_->BlockWrites();
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  const bool reached = Eventually([&] { return primary_.calls() == 1; });
  EXPECT_FALSE(ex->done()) << "answered before its record was written";
  faults_->Unblock();
  EXPECT_TRUE(reached) << "the worker got the request only once its record was written";
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(Journaled(ex->header("X-Request-Id")).state, journal::State::kCompleted);

  faults_->BlockWrites();
  auto stream = Send("/v1/completions",
                     json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}, {"stream", true}}.dump());
  EXPECT_FALSE(Eventually([&] { return primary_.calls() == 2; }, std::chrono::milliseconds(300)))
      << "a stream went to its worker before its record was written";
  faults_->Unblock();
  ASSERT_TRUE(stream->Wait());
  EXPECT_EQ(stream->status(), 200u);

  // A large body's record goes first too (one the log could never hold is refused before it is sent).
  faults_->BlockWrites();
  auto large = Send("/v1/completions",
                    json{{"model", "chat"}, {"prompt", std::string(100'000, 'x')}, {"max_tokens", 8}}.dump());
  EXPECT_FALSE(Eventually([&] { return primary_.calls() == 3; }, std::chrono::milliseconds(300)))
      << "a large body went to its worker before its record was written";
  faults_->Unblock();
  ASSERT_TRUE(large->Wait());
  EXPECT_EQ(large->status(), 200u) << large->body();
}

// A journal that cannot write: the request that finds out gets a 503 (never
// the worker's answer); the next one is refused before it runs.
TEST_F(LifecycleTest, AJournalThatCannotWriteRefusesNewRequests) {
  faults_->SetDiskFull(true);
  const std::string body = json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump();
  auto first = Send("/v1/completions", body);
  ASSERT_TRUE(first->Wait());
  EXPECT_EQ(first->status(), 503u) << first->body();
  EXPECT_EQ(first->body().find("primary"), std::string::npos) << "the worker's answer reached the client";
  // Its commit is asked for while the worker computes (off the request's
  // way): the first request to find the disk full went to the worker, whose
  // answer was thrown away. No later one goes, while the journal refuses.
  EXPECT_LE(primary_.calls(), 1u);
  const size_t calls = primary_.calls();
  auto second = Send("/v1/completions", body);
  ASSERT_TRUE(second->Wait());
  EXPECT_EQ(second->status(), 503u) << second->body();
  EXPECT_NE(second->body().find("journal cannot write"), std::string::npos) << second->body();
  EXPECT_EQ(primary_.calls(), calls) << "a request the journal refuses was sent to a worker";
}

// An acknowledged request whose next attempt the journal cannot record (the
// disk filled after its Accept) ends with a 503, and the journal says so once
// it writes again: left running, a retry with its Idempotency-Key heard "in
// flight" for good, and a restart ran what its client had been told failed.
// Streamed or not (a restart runs a request not streamed again, never a
// stream: it marks it failed_resumable).
class AttemptUnrecordedTest : public LifecycleTest, public ::testing::WithParamInterface<bool> {};

TEST_P(AttemptUnrecordedTest, AnAttemptTheJournalCannotRecordEndsTheRequestAsItsClientHeard) {
  const bool stream = GetParam();
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  const std::string body = json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}, {"stream", stream}}.dump();
  auto ex = Send("/v1/completions", body, "POST", {{"X-Request-Id", "r-unrecorded"}});
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  ASSERT_TRUE(Eventually([&] {  // accepted, its first attempt durable
    auto r = journal_->Get("r-unrecorded");
    return r.ok() && r->state == journal::State::kRunning;
  }));
  faults_->SetDiskFull(true);
  std::shared_ptr<http::Exchange> held = primary_.TakeHeld(0);
  ASSERT_TRUE(held);
  Refuse(held, Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv));  // the fallback next
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  if (stream) {
    EXPECT_NE(ex->body().find("journal cannot write"), std::string::npos) << ex->body();
    EXPECT_EQ(ex->body().find("runs it again"), std::string::npos) << "untrue of a stream: " << ex->body();
  } else {
    // The client hears that the request may still run again (a restart
    // before its end is recorded) and how to tell when a resend is safe.
    EXPECT_NE(ex->body().find("could not record its next attempt"), std::string::npos) << ex->body();
    EXPECT_NE(ex->body().find("GET /v1/requests/r-unrecorded"), std::string::npos) << ex->body();
    // Not sent again on their own by the OpenAI SDKs (which retry a 5xx).
    EXPECT_EQ(ex->header("X-Should-Retry"), "false");
    EXPECT_EQ(json::parse(ex->body(), nullptr, false)["error"].value("code", ""), "answer_withheld") << ex->body();
  }
  // A stream's attempt is journaled before it is sent; a whole one's commit
  // is asked for while its worker computes, and the first to find the disk
  // full was sent (its answer thrown away: AJournalThatCannotWrite...).
  EXPECT_EQ(fallback_.calls(), stream ? 0u : 1u) << "an attempt the journal did not record was sent";
  faults_->SetDiskFull(false);
  EXPECT_TRUE(Eventually([&] { return journal::IsTerminal(Journaled("r-unrecorded").state); }, std::chrono::seconds(15)))
      << journal::StateName(Journaled("r-unrecorded").state);
  EXPECT_EQ(Journaled("r-unrecorded").result_status, 503);
}

INSTANTIATE_TEST_SUITE_P(Requests, AttemptUnrecordedTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Streamed" : "Whole"; });

// An attempt the journal refuses for another reason than its storage (a
// lock another program holds past the busy timeout: `sqlite3 journal.db`
// left in a transaction) ends the request, and its end is recorded once the
// journal writes again. The client was told "request running", as if
// someone had cancelled it, and the row stayed running for good (a retry
// with its key heard "in flight"; a restart ran it again). Then it heard
// the bare 500, where a restart before its end is recorded runs it again:
// it hears that, as a disk-full journal's client does.
TEST_F(LifecycleTest, AnAttemptTheJournalRefusesForAnotherReasonEndsAndItsEndIsRecordedLater) {
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open_v2((dir_ / "journal.db").c_str(), &other, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_busy_timeout(other, 10000);  // (the journal's own transaction first)
  primary_.behaviour = [&](http::Request&, std::shared_ptr<http::Exchange> ex) {
    EXPECT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE;", nullptr, nullptr, nullptr), SQLITE_OK);  // held from now on
    Refuse(ex, Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv));  // the fallback next
  };
  auto ex = Complete("r-locked");
  ASSERT_TRUE(ex->Wait(std::chrono::seconds(60)));
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_EQ(ex->body().find("request running"), std::string::npos) << ex->body();
  EXPECT_NE(ex->body().find("could not record its next attempt"), std::string::npos) << ex->body();
  EXPECT_EQ(ex->header("X-Should-Retry"), "false");
  sqlite3_exec(other, "ROLLBACK;", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  EXPECT_TRUE(Eventually([&] { return journal::IsTerminal(Journaled("r-locked").state); }, std::chrono::seconds(30)))
      << journal::StateName(Journaled("r-locked").state);
  // As its client heard it (a keyed retry replays this).
  EXPECT_EQ(Journaled("r-locked").result_status, 503);
}

TEST_F(LifecycleTest, AnAllocationFailureIsReplayedOnTheFallbackWithTheSameIdAndSeed) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv));
  };
  auto ex = Complete("r-oom");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  EXPECT_NE(ex->body().find("fallback"), std::string::npos);
  EXPECT_EQ(ex->header("X-Spillway-Attempts"), "2");
  EXPECT_NE(ex->header("X-Spillway-Degraded").find("fallback"), std::string::npos);
  ASSERT_EQ(primary_.calls(), 1u);
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.ids[0], "r-oom");
  ASSERT_TRUE(primary_.bodies[0].contains("seed"));
  EXPECT_EQ(primary_.bodies[0]["seed"], fallback_.bodies[0]["seed"]) << "a replay samples what the first attempt would have";
  const auto rec = Journaled("r-oom");
  EXPECT_EQ(rec.state, journal::State::kCompleted);
  EXPECT_EQ(rec.attempts, 2);
  auto attempts = journal_->Attempts("r-oom");
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 2u);
  EXPECT_NE((*attempts)[0].error.find("kv"), std::string::npos);
}

// An embedding takes the simple admission path (no KV to choose by): an
// allocation failure on the primary moves it to the fallback too. It was
// sent to the primary again each time (the path read neither the placements
// that failed it nor the breakers) and failed after three tries.
TEST_F(LifecycleTest, AnEmbeddingThatFailsOnThePrimaryIsServedByTheFallback) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("compute buffer alloc failed").WithPhase(FailurePhase::kCompute));
  };
  auto ex = Send("/v1/embeddings", json{{"model", "chat"}, {"input", "hello"}}.dump(), "POST", {{"X-Request-Id", "r-emb"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(primary_.calls(), 1u);
  EXPECT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(Journaled("r-emb").state, journal::State::kCompleted);
}

// A route asked with a method it does not take is a 405 naming those it
// takes (RFC 9110; Ollama's router answers so), in each API's error shape; a
// HEAD is answered as its GET; an unknown path stays a 404.
TEST_F(LifecycleTest, ARouteAskedWithAMethodItDoesNotTakeIsA405ThatNamesTheMethods) {
  struct Case {
    const char* method;
    const char* target;
    const char* allow;
  };
  for (const Case& c : {Case{"GET", "/v1/chat/completions", "POST"}, Case{"GET", "/api/chat", "POST"},
                        Case{"PUT", "/api/show", "POST"}, Case{"POST", "/api/tags", "GET, HEAD"},
                        Case{"POST", "/v1/models", "GET, HEAD"}, Case{"PUT", "/v1/requests/abc", "GET, HEAD, DELETE"},
                        Case{"POST", "/v1/events", "GET"}, Case{"DELETE", "/healthz", "GET, HEAD"},
                        Case{"POST", "/readyz", "GET, HEAD"}}) {
    auto ex = Send(c.target, "", c.method);
    ASSERT_TRUE(ex->Wait()) << c.target;
    EXPECT_EQ(ex->status(), 405u) << c.method << " " << c.target;
    EXPECT_EQ(ex->header("Allow"), c.allow) << c.target;
    const json body = json::parse(ex->body(), nullptr, false);
    const bool ollama = std::string(c.target).rfind("/api/", 0) == 0;
    const json message = ollama ? body.value("error", json()) : body.value("error", json::object()).value("message", json());
    ASSERT_TRUE(message.is_string()) << ex->body();
    EXPECT_NE(message.get<std::string>().find(std::string(c.method) + " is not allowed on"), std::string::npos) << ex->body();
  }
  for (const char* target : {"/api/version", "/api/tags", "/v1/models", "/", "/healthz"}) {
    auto head = Send(target, "", "HEAD");
    ASSERT_TRUE(head->Wait());
    EXPECT_EQ(head->status(), 200u) << "HEAD " << target;
  }
  auto nowhere = Send("/v1/nowhere", "", "GET");
  ASSERT_TRUE(nowhere->Wait());
  EXPECT_EQ(nowhere->status(), 404u);
}

// X-Request-Timeout is decimal seconds: strtod also took "0x10" (16 s),
// "1e3" and "inf" (refused later as past a day, by luck).
TEST_F(LifecycleTest, XRequestTimeoutIsDecimalSeconds) {
  for (const char* bad : {"0x10", "1e3", "inf", "nan", ".", "1.2.3", "-1", "0", "5s"}) {
    auto ex = Complete(std::string("r-timeout-bad"), false, {{"X-Request-Timeout", bad}});
    ASSERT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 400u) << "'" << bad << "': " << ex->body();
  }
  for (const char* good : {"5", "2.5", "0.3", "86400"}) {
    auto ex = Complete(std::string("r-timeout-") + good, false, {{"X-Request-Timeout", good}});
    ASSERT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 200u) << good << ": " << ex->body();
  }
}

// A header that names the request, sent twice, is a 400: which one counts
// was anyone's guess (the first was taken, the second ignored in silence).
TEST_F(LifecycleTest, AHeaderThatNamesTheRequestSentTwiceIsRefused) {
  for (const char* name : {"X-Request-Id", "Idempotency-Key", "X-Request-Timeout"}) {
    http::Request req{bhttp::verb::post, "/v1/completions", 11};
    req.set(bhttp::field::host, "127.0.0.1");
    req.insert(name, "5");
    req.insert(name, "6");
    req.body() = json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump();
    req.prepare_payload();
    auto ex = std::make_shared<RecordingExchange>();
    ex->peer = peer_;
    gateway_->Handle(std::move(req), ex);
    ASSERT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 400u) << name << ": " << ex->body();
    EXPECT_NE(ex->body().find("sent more than once"), std::string::npos) << ex->body();
  }
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
}

// An Ollama embedding of many inputs (an answer of megabytes) is translated
// whole, off the connection's I/O thread (its parse and dump held every
// other connection on that thread for as long).
TEST_F(LifecycleTest, ALargeOllamaEmbeddingIsTranslatedWhole) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    json data = json::array();
    for (int i = 0; i < 40; ++i) {
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::vector<double>(1024, 0.123456789 + i)}});
    }
    json answer = {{"object", "list"}, {"data", data}, {"usage", {{"prompt_tokens", 40}, {"total_tokens", 40}}}};
    ex->Respond(http::MakeResponse(200, answer.dump(), "application/json"));
  };
  auto ex = Send("/api/embed", json{{"model", "chat"}, {"input", std::vector<std::string>(40, "hello")}}.dump());
  ASSERT_TRUE(ex->Wait());
  ASSERT_EQ(ex->status(), 200u) << ex->body().substr(0, 300);
  const json j = json::parse(ex->body(), nullptr, false);
  ASSERT_TRUE(j.is_object()) << ex->body().substr(0, 300);
  ASSERT_EQ(j["embeddings"].size(), 40u);
  EXPECT_EQ(j["embeddings"][39].size(), 1024u);
  EXPECT_DOUBLE_EQ(j["embeddings"][39][0].get<double>(), 39.123456789);
  EXPECT_EQ(ex->header("Content-Type"), "application/json");
}

// A worker that crashed and was started again serves the next request: its
// placement's breaker, opened by the crash for 30 s, lets a probe through
// once the new process is ready. Requests went to the fallback for 30 s
// (and, with no fallback, waited 30 s for a worker that was ready).
TEST_F(LifecycleTest, ARestartedWorkerIsProbedWithoutWaitingOutItsEjection) {
  workers_.Exit("chat.0", "signal 9");
  EXPECT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["state"], "open");
  clock_.Advance(700);  // its backoff, its load
  workers_.SetReadyAgain("chat.0", primary_.server.port());
  gateway_->WorkerReady("chat.0");  // (as the supervisor's ready callback does)
  auto ex = Complete("r-after-restart");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(primary_.calls(), 1u) << "went to the fallback: " << ex->header("X-Spillway-Placement");
  EXPECT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["state"], "closed") << "the probe closed it";
}

// A half-open primary takes one request, its probe, at a time: the next one
// goes to the fallback instead of to a device that may still fail. The probe
// closes the breaker with its answer, or a stream with its first event.
// Every request that came in once the ejection ended went to the primary.
TEST_F(LifecycleTest, AHalfOpenPrimaryTakesOneProbeAndItsAnswerClosesIt) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  KilledAndBack("chat.0", primary_.server.port());
  auto probe = Complete("r-probe");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  EXPECT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["probe"], "r-probe");
  auto next = Complete("r-next");
  ASSERT_TRUE(next->Wait());
  EXPECT_EQ(next->status(), 200u) << next->body();
  EXPECT_NE(next->header("X-Spillway-Placement").rfind("sim:0", 0), 0u) << "went to the half-open primary beside its probe";
  EXPECT_EQ(primary_.calls(), 1u);
  Answer(primary_.TakeHeld(0), "primary");
  ASSERT_TRUE(probe->Wait());
  EXPECT_EQ(probe->status(), 200u);
  EXPECT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["state"], "closed") << "the probe closed it";

  // Crashed again: a second ejection (60 s), then a streamed probe whose
  // first event closes it while the stream goes on.
  workers_.Exit("chat.0", "signal 9");
  clock_.Advance(60'000);
  workers_.SetReadyAgain("chat.0", primary_.server.port());
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    primary_.Hold(req, std::move(ex));
  };
  auto stream = Complete("r-stream", /*stream=*/true);
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; }));
  ASSERT_TRUE(Eventually([&] { return StatusNow()["services"][0]["placements"][0]["breaker"]["state"] == "closed"; }))
      << "its first event closed it";
  auto beside = Complete("r-beside", /*stream=*/true);
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 3; })) << "the next one goes beside the stream";
}

// A stream cut midway and continued on a half-open placement probes it: the
// continuation's first event there closes its breaker, as a new stream's
// would (it held the breaker until its end, or 5 s, the next requests sent
// elsewhere meanwhile).
TEST_F(LifecycleTest, AStreamContinuedOnAHalfOpenPlacementClosesItAtItsFirstEventThere) {
  KilledAndBack("chat.1", fallback_.server.port());
  primary_.behaviour = CutStream({{"a", 11}});
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("b", 12));
    fallback_.Hold(req, std::move(ex));
  };
  auto stream = Complete("r-continued", /*stream=*/true);
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto fallback_breaker = [&] { return StatusNow()["services"][0]["placements"][1]["breaker"]; };
  ASSERT_TRUE(Eventually([&] { return fallback_breaker()["state"] == "closed"; }, std::chrono::seconds(3)))
      << "the continuation's first event on it did not close it: " << fallback_breaker().dump();
  EXPECT_FALSE(stream->Wait(std::chrono::milliseconds(0))) << "while the stream goes on";
  auto held = fallback_.TakeHeld(0);
  ASSERT_TRUE(held);
  held->Write(api::kSseDone);
  held->End();
  ASSERT_TRUE(stream->Wait());
  EXPECT_NE(stream->body().find("\"b\""), std::string::npos) << stream->body();
}

// Embeddings sent to the CPU fallback keep to the CPU path's line: one at a
// time there (cpu_path.concurrency = 1), though its worker has two slots;
// the next starts when the first ends. They all went at once before.
TEST_F(LifecycleTest, EmbeddingsOnTheCpuPathKeepToItsLine) {
  OnlyTheHoldingCpuFallback();
  auto first = Embed("e-1");
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto second = Embed("e-2");
  ASSERT_TRUE(Eventually([&] { return CpuLine()["waiting"] == 1; })) << CpuLine().dump();
  EXPECT_EQ(fallback_.calls(), 1u) << "the second went past the CPU path's line";
  EXPECT_EQ(CpuLine()["running"], 1);
  auto held = fallback_.TakeHeld(0);
  ASSERT_TRUE(held);
  Answer(held, "one");
  ASSERT_TRUE(first->Wait());
  EXPECT_EQ(first->status(), 200u);
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 2; })) << "the second never started";
  Answer(fallback_.TakeHeld(1), "two");
  ASSERT_TRUE(second->Wait());
  EXPECT_EQ(second->status(), 200u) << second->body();
  EXPECT_EQ(CpuLine()["running"], 0) << "its place was given back";
}

// A request the CPU worker answered "busy" (its slot not yet free) keeps its
// turn in the CPU path's line: it left the line and joined again at its end,
// behind those that came after it (refused with 503 when the line was full).
TEST_F(LifecycleTest, ARequestTheCpuWorkerFoundBusyKeepsItsTurn) {
  OnlyTheHoldingCpuFallback();
  auto first = Complete("r-first");
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto second = Complete("r-second");
  ASSERT_TRUE(Eventually([&] { return CpuLine()["waiting"] == 1; })) << CpuLine().dump();
  Refuse(fallback_.TakeHeld(0), Status::ResourceExhausted("every slot is taken"));  // busy: nothing ran
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 2; }));
  EXPECT_EQ(fallback_.ids[1], "r-first") << "the one behind it went first";
  EXPECT_EQ(CpuLine()["waiting"], 1) << CpuLine().dump();
  Answer(fallback_.TakeHeld(1), "one");
  ASSERT_TRUE(first->Wait());
  EXPECT_EQ(first->status(), 200u) << first->body();
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 3; }));
  Answer(fallback_.TakeHeld(2), "two");
  ASSERT_TRUE(second->Wait());
  EXPECT_EQ(second->status(), 200u) << second->body();
}

// A cold start of a service whose placements are all on demand starts the
// accelerator's to count the prompt, not the CPU fallback beside it (the CPU
// path's gate starts that one when a request goes there, within its RAM
// budget): both loaded, the fallback's gigabytes from the same disk.
// A service whose workers' first start is due (not spawned yet, never
// ready) is loading, not unavailable: the first view of every start said
// "unavailable", and the gateway logged "recovered: served by its primary
// placement again" once it loaded, with no outage before. Once a start has
// failed, it is unavailable.
TEST_F(LifecycleTest, AServiceWhoseFirstStartIsDueIsLoading) {
  for (const char* key : {"chat.0", "chat.1"}) {
    workers_.Exit(key, "");
    workers_.SetView(testing::ViewOf(key, upstream::WorkerState::kStopped, 0));  // (never ready, nothing exited)
  }
  EXPECT_EQ(StatusNow()["services"][0].value("state", ""), "loading");
  for (const char* key : {"chat.0", "chat.1"}) {
    auto v = testing::ViewOf(key, upstream::WorkerState::kBackoff, 0);
    v.last_exit = "exit 1";
    workers_.SetView(v);
  }
  EXPECT_EQ(StatusNow()["services"][0].value("state", ""), "unavailable");
}

TEST_F(LifecycleTest, AColdStartLoadsTheAcceleratorNotTheCpuFallbackBesideIt) {
  for (const char* key : {"chat.0", "chat.1"}) {
    workers_.SetOnDemand(key);
    workers_.Release(key);
  }
  auto ex = Complete("r-cold");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("chat.0") > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(workers_.demanded("chat.1"), 0) << "the CPU fallback was loaded beside it";
  workers_.SetReady("chat.0", primary_.server.port());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_NE(ex->body().find("primary"), std::string::npos) << ex->body();
}

// The CPU fallback's replica counts against the CPU path's RAM budget while
// it will hold its bytes (in backoff: asked to start, or restarting) and
// while its process still exits: counted as nothing, a second replica was
// let load beside it past the budget.
class CpuReplicaBytesLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    admissions_["chat.1"] = PlacementAdmission{true, "cpu", 64u << 20, 0, ""};
    LifecycleTest::SetUp();
  }
};

TEST_F(CpuReplicaBytesLifecycleTest, AReplicaAboutToLoadOrStillExitingCountsAgainstTheBudget) {
  upstream::WorkerView v;
  v.key = "chat.1";
  v.state = upstream::WorkerState::kBackoff;
  workers_.SetView(v);
  EXPECT_EQ(CpuLine()["ram_resident_bytes"], 64u << 20) << "in backoff";
  v.state = upstream::WorkerState::kStopped;
  v.pid = 4242;
  v.rss_bytes = 80u << 20;
  workers_.SetView(v);
  EXPECT_EQ(CpuLine()["ram_resident_bytes"], 80u << 20) << "exiting, its resident set larger";
  v.pid = 0;
  workers_.SetView(v);
  EXPECT_EQ(CpuLine()["ram_resident_bytes"], 0u) << "gone";
}

// An embedding's place in the CPU path's line is bounded by max_queue and
// its deadline, as a generation's is, not by the 60 s other waits are
// capped at: one behind a long batch got 503 at 60 s.
TEST_F(LifecycleTest, AnEmbeddingWaitsInTheCpuLinePastSixtySeconds) {
  OnlyTheHoldingCpuFallback();
  auto first = Embed("e-long");
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto second = Embed("e-behind");
  ASSERT_TRUE(ToldWhyItWaits("e-behind"));
  for (int i = 0; i < 4; ++i) {  // 80 s behind the first, looked at again as time passes
    clock_.Advance(20'000);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_FALSE(second->done()) << "refused while waiting its turn: " << second->body();
  // The next joins the CPU path's line behind it: the one waiting there
  // left the service's line. It held its head, every later request behind
  // it there, out of the CPU path's line (and its max_queue), refused when
  // the service's line stood still for 60 s.
  auto third = Embed("e-third");
  ASSERT_TRUE(Eventually([&] { return CpuLine()["waiting"] == 2; })) << CpuLine().dump();
  Answer(fallback_.TakeHeld(0), "one");
  ASSERT_TRUE(first->Wait());
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 2; })) << "the second never started: " << second->received();
  EXPECT_EQ(fallback_.ids[1], "e-behind") << "in turn";
  Answer(fallback_.TakeHeld(1), "two");
  ASSERT_TRUE(second->Wait());
  EXPECT_EQ(second->status(), 200u) << second->body();
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 3; }));
  Answer(fallback_.TakeHeld(2), "three");
  ASSERT_TRUE(third->Wait());
  EXPECT_EQ(third->status(), 200u) << third->body();
}

// The CPU path's line is bounded for new requests, not for the gateway's
// own failovers: a request whose attempt on the accelerator failed joins the
// line's end when max_queue are waiting already (the proving suite's
// cancel_in_cpu_queue, seed 7: such requests ended 503 "the CPU path is
// full" after their attempt). A new request is refused as before.
class FullCpuLineLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = std::string(kConfig);
    config_text_.replace(config_text_.find("host_headroom_mib = 0\n"), 22, "host_headroom_mib = 0\nmax_queue = 1\n");
    LifecycleTest::SetUp();
  }
};

TEST_F(FullCpuLineLifecycleTest, AFailoverJoinsAFullCpuLineANewRequestDoesNot) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv));
  };
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
  auto first = Complete("r-1");
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto second = Complete("r-2");
  ASSERT_TRUE(Eventually([&] { return CpuLine()["waiting"] == 1; })) << CpuLine().dump();
  // The line is full (max_queue 1). A third fails on the accelerator (its
  // breaker opens with it) and goes to the CPU path all the same.
  auto third = Complete("r-3");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 3; }));
  ASSERT_TRUE(Eventually([&] { return CpuLine()["waiting"] == 2 || third->done(); })) << CpuLine().dump();
  EXPECT_FALSE(third->done()) << "a failover refused for the CPU path's line: " << third->body();
  // A new request (the accelerator's breaker open now: it goes to the CPU path first) is refused.
  auto fourth = Complete("r-4");
  ASSERT_TRUE(fourth->Wait());
  EXPECT_EQ(fourth->status(), 503u) << fourth->body();
  EXPECT_NE(fourth->body().find("full"), std::string::npos) << fourth->body();
  EXPECT_EQ(primary_.calls(), 3u) << "a new request went to the ejected accelerator";
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(Eventually([&] { return fallback_.calls() == i + 1; })) << "call " << i << " never came";
    Answer(fallback_.TakeHeld(i), "cpu " + std::to_string(i));
  }
  for (auto* ex : {&first, &second, &third}) {
    ASSERT_TRUE((*ex)->Wait());
    EXPECT_EQ((*ex)->status(), 200u) << (*ex)->body();
  }
  EXPECT_EQ(Journaled("r-3").state, journal::State::kCompleted);
  EXPECT_EQ(Journaled("r-3").attempts, 2);
}

// A continued stream's stored served-by record names the placement that
// finished it, and keeps what the first one left out of the chat (its
// dropped messages: the continuation's own served-by does not carry them).
TEST(ReplyWriterTest, AContinuationsServedByRecordKeepsTheDroppedMessages) {
  ReplyWriter reply(nullptr, "r-1", 11);
  ServedBy first;
  first.placement = "sim:0/99";
  first.dropped_messages = "3";
  reply.BeginStream(first, "primary");
  reply.Event("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
  ServedBy then;
  then.placement = "cpu";
  then.limits = "max_tokens=4 (CPU path)";
  then.degraded = "served by cpu (fallback)";
  reply.ContinuedOn(then);
  const auto served = ReplyWriter::StoredServedBy(reply.stored());
  ASSERT_TRUE(served) << reply.stored();
  EXPECT_EQ(served->placement, "cpu");
  EXPECT_EQ(served->limits, then.limits);
  EXPECT_EQ(served->dropped_messages, "3") << reply.stored();
  EXPECT_EQ(reply.stored().find(": spillway-served", 1), std::string::npos) << "two records: " << reply.stored();
  EXPECT_NE(reply.stored().find("\"a\""), std::string::npos) << "the events kept";
}

TEST_F(LifecycleTest, AStreamCutMidwayIsContinuedElsewhereAsOneStream) {
  primary_.behaviour = CutStream({{"a", 11}, {"b", 12}});
  fallback_.behaviour = [](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const json b = json::parse(req.body());
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("after " + std::to_string(b["spillway_resume"]["tokens"].size()), 13));
    ex->Write(api::kSseDone);
    ex->End();
  };
  auto ex = Complete("r-cut", true);
  ASSERT_TRUE(ex->Wait());
  EXPECT_TRUE(ex->streamed());
  const std::string body = ex->body();
  EXPECT_NE(body.find("\"a\""), std::string::npos);
  EXPECT_NE(body.find("after 2"), std::string::npos) << body;
  EXPECT_EQ(body.find("compute"), std::string::npos) << "the cut attempt's error is not the client's";
  EXPECT_EQ(fallback_.bodies[0]["spillway_resume"]["tokens"], json({11, 12}));
  const auto rec = Journaled("r-cut");
  EXPECT_EQ(rec.state, journal::State::kCompleted);
  // The live comments are not part of the stored answer; its served-by record (the placement that finished it) is.
  EXPECT_EQ(rec.result_body.find(": spillway: "), std::string::npos) << "comments are not part of the stored answer";
  const auto served = ReplyWriter::StoredServedBy(rec.result_body);
  ASSERT_TRUE(served) << rec.result_body;
  EXPECT_EQ(served->placement, "cpu");
}

// A stream that waited long enough to start early (its head and wait
// comments out) and that its worker then refused as invalid (400: it did
// not run) leaves its Idempotency-Key free, as one refused before its head
// does: the corrected request under the key runs (it heard "used with a
// different body", 422, and had to draw a new key).
TEST_F(LifecycleTest, AnEarlyStreamItsWorkerRefusedAsInvalidLeavesItsKeyFree) {
  auto running = TakeEveryPlace("e-");
  ASSERT_EQ(running.size(), 3u);
  auto early = Complete("r-early", true, {{"Idempotency-Key", "k-early"}});
  ASSERT_TRUE(ToldWhyItWaits("r-early"));
  clock_.Advance(5000);  // past wait_comment_s: its next note (at most 2 s on) starts the stream
  ASSERT_TRUE(Eventually([&] { return early->streamed(); })) << "the stream did not start early";
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::InvalidArgument("logit_bias names token 999999"));
  };
  Answer(primary_.TakeHeld(0), "one");
  ASSERT_TRUE(early->Wait());
  EXPECT_NE(early->body().find("999999"), std::string::npos) << early->body();
  EXPECT_EQ(Journaled("r-early").state, journal::State::kFailed);
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "corrected"); };
  auto again = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello again"}, {"max_tokens", 8}}.dump(),
                    "POST", {{"Idempotency-Key", "k-early"}, {"X-Request-Id", "r-corrected"}});
  ASSERT_TRUE(again->Wait());
  EXPECT_EQ(again->status(), 200u) << again->body();
  EXPECT_NE(again->body().find("corrected"), std::string::npos) << again->body();
  Answer(primary_.TakeHeld(1), "two");
  Answer(fallback_.TakeHeld(0), "three");
  for (auto& r : running) EXPECT_TRUE(r->Wait());
}

// A worker gone after its answer's last chunk (its finish_reason) but before
// [DONE]: the client has the whole answer. It is completed, with the [DONE]
// the worker did not send, not continued elsewhere (a continuation replayed
// the end: a second finish_reason; ended for its length, an error after a
// whole answer).
TEST_F(LifecycleTest, AStreamCutAfterItsFinishIsCompletedNotContinued) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "stop"}}}}}));
    ex->Abort();
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "stop"}}}}}));
    ex->Write(api::kSseDone);
    ex->End();
  };
  auto ex = Complete("r-finished", true);
  ASSERT_TRUE(ex->Wait());
  const std::string body = ex->body();
  size_t finishes = 0;
  for (size_t at = body.find("\"finish_reason\":\"stop\""); at != std::string::npos;
       at = body.find("\"finish_reason\":\"stop\"", at + 1)) {
    ++finishes;
  }
  EXPECT_EQ(finishes, 1u) << body;
  EXPECT_EQ(fallback_.calls(), 0u) << "continued after its end";
  ASSERT_GE(body.size(), std::string(api::kSseDone).size());
  EXPECT_EQ(body.substr(body.size() - std::string(api::kSseDone).size()), api::kSseDone) << body;
  EXPECT_EQ(Journaled("r-finished").state, journal::State::kCompleted);
}

// A chat whose oldest messages its counting worker left out ("truncate"):
// every placement is told to leave out as many (the prompt admission
// counted), a continuation too, and the client hears how many.
TEST_F(LifecycleTest, AChatsLeftOutMessagesArePinnedForEveryPlacementItRunsOn) {
  primary_.drops = 4;
  fallback_.drops = 6;  // (a smaller context would leave out more)
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    auto head = http::MakeResponse(200, "", "text/event-stream");
    head.set(std::string(protocol::kDroppedMessagesHeader), "4");
    ex->StartStream(std::move(head));
    ex->Write(Chunk("a", 11));
    ex->Write(api::SseEvent(api::ErrorBody(Status::ResourceExhausted("compute").WithPhase(FailurePhase::kCompute))));
    ex->End();
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("b", 12));
    ex->Write(api::kSseDone);
    ex->End();
  };
  json messages = json::array();
  for (int i = 0; i < 4; ++i) {
    messages.push_back({{"role", "user"}, {"content", "q" + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", "a" + std::to_string(i)}});
  }
  messages.push_back({{"role", "user"}, {"content", "last"}});
  auto ex = Send("/v1/chat/completions",
                 json{{"model", "chat"}, {"messages", messages}, {"truncate", true}, {"max_tokens", 8}, {"stream", true},
                      {"spillway_drop_messages", 1}}.dump(),
                 "POST", {{"X-Request-Id", "r-pinned"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("\"b\""), std::string::npos) << ex->body();
  EXPECT_EQ(primary_.tokenizes + fallback_.tokenizes, 1);
  const int counted = primary_.tokenizes ? 4 : 6;
  ASSERT_EQ(primary_.calls(), 1u);
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(primary_.bodies[0]["spillway_drop_messages"], counted) << "the client's own is dropped; the count's is pinned";
  EXPECT_EQ(fallback_.bodies[0]["spillway_drop_messages"], counted);
  EXPECT_EQ(ex->header("X-Spillway-Dropped-Messages"), "4") << "as the worker that began the stream said";
  const auto& counter = primary_.tokenizes ? primary_ : fallback_;
  ASSERT_EQ(counter.tokenize_targets.size(), 1u);
  EXPECT_NE(counter.tokenize_targets[0].find("fit_cells=128"), std::string::npos)
      << counter.tokenize_targets[0] << ": cut for the largest placement of the model (256 cells over 2 slots)";
  EXPECT_FALSE(Journaled("r-pinned").body.find("spillway_drop_messages") != std::string::npos)
      << "the journal keeps the request as its client sent it, less internal fields";
}

// A fallback declared as a different model reads its own prompt: the count
// (and what it left out) is the primary's model's, not pinned on it.
class DifferentModelLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = std::string(kConfig) + "model = \"/nonexistent/small.gguf\"\ndifferent_model = true\n";
    LifecycleTest::SetUp();
  }
};

TEST_F(DifferentModelLifecycleTest, APinIsForThePlacementsOfTheModelThatCounted) {
  primary_.drops = 4;
  fallback_.drops = 6;
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "small"); };
  const json messages = {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}},
                         {{"role", "user"}, {"content", "last"}}};
  auto ex = Send("/v1/chat/completions",
                 json{{"model", "chat"}, {"messages", messages}, {"truncate", true}, {"max_tokens", 8}}.dump(), "POST",
                 {{"X-Request-Id", "r-other-model"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  ASSERT_EQ(primary_.tokenizes.load(), 1) << "the primary is the first to count";
  ASSERT_GE(primary_.calls(), 1u);
  ASSERT_GE(fallback_.calls(), 1u);
  EXPECT_EQ(primary_.bodies[0]["spillway_drop_messages"], 4);
  EXPECT_FALSE(fallback_.bodies[0].contains("spillway_drop_messages")) << fallback_.bodies[0].dump();
}

// A stream cut on the primary goes on only with the primary's model: with a
// different-model fallback beside it, the primary is waited for while it
// comes back and the stream goes on there. (The fallback counted as usable
// while the primary's breaker was open: the stream was ended resumable at once,
// where the same service without that fallback waited and went on.)
TEST_F(DifferentModelLifecycleTest, AStreamCutOnThePrimaryGoesOnThereOnceItIsBack) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  primary_.behaviour = [calls](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    if ((*calls)++ == 0) {
      ex->Write(Chunk("a", 11));
      ex->Abort();  // its worker gone mid-stream
      return;
    }
    ex->Write(Chunk("b", 12));
    ex->Write(api::kSseDone);
    ex->End();
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "small"); };
  auto ex = Complete("r-cut-primary", true);
  ASSERT_TRUE(ex->WaitFor("\"a\""));
  ASSERT_TRUE(Eventually([&] { return Journaled("r-cut-primary").state == journal::State::kQueued || ex->done(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (admission's first round decided)
  EXPECT_FALSE(ex->done()) << "ended while its primary comes back: " << ex->body();
  KilledAndBack("chat.0", primary_.server.port());
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("\"b\""), std::string::npos) << ex->body();
  EXPECT_EQ(fallback_.calls(), 0u) << "another model's worker was sent a continuation";
  EXPECT_EQ(Journaled("r-cut-primary").state, journal::State::kCompleted);
}

// ... and for a primary that does not come back (restarting, its start
// allowed ten minutes) it waits out the start bound (60 s), the fallback's
// line moving meanwhile, then ends resumable with its checkpoint: neither at
// once nor for as long as the primary's start could take.
TEST_F(DifferentModelLifecycleTest, AStreamCutOnAPrimaryThatStaysDownEndsResumableAtTheStartBound) {
  primary_.behaviour = [this](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    workers_.SetStarting("chat.0", clock_.NowMs(), 600'000);  // restarting
    ex->Abort();  // its worker gone mid-stream
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "small"); };
  const int64_t t0 = clock_.NowMs();
  auto ex = Complete("r-cut-gone", true);
  ASSERT_TRUE(ex->WaitFor("\"a\""));
  ASSERT_TRUE(Eventually([&] { return Journaled("r-cut-gone").state == journal::State::kQueued || ex->done(); }));
  // The line moves: every 10 s another request is served by the fallback.
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (its round at this time decided)
    ASSERT_FALSE(ex->done()) << "ended " << (clock_.NowMs() - t0) / 1000 << " s after its cut: " << ex->body();
    clock_.Advance(10'000);
    auto other = Complete("r-other-" + std::to_string(i));
    ASSERT_TRUE(other->Wait());
    EXPECT_EQ(other->status(), 200u) << other->body();
  }
  ASSERT_TRUE(ex->Wait()) << "still waiting 60 s on: " << ex->body();
  EXPECT_EQ(primary_.calls(), 1u);
  EXPECT_EQ(fallback_.calls(), 6u) << "another model's worker was sent a continuation";
  EXPECT_NE(ex->body().find("\"checkpoint\""), std::string::npos) << ex->body();
  EXPECT_EQ(Journaled("r-cut-gone").state, journal::State::kFailedResumable);
}

// ... and for a primary whose starts keep failing (twice: no hope), it
// ends at once with that reason, resumable: another model's worker being
// ready gave it hope it could not use, and it waited out the start bound
// saying nothing of why.
TEST_F(DifferentModelLifecycleTest, AStreamCutOnAPrimaryThatCannotStartEndsWithWhy) {
  primary_.behaviour = [this](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    upstream::WorkerView v;
    v.key = "chat.0";
    v.state = upstream::WorkerState::kBackoff;
    v.failed_starts = 2;
    v.last_exit = "exit 1";
    v.last_error = "cannot allocate the model's weights";
    v.next_start_ms = clock_.NowMs() + 30'000;
    workers_.SetStarting("chat.0", clock_.NowMs());  // (its port gone)
    workers_.SetView(v);  // its restarts fail
    ex->Abort();  // its worker gone mid-stream
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "small"); };
  auto ex = Complete("r-cut-failing", true);
  ASSERT_TRUE(ex->WaitFor("\"a\""));
  ASSERT_TRUE(ex->Wait()) << "still waiting on a primary that cannot start: " << ex->body();
  EXPECT_NE(ex->body().find("failed to start 2 times"), std::string::npos) << ex->body();
  EXPECT_NE(ex->body().find("\"checkpoint\""), std::string::npos) << ex->body();
  EXPECT_EQ(fallback_.calls(), 0u) << "another model's worker was sent a continuation";
  EXPECT_EQ(Journaled("r-cut-failing").state, journal::State::kFailedResumable);
}

// What one request may hold, as /api/ps (Ollama's context_length) and the
// dashboard's limits say it: an embedding model's input takes its worker's
// whole pool (embeddings run one at a time), within its trained positions,
// not its slot's share (they said 512 where the worker took 1024).
class EmbedModelLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    const char* models = std::getenv("SPILLWAY_MODELS");
    config_text_ = kConfig;
    const std::string model = "model = \"/nonexistent/chat.gguf\"";
    config_text_.replace(config_text_.find(model), model.size(),
                         "model = \"" + std::string(models ? models : "build/models") + "/tiny-embed.gguf\"");
    const std::string ctx = "device = \"sim:0\"\nctx = 256";
    config_text_.replace(config_text_.find(ctx), ctx.size(), "device = \"sim:0\"\nctx = 1024");
    LifecycleTest::SetUp();
  }
};

TEST_F(EmbedModelLifecycleTest, AnEmbeddingsContextPerRequestIsItsWorkersWholePool) {
  auto ps = Send("/api/ps", "", "GET");
  ASSERT_TRUE(ps->Wait());
  const json models = json::parse(ps->body(), nullptr, false).value("models", json::array());
  ASSERT_EQ(models.size(), 1u) << ps->body();
  EXPECT_EQ(models[0]["context_length"], 1024) << "ctx 1024 in 2 slots, trained on 2048";
  const json view = StatusNow()["services"][0];
  EXPECT_NE(view.dump().find("1024 tokens of context per request"), std::string::npos) << view.dump();
}

// A chat is cut for its primary's context (the first admitted placement of
// the model), not for a larger CPU fallback's: that one would take every
// long chat from the accelerator.
class LargerFallbackLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = kConfig;
    const std::string cpu = "device = \"cpu\"\nctx = 256";
    config_text_.replace(config_text_.find(cpu), cpu.size(), "device = \"cpu\"\nctx = 1024");
    LifecycleTest::SetUp();
  }
};

TEST_F(LargerFallbackLifecycleTest, AChatIsCutForItsPrimarysContext) {
  primary_.drops = 2;
  const json messages = {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}},
                         {{"role", "user"}, {"content", "last"}}};
  auto ex = Send("/v1/chat/completions",
                 json{{"model", "chat"}, {"messages", messages}, {"truncate", true}, {"max_tokens", 8}}.dump(), "POST",
                 {{"X-Request-Id", "r-cut-for-primary"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  ASSERT_EQ(primary_.tokenize_targets.size(), 1u);
  const std::string& target = primary_.tokenize_targets[0];
  EXPECT_EQ(target.substr(target.size() - 14), "&fit_cells=128") << target;
  ASSERT_EQ(primary_.calls(), 1u);
  EXPECT_EQ(primary_.bodies[0]["spillway_drop_messages"], 2);
  // Without "truncate": counted as it is, nothing pinned.
  auto plain = Send("/v1/chat/completions", json{{"model", "chat"}, {"messages", messages}, {"max_tokens", 8}}.dump(),
                    "POST", {{"X-Request-Id", "r-not-cut"}});
  ASSERT_TRUE(plain->Wait());
  ASSERT_EQ(primary_.calls(), 2u);
  EXPECT_FALSE(primary_.bodies[1].contains("spillway_drop_messages"));
}

// A prompt only the larger fallback holds, which that fallback failed (no KV
// cells): the 400 that no placement left can hold it is not OpenAI's
// context_length_exceeded, which tells a client to shorten its conversation
// for good; a prompt no placement could ever hold is.
TEST_F(LargerFallbackLifecycleTest, OnlyAPromptPastEveryContextIsContextLengthExceeded) {
  for (Worker* w : {&primary_, &fallback_}) w->count = [](uint32_t) { return protocol::TokenizeReply{300, 1024, 16, 0}; };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  const std::string body = json{{"model", "chat"}, {"prompt", "long"}, {"max_tokens", 8}}.dump();
  auto failed = Send("/v1/completions", body);
  ASSERT_TRUE(failed->Wait());
  EXPECT_EQ(fallback_.calls(), 1u);
  EXPECT_NE(json::parse(failed->body(), nullptr, false)["error"].value("code", ""), "context_length_exceeded")
      << failed->body();
  for (Worker* w : {&primary_, &fallback_}) w->count = [](uint32_t) { return protocol::TokenizeReply{510, 1024, 16, 0}; };
  auto never = Send("/v1/completions", body);  // 510 + 8 past the largest context: 512 a request
  ASSERT_TRUE(never->Wait());
  EXPECT_EQ(never->status(), 400u) << never->body();
  EXPECT_EQ(json::parse(never->body(), nullptr, false)["error"].value("code", ""), "context_length_exceeded")
      << never->body();
  EXPECT_EQ(fallback_.calls(), 1u);
  // A chat whose last message alone is past every context (no tail fits
  // the primary's, nor, counted again, the larger fallback's): that code.
  for (Worker* w : {&primary_, &fallback_}) w->count = [](uint32_t) { return protocol::TokenizeReply{-1, 1024, 16, 0}; };
  const json messages = {{{"role", "user"}, {"content", "a very long question"}}};
  auto cut = Send("/v1/chat/completions",
                  json{{"model", "chat"}, {"messages", messages}, {"truncate", true}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(cut->Wait());
  EXPECT_EQ(cut->status(), 400u) << cut->body();
  EXPECT_EQ(json::parse(cut->body(), nullptr, false)["error"].value("code", ""), "context_length_exceeded") << cut->body();
}

// A chat whose last message alone is past its primary's context (no tail of
// it fits there) is counted again for the larger fallback's context and
// runs there, as many of its oldest messages left out as that count says.
// It was refused (400) where a placement could hold it.
TEST_F(LargerFallbackLifecycleTest, AChatNoTailOfWhichFitsThePrimaryRunsOnALargerFallback) {
  for (Worker* w : {&primary_, &fallback_}) {
    w->count = [](uint32_t fit) { return fit <= 128 ? protocol::TokenizeReply{-1, 1024, 16, 0} : protocol::TokenizeReply{300, 1024, 16, 1}; };
  }
  const json messages = {{{"role", "user"}, {"content", "old"}},
                         {{"role", "assistant"}, {"content", "a"}},
                         {{"role", "user"}, {"content", "a very long question"}}};
  auto ex = Send("/v1/chat/completions",
                 json{{"model", "chat"}, {"messages", messages}, {"truncate", true}, {"max_tokens", 8}}.dump(), "POST",
                 {{"X-Request-Id", "r-past-the-primary"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(primary_.calls(), 0u);
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.bodies[0]["spillway_drop_messages"], 1) << fallback_.bodies[0].dump();
  ASSERT_EQ(primary_.tokenize_targets.size(), 2u);
  EXPECT_NE(primary_.tokenize_targets[0].find("fit_cells=128"), std::string::npos) << primary_.tokenize_targets[0];
  EXPECT_NE(primary_.tokenize_targets[1].find("fit_cells=512"), std::string::npos) << primary_.tokenize_targets[1];
}

// A chat cut for its primary's context, when the primary cannot take it
// (here it failed the request: no KV cells), is counted again for the
// fallback's smaller context and runs there, more of its oldest messages
// left out: a failover, not a refusal. Primary: 256 cells a request; the
// CPU fallback: 128. The count (as a worker's would): 200 tokens without its
// 2 oldest messages within 256 cells, 100 without its 6 oldest within 128.
class SmallerFallbackLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = kConfig;
    const std::string sim = "device = \"sim:0\"\nctx = 256";
    config_text_.replace(config_text_.find(sim), sim.size(), "device = \"sim:0\"\nctx = 512");
    LifecycleTest::SetUp();
    for (Worker* w : {&primary_, &fallback_}) {
      w->count = [](uint32_t fit) {
        return fit >= 256 ? protocol::TokenizeReply{200, 512, 16, 2} : protocol::TokenizeReply{100, 256, 16, 6};
      };
    }
  }
  std::shared_ptr<RecordingExchange> Chat(const std::string& id, bool truncate, bool stream = false) {
    json messages = json::array();
    for (int i = 0; i < 4; ++i) {
      messages.push_back({{"role", "user"}, {"content", "q" + std::to_string(i)}});
      messages.push_back({{"role", "assistant"}, {"content", "a" + std::to_string(i)}});
    }
    messages.push_back({{"role", "user"}, {"content", "last"}});
    json body = {{"model", "chat"}, {"messages", messages}, {"max_tokens", 8}, {"stream", stream}};
    if (truncate) body["truncate"] = true;
    return Send("/v1/chat/completions", body.dump(), "POST", {{"X-Request-Id", id}});
  }
  std::vector<std::string> FitsAskedFor() {
    std::vector<std::string> fits;
    for (Worker* w : {&primary_, &fallback_}) {
      std::lock_guard<std::mutex> lk(w->mu);
      for (const auto& t : w->tokenize_targets) fits.push_back(t.substr(t.find("fit_cells=") + 10));
    }
    std::sort(fits.begin(), fits.end());
    return fits;
  }
};

TEST_F(SmallerFallbackLifecycleTest, AChatItsPrimaryCannotTakeIsCountedAgainForTheFallback) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  auto ex = Chat("r-recounted", true);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_NE(ex->body().find("fallback"), std::string::npos) << ex->body();
  EXPECT_EQ(FitsAskedFor(), (std::vector<std::string>{"128", "256"}));
  EXPECT_EQ(primary_.tokenizes.load(), 1) << "counted again by the worker that failed it (it may hang)";
  ASSERT_EQ(primary_.calls(), 1u);
  EXPECT_EQ(primary_.bodies[0]["spillway_drop_messages"], 2);
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.bodies[0]["spillway_drop_messages"], 6) << "the fallback reads the prompt counted for it";
  EXPECT_EQ(json::parse(Journaled("r-recounted").decision, nullptr, false).value("prompt_tokens", 0), 100);

  // Without "truncate" nothing is left out: the fallback cannot hold it.
  auto plain = Chat("r-whole", false);
  ASSERT_TRUE(plain->Wait());
  EXPECT_NE(plain->status(), 200u) << plain->body();
  EXPECT_EQ(fallback_.calls(), 1u) << "sent to a fallback whose context cannot hold it";
  EXPECT_EQ(FitsAskedFor().size(), 3u) << "counted again without truncate";
}

// A chat whose count already fits the smaller fallback is not counted again
// (nothing more is left out than its primary's count left out). Two rules
// keep it so: the decision sends it there as counted, and RecountCells
// finds nothing to cut for one that holds it (for a fallback busy now); it
// goes red only without both (a busy fallback is not staged here).
TEST_F(SmallerFallbackLifecycleTest, AChatTheFallbackHoldsAsCountedIsNotCountedAgain) {
  for (Worker* w : {&primary_, &fallback_}) {
    w->count = [](uint32_t fit) {
      return fit >= 256 ? protocol::TokenizeReply{100, 512, 16, 2} : protocol::TokenizeReply{60, 256, 16, 6};
    };
  }
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  auto ex = Chat("r-held-as-counted", true);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(FitsAskedFor(), (std::vector<std::string>{"256"}));
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.bodies[0]["spillway_drop_messages"], 2);
}

// A count again that finds no tail to fit the smaller context (the last
// message alone is too long there) stands no better: the request ends as it
// would have without it (no placement can take it: a 503), not with that
// count's 400, and is not counted again and again.
TEST_F(SmallerFallbackLifecycleTest, ARecountThatFitsNothingLeavesTheRequestAsItWas) {
  for (Worker* w : {&primary_, &fallback_}) {
    w->count = [](uint32_t fit) {
      return fit >= 256 ? protocol::TokenizeReply{200, 512, 16, 2} : protocol::TokenizeReply{-1, 256, 16, 0};
    };
  }
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  auto ex = Chat("r-nothing-fits", true);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  // (What it was decided with: the first count's 200 tokens and max_tokens.)
  EXPECT_NE(ex->body().find("208 cells"), std::string::npos) << ex->body();
  EXPECT_EQ(FitsAskedFor(), (std::vector<std::string>{"128", "256"}));
  EXPECT_EQ(fallback_.calls(), 0u);
}

// A stream whose first events reached its client is continued on the
// prompt it began with, or not at all: never counted again.
TEST_F(SmallerFallbackLifecycleTest, AStreamThatHasBegunIsNeverCountedAgain) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("begun", 21));
    ex->Write(api::SseEvent(api::ErrorBody(Status::ResourceExhausted("compute").WithPhase(FailurePhase::kCompute))));
    ex->End();
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  auto ex = Chat("r-begun", true, true);
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("begun"), std::string::npos) << ex->body();
  EXPECT_EQ(FitsAskedFor(), (std::vector<std::string>{"256"}));
  EXPECT_EQ(fallback_.calls(), 0u) << "continued on another prompt than the one its stream began with";
}

// A stream cut after the first piece of a tool call: an OpenAI client has
// that piece (it may act on it), so the stream is not replayed past it and
// ends resumable; an Ollama client has nothing yet (its translation sends
// tool calls with the last line), so it is continued elsewhere. It ended
// failed, with a checkpoint that said tool calls had been delivered.
TEST_F(LifecycleTest, AStreamCutInsideAToolCallIsContinuedOnlyWhereTheClientHasNoneYet) {
  const std::string piece = api::SseEvent(
      {{"choices", {{{"index", 0}, {"delta", {{"tool_calls", {{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                                               {"function", {{"name", "add"}, {"arguments", "{\"a\":"}}}}}}}}}}},
       {"spillway", {{"tokens", {21}}}}});
  primary_.behaviour = [piece](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(piece);
    ex->Write(api::SseEvent(api::ErrorBody(Status::ResourceExhausted("compute").WithPhase(FailurePhase::kCompute))));
    ex->End();
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"delta", {{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "1}"}}}}}}}}}}},
                             {"spillway", {{"tokens", {22}}}}}));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "tool_calls"}}}}}));
    ex->Write(api::kSseDone);
    ex->End();
  };
  const json messages = {{{"role", "user"}, {"content", "add"}}};
  auto openai = Send("/v1/chat/completions", json{{"model", "chat"}, {"messages", messages}, {"stream", true}}.dump(),
                     "POST", {{"X-Request-Id", "t-openai"}});
  ASSERT_TRUE(openai->Wait());
  EXPECT_EQ(fallback_.calls(), 0u) << "continued past a tool call its client had";
  EXPECT_EQ(Journaled("t-openai").state, journal::State::kFailedResumable);
  EXPECT_NE(openai->body().find("\"tool_calls_delivered\":true"), std::string::npos) << openai->body();

  auto ollama = Send("/api/chat", json{{"model", "chat"}, {"messages", messages}, {"stream", true}}.dump(), "POST",
                     {{"X-Request-Id", "t-ollama"}});
  ASSERT_TRUE(ollama->Wait());
  EXPECT_EQ(fallback_.calls(), 1u) << "not continued: " << ollama->body();
  EXPECT_EQ(Journaled("t-ollama").state, journal::State::kCompleted) << ollama->body();
  EXPECT_EQ(ollama->body().find("\"error\""), std::string::npos) << ollama->body();
  EXPECT_NE(ollama->body().find("\"tool_calls\""), std::string::npos) << ollama->body();
  EXPECT_NE(ollama->body().find("\"a\":1"), std::string::npos) << "the call, whole: " << ollama->body();
}

// A stream continued on the CPU path, whose cpu_path.max_tokens lowers the
// request's, says so: the head that carried X-Spillway-Limits went out with
// the first attempt, and the stream just ended early with "length".
TEST_F(LifecycleTest, AStreamContinuedOnTheCpuPathSaysItsLimits) {
  config_.services[0].cpu_path.max_tokens = 4;  // (read per request)
  primary_.behaviour = CutStream({{"a", 11}, {"b", 12}});
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("c", 13));
    ex->Write(api::kSseDone);
    ex->End();
  };
  auto ex = Complete("r-cut-limits", true);
  ASSERT_TRUE(ex->Wait());
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.bodies[0]["max_tokens"], 4) << fallback_.bodies[0].dump();
  const std::string body = ex->body();
  const size_t note = body.find(": spillway: continued on cpu");
  ASSERT_NE(note, std::string::npos) << body;
  EXPECT_NE(body.find("limits", note), std::string::npos) << body;
  EXPECT_NE(body.find("max_tokens", note), std::string::npos) << body;
  // The stored stream (what its Idempotency-Key replays) says so too: it said nothing of the CPU path.
  const auto served = ReplyWriter::StoredServedBy(Journaled("r-cut-limits").result_body);
  ASSERT_TRUE(served) << Journaled("r-cut-limits").result_body;
  EXPECT_EQ(served->placement, "cpu");
  EXPECT_NE(served->limits.find("max_tokens=4"), std::string::npos) << served->limits;
  EXPECT_FALSE(served->degraded.empty());
}

// A continuation the worker ends with an error of its own (it could not
// reproduce the delivered text) ends the stream resumable, with its
// checkpoint: it was relayed as the request's own error and journaled failed.
TEST_F(LifecycleTest, AContinuationTheWorkerRefusesMidStreamEndsResumable) {
  primary_.behaviour = CutStream({{"a", 11}});
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(api::SseEvent(api::ErrorBody(Status::Unavailable("the continuation is not reproducible"))));
    ex->Write(api::kSseDone);
    ex->End();
  };
  auto ex = Complete("r-refused-mid", true);
  ASSERT_TRUE(ex->Wait());
  const std::string body = ex->body();
  EXPECT_NE(body.find("\"a\""), std::string::npos) << body;
  EXPECT_NE(body.find("checkpoint"), std::string::npos) << body;
  EXPECT_NE(body.find("not reproducible"), std::string::npos) << body;
  EXPECT_EQ(Journaled("r-refused-mid").state, journal::State::kFailedResumable);
}

// A stream cancelled while it runs is journaled with why it ended (the
// worker's cancelled error event): cancelled, as an answer cancelled is, not
// "stream ended with an error" (what `spillway requests show` and the
// dashboard said of every DELETE'd stream).
TEST_F(LifecycleTest, ACancelledStreamIsJournaledAsCancelledNotAsAnError) {
  auto stream = std::make_shared<std::shared_ptr<http::Exchange>>();
  primary_.behaviour = [stream](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    *stream = std::move(ex);  // running until the test ends it
  };
  auto ex = Complete("r-cancel-stream", true);
  ASSERT_TRUE(ex->WaitFor("\"a\""));
  auto cancel = Send("/v1/requests/r-cancel-stream", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(Eventually([&] { return primary_.cancels.load() == 1; }));
  (*stream)->Write(api::SseEvent(api::ErrorBody(Status::Cancelled("request cancelled"))));  // as a worker ends it
  (*stream)->Write(api::kSseDone);
  (*stream)->End();
  stream->reset();
  ASSERT_TRUE(ex->Wait());
  ASSERT_TRUE(Eventually([&] { return Journaled("r-cancel-stream").state == journal::State::kCancelled; }));
  EXPECT_EQ(Journaled("r-cancel-stream").error, "request cancelled");
}

// A refusal relayed from the placement a request failed over to says who
// refused it, as any answer does (invariant 6): it came with no
// X-Spillway-* header at all.
TEST_F(LifecycleTest, ARefusalFromTheFallbackSaysWhereItCameFrom) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("no KV cells").WithPhase(FailurePhase::kKv));
  };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::InvalidArgument("a sampler setting this placement refuses"));
  };
  for (const bool stream : {false, true}) {
    auto ex = Complete(stream ? "r-refused-stream" : "r-refused-there", stream);
    ASSERT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 400u) << ex->body();
    EXPECT_EQ(ex->header("X-Spillway-Placement"), "cpu") << "stream " << stream;
    EXPECT_EQ(ex->header("X-Spillway-Attempts"), "2") << "stream " << stream;
    EXPECT_FALSE(ex->header("X-Spillway-Degraded").empty()) << "stream " << stream;
  }
}

// A stream cancelled while it is continued elsewhere (its fallback answers
// the cancel with 499 before its first event) ends cancelled, as the client
// asked: it was journaled failed_resumable, as if to be resumed.
TEST_F(LifecycleTest, AStreamCancelledWhileItIsContinuedEndsCancelled) {
  primary_.behaviour = CutStream({{"a", 11}});
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-cancel-continued", true);
  ASSERT_TRUE(Eventually([&] { return fallback_.calls() == 1; }));
  auto cancel = Send("/v1/requests/r-cancel-continued", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(ex->Wait());
  EXPECT_NE(ex->body().find("\"a\""), std::string::npos) << ex->body();
  EXPECT_TRUE(Eventually([&] { return Journaled("r-cancel-continued").state == journal::State::kCancelled; }))
      << journal::StateName(Journaled("r-cancel-continued").state);
}

// A stream is continued only on the same model file: a declared different
// fallback model would splice another model's text into the answer. With no
// placement of the same model left, it ends resumable, with its checkpoint.
// Here the primary's device is lost (its breaker opens), so admission has
// only the other model to offer, as in the main failover case: the primary
// is waited for as it would be without that fallback, and once the wait for
// it is over the stream ends.
TEST_F(LifecycleTest, AStreamIsNotContinuedOnADifferentModel) {
  config_.services[0].placements[1].model = "/nonexistent/smaller.gguf";  // read per request
  config_.services[0].placements[1].different_model = true;
  primary_.behaviour = CutStream({{"a", 11}}, Status::Unavailable("device lost").WithPhase(FailurePhase::kDevice));
  auto ex = Complete("r-other-model", true);
  ASSERT_TRUE(ex->WaitFor("\"a\""));
  for (int i = 0; i < 40 && !ex->done(); ++i) {  // past the wait for a primary that comes back
    clock_.Advance(10'000);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ex->Wait());
  const std::string body = ex->body();
  EXPECT_NE(body.find("\"a\""), std::string::npos) << body;
  EXPECT_NE(body.find("checkpoint"), std::string::npos) << body;
  EXPECT_EQ(fallback_.calls(), 0u) << "continued on another model";
  EXPECT_EQ(Journaled("r-other-model").state, journal::State::kFailedResumable);
}

TEST_F(LifecycleTest, AWorkerThatCannotBeReachedIsSuspectedAndTheRequestMovesOn) {
  workers_.SetReady("chat.0", 1);  // nothing listens there
  auto ex = Complete("r-gone");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u);
  EXPECT_NE(ex->body().find("fallback"), std::string::npos);
  EXPECT_EQ(workers_.suspected(), std::vector<std::string>{"chat.0"});
}

TEST_F(LifecycleTest, AWaitingRequestEndsAtItsDeadlineByTheClock) {
  // Every slot is busy: the request waits without being journaled as an attempt per try.
  const Behaviour busy = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("every slot is taken"));
  };
  primary_.behaviour = busy;
  fallback_.behaviour = busy;
  auto ex = Complete("r-late", false, {{"X-Request-Timeout", "30"}});
  ASSERT_TRUE(Eventually([&] { return primary_.calls() + fallback_.calls() >= 3; }));
  EXPECT_FALSE(ex->done());
  clock_.Advance(31'000);  // no real time passes: the clock says the deadline is gone
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 504u);
  const auto rec = Journaled("r-late");
  EXPECT_EQ(rec.state, journal::State::kFailed);
  EXPECT_NE(rec.error.find("X-Request-Timeout"), std::string::npos);
  EXPECT_LE(rec.attempts, 2) << "waiting for a slot is not a new attempt each time";
}

// A request whose workers answer "busy" is sent again every 50 ms or so; its
// prompt is counted once. Each round of admission sent the whole body to a
// worker's /tokenize again (for a long prompt, a worker's preparing thread
// kept busy for the whole wait, and other requests' counts ran out of time).
TEST_F(LifecycleTest, APromptIsCountedOnceHoweverOftenItsWorkersAreBusy) {
  std::atomic<int> sends{0};
  const Behaviour busy_then_answer = [&sends](http::Request&, std::shared_ptr<http::Exchange> ex) {
    if (++sends < 6) return Refuse(ex, Status::ResourceExhausted("every slot is taken"));
    Answer(ex, "at last");
  };
  primary_.behaviour = busy_then_answer;
  fallback_.behaviour = busy_then_answer;
  auto ex = Complete("r-counted");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_GE(sends.load(), 6);
  EXPECT_EQ(primary_.tokenizes + fallback_.tokenizes, 1) << "counted again for each send";
}

// An Ollama request's keep_alive counts from when the model became idle (as
// Ollama's does), not from the request's arrival: a 60 s generation with
// keep_alive 30s left the model unloaded the moment it ended.
TEST_F(LifecycleTest, AnOllamaKeepAliveCountsFromWhenTheModelIsIdle) {
  config_.services[0].residency.mode = "keep_alive";  // (read per request) its GPU placement loads and unloads
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Send("/api/generate", json{{"model", "chat"}, {"prompt", "hi"}, {"stream", false}, {"keep_alive", "30s"}}.dump(),
                 "POST", {{"X-Request-Id", "r-keep"}});
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  clock_.Advance(60'000);  // it generates for 60 s
  std::shared_ptr<http::Exchange> held = primary_.TakeHeld(0);
  ASSERT_TRUE(held);
  Answer(held, "primary");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(ex->header("X-Spillway-Keep-Alive"), "applied: kept loaded until idle for 30 s");
  clock_.Advance(10'000);
  EXPECT_FALSE(workers_.IdleCheck("chat.0")) << "unloaded 10 s into a 30 s keep_alive";
  clock_.Advance(21'000);
  EXPECT_TRUE(workers_.IdleCheck("chat.0")) << "still loaded 31 s idle with keep_alive 30s";
}

// An Ollama load (no prompt) makes the model wanted from now: idle from the
// load, not from the last request's end. Loaded an hour after its last
// request, it was released again at its first idle check once ready.
TEST_F(LifecycleTest, AnOllamaLoadIsIdleFromTheLoadNotFromTheLastRequest) {
  config_.services[0].residency.mode = "keep_alive";  // (read per request) its GPU placement loads and unloads
  auto before = Complete("r-before");
  ASSERT_TRUE(before->Wait());
  ASSERT_EQ(before->status(), 200u) << before->body();
  clock_.Advance(3'600'000);
  ASSERT_TRUE(workers_.IdleCheck("chat.0")) << "still loaded an hour idle";
  workers_.SetReady("chat.0", primary_.server.port());  // loaded again by what follows
  auto load = Send("/api/generate", json{{"model", "chat"}}.dump());
  ASSERT_TRUE(load->Wait());
  ASSERT_EQ(load->status(), 200u) << load->body();
  EXPECT_EQ(json::parse(load->body()).value("done_reason", ""), "load") << load->body();
  EXPECT_FALSE(workers_.IdleCheck("chat.0")) << "released as soon as the load that asked for it was done";
}

// /api/ps says when an on-demand GPU placement unloads: after its
// keep_alive_s idle (it said after the CPU replicas' idle_unload_s), or
// the last Ollama request's keep_alive, or never.
TEST_F(LifecycleTest, OllamaPsSaysWhenAGpuPlacementUnloads) {
  config_.services[0].residency.mode = "keep_alive";
  config_.services[0].residency.keep_alive_s = 120;
  upstream::WorkerView v;
  v.key = "chat.0";
  v.state = upstream::WorkerState::kReady;
  v.port = primary_.server.port();
  v.on_demand = true;
  workers_.SetView(v);
  auto expires = [&] {
    auto ps = Send("/api/ps", "", "GET");
    EXPECT_TRUE(ps->Wait());
    const json j = json::parse(ps->body(), nullptr, false);
    return j.is_object() && !j["models"].empty() ? j["models"][0].value("expires_at", "") : "";
  };
  EXPECT_EQ(expires(), api::OllamaTimestamp(clock_.NowMs() + 120'000));
  auto ex = Send("/api/generate", json{{"model", "chat"}, {"keep_alive", "45s"}}.dump());  // a load that sets it
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(expires(), api::OllamaTimestamp(clock_.NowMs() + 45'000));
}

// An Ollama "format" schema within json_max_depth is not refused for the
// two levels its translation adds (response_format.json_schema.schema).
TEST_F(LifecycleTest, AnOllamaFormatWithinTheDepthLimitIsNotRefusedOnceTranslated) {
  json schema = {{"type", "string"}};  // 1 level
  for (int i = 0; i < 31; ++i) schema = {{"type", "object"}, {"properties", {{"a", schema}}}};  // 63
  json body = {{"model", "chat"}, {"prompt", "hi"}, {"raw", true}, {"stream", false}, {"format", schema}};  // 64
  auto ex = Send("/api/generate", body.dump());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  body["format"] = {{"type", "object"}, {"properties", {{"a", schema}}}};  // 66: the client's own body is too deep
  auto deep = Send("/api/generate", body.dump());
  ASSERT_TRUE(deep->Wait());
  EXPECT_EQ(deep->status(), 400u) << deep->body();
}

// max_tokens written as a float (1000.0, as a client that computes it may
// send) is the number it says: admission read only integers, took the
// service's default instead and sent that to the worker.
TEST_F(LifecycleTest, AMaxTokensWrittenAsAFloatIsTheNumberItSays) {
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 6.0}}.dump(), "POST",
                 {{"X-Request-Id", "r-float"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  ASSERT_EQ(primary_.calls(), 1u);
  EXPECT_EQ(primary_.bodies[0]["max_tokens"], 6) << primary_.bodies[0].dump();
}

// A negative seed (-1: "random" to many UIs) is replaced by a pinned one,
// journaled with the body, as a missing seed is: a failover replays it.
TEST_F(LifecycleTest, ANegativeSeedIsPinnedAsAMissingOneIs) {
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}, {"seed", -1}}.dump(),
                 "POST", {{"X-Request-Id", "r-seed"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  ASSERT_EQ(primary_.calls(), 1u);
  ASSERT_TRUE(primary_.bodies[0]["seed"].is_number_integer()) << primary_.bodies[0].dump();
  EXPECT_GE(primary_.bodies[0]["seed"].get<int64_t>(), 0);
  EXPECT_EQ(json::parse(Journaled("r-seed").body)["seed"], primary_.bodies[0]["seed"]);
}

// An on-demand primary that is stopped (released when idle, or evicted and
// its room back) is started by the request that chooses it, also while its
// CPU fallback is up to count the prompt: it was chosen and never started,
// and the request waited 60 s for a 503.
TEST_F(LifecycleTest, AStoppedOnDemandPrimaryIsStartedByTheRequestThatChoosesIt) {
  workers_.SetOnDemand("chat.0");
  workers_.Release("chat.0");  // stopped: no port
  auto ex = Complete("r-wake");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("chat.0") > 0; })) << "the chosen placement was never started";
  EXPECT_FALSE(ex->done()) << ex->body();
  workers_.SetReady("chat.0", primary_.server.port());  // loaded
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_NE(ex->body().find("primary"), std::string::npos) << ex->body();
}

// A service of one placement (no CPU path, whose line has bounds of its
// own): its requests wait for its worker's slots, in the service's line.
class OnePlacementLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "[[service]]\nname = \"chat\"\nmodel = \"/nonexistent/chat.gguf\"\nmax_tokens = 64\n"
                   "[[service.placement]]\nrole = \"primary\"\ndevice = \"sim:0\"\nctx = 256\nslots = 2\n";
    LifecycleTest::SetUp();
    primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  }
};

// An unloaded on-demand primary is "evicted" (its next request loads it),
// unless it takes nothing now: with its breaker open its requests get 503,
// and it read as unloaded, loaded again by the next request. One never
// loaded since the gateway started is "standby" (it read as evicted).
TEST_F(OnePlacementLifecycleTest, AnUnloadedPrimaryWhoseBreakerIsOpenIsUnavailable) {
  workers_.SetOnDemand("chat.0");
  workers_.Release("chat.0");
  EXPECT_TRUE(Eventually([&] { return StatusNow()["services"][0]["state"] == "standby"; }))
      << StatusNow()["services"][0].dump();
  EXPECT_NE(StatusNow()["services"][0]["serving"]["summary"].get<std::string>().find("not loaded yet"), std::string::npos)
      << StatusNow()["services"][0].dump();
  auto loaded_once = testing::ViewOf("chat.0", upstream::WorkerState::kStopped, 0);
  loaded_once.ever_ready = true;  // (loaded once: by this gateway, or adopted from the one before)
  workers_.SetView(loaded_once);
  EXPECT_TRUE(Eventually([&] { return StatusNow()["services"][0]["state"] == "evicted"; }))
      << StatusNow()["services"][0].dump();
  EXPECT_NE(StatusNow()["services"][0]["serving"]["summary"].get<std::string>().find("unloaded"), std::string::npos)
      << "an unloaded placement was said to serve: " << StatusNow()["services"][0].dump();
  workers_.Exit("chat.0", "signal 9");  // its breaker opens
  ASSERT_EQ(StatusNow()["services"][0]["placements"][0]["breaker"]["state"], "open");
  EXPECT_TRUE(Eventually([&] { return StatusNow()["services"][0]["state"] == "unavailable"; }))
      << StatusNow()["services"][0].dump();
  // Its requests wait for the breaker's ejection to end (it said they get 503).
  const std::string summary = StatusNow()["services"][0]["serving"]["summary"];
  EXPECT_NE(summary.find("breaker lets a request through again in"), std::string::npos) << summary;
  EXPECT_NE(summary.find("requests wait up to 60 s"), std::string::npos) << summary;
}

// A line that moves keeps its requests past the 60 s a wait gets: the wait
// counts from the line's last admission. Each was refused 60 s after it
// came, the line moving or not (embeddings behind a long line of them, all
// served in turn, got 503 at a minute).
TEST_F(OnePlacementLifecycleTest, ALineThatMovesKeepsItsRequestsPastTheWaitBound) {
  auto h0 = Complete("r-hold0");
  auto h1 = Complete("r-hold1");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; }));
  auto a = Complete("r-a");
  ASSERT_TRUE(ToldWhyItWaits("r-a"));
  auto b = Complete("r-b");
  ASSERT_TRUE(ToldWhyItWaits("r-b"));
  clock_.Advance(50'000);
  Answer(primary_.TakeHeld(0), "primary");  // r-a is admitted 50 s after it came
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 3; }));
  clock_.Advance(20'000);  // r-b has waited 70 s, the line moved 20 s ago
  gateway_->WorkerReady("chat.0");  // (a wake: r-b decides again now)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_FALSE(b->done()) << b->body();
  Answer(primary_.TakeHeld(1), "primary");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 4; }));
  Answer(primary_.TakeHeld(3), "primary");
  ASSERT_TRUE(b->Wait());
  EXPECT_EQ(b->status(), 200u) << b->body();
  // A line that stands still for 60 s refuses its head.
  auto c = Complete("r-c");  // the slot r-b left
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 5; }));
  auto d = Complete("r-d");
  ASSERT_TRUE(ToldWhyItWaits("r-d"));
  clock_.Advance(61'000);
  gateway_->WorkerReady("chat.0");
  ASSERT_TRUE(d->Wait());
  EXPECT_EQ(d->status(), 503u) << d->body();
  for (size_t i : {2, 4}) Answer(primary_.TakeHeld(i), "primary");
  ASSERT_TRUE(a->Wait());
  ASSERT_TRUE(c->Wait());
}

// A stream whose workers stay busy past the 60 s a wait gets ends with their
// 503 and says when to try again, as a non-streamed one does (it had no
// Retry-After: a stream's refusal carries no header of its own).
TEST_F(LifecycleTest, AStreamWhoseWorkersStayBusyIsToldWhenToTryAgain) {
  const Behaviour busy = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("every slot is taken"));
  };
  primary_.behaviour = busy;
  fallback_.behaviour = busy;
  auto ex = Complete("r-busy-stream", true);
  ASSERT_TRUE(Eventually([&] { return primary_.calls() + fallback_.calls() >= 2; }));
  clock_.Advance(61'000);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_EQ(ex->header("Retry-After"), "1") << ex->body();
}

// A deadline bounds a running attempt too, by the request's own time left:
// a worker that holds its answer past it is not the worker's failure (no
// suspicion, no move elsewhere), and the answer is the deadline's 504.
// Counting the prompt's tokens is bounded by the deadline: a hung worker
// (it takes the connection, never answers) held each request 30 s per
// placement, past its X-Request-Timeout.
TEST_F(LifecycleTest, AHungWorkerCountingThePromptDoesNotHoldTheRequestPastItsDeadline) {
  primary_.hang_tokenize = true;
  fallback_.hang_tokenize = true;
  auto ex = Complete("r-hung", false, {{"X-Request-Timeout", "0.3"}});
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lk(primary_.mu);
    return !primary_.hung.empty();
  }));
  clock_.Advance(1'000);  // the deadline has passed by the clock; the worker's answer is awaited in real time
  ASSERT_TRUE(ex->Wait(std::chrono::seconds(5))) << "still waiting for the worker to count its prompt";
  EXPECT_EQ(ex->status(), 504u) << ex->body();
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
}

// A prompt of megabytes that a worker (up, answering its health checks)
// cannot count within its wait is refused once (503, saying it is likely
// far too long, or the worker busy with others), not counted again: it was
// sent to be counted again and again, each worker tokenizing it anew, until
// the request's 60 s were gone, and then told the service was "starting".
TEST_F(LifecycleTest, APromptTooLongToCountIsRefusedOnce) {
  primary_.hang_tokenize = true;  // (counting it never ends here)
  fallback_.hang_tokenize = true;
  const std::string prompt((1 << 20) + 1000, 'a');
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", prompt}, {"max_tokens", 8}}.dump(), "POST",
                 {{"X-Request-Id", "r-huge"}});
  ASSERT_TRUE(ex->Wait(std::chrono::seconds(20)));  // (its wait is real time: 5 s, and 2 s a MiB)
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_NE(ex->body().find("send a shorter one"), std::string::npos) << ex->body();
  EXPECT_EQ(ex->header("Retry-After"), "10");
  size_t counts = 0;
  for (Worker* w : {&primary_, &fallback_}) {
    std::lock_guard<std::mutex> lk(w->mu);
    counts += w->hung.size();
  }
  EXPECT_EQ(counts, 1u) << "counted once, not again and again";
}

// A request that comes while its workers load (a restart: the requests it
// recovered too) waits for them as long as their start timeout allows, not
// the 60 s a wait for a busy worker gets: it ended failed at 60 s while a
// model loaded within its 120 s start timeout. Past the start timeout it
// says why.
TEST_F(LifecycleTest, ARequestWaitsForItsWorkersToLoadWithinTheirStartTimeout) {
  EveryWorkerStarting();
  auto ex = Complete("r-loading");
  auto reason = [&] { return Queried("r-loading"); };
  ASSERT_TRUE(Eventually([&] { return reason().find("0 s of its 120 s start timeout") != std::string::npos; }));
  clock_.Advance(90'000);  // loading for 90 s
  ASSERT_TRUE(Eventually([&] { return reason().find("90 s of its 120 s start timeout") != std::string::npos; }))
      << reason();
  EXPECT_FALSE(ex->done()) << ex->body();
  EveryWorkerReadyAgain();
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();

  EveryWorkerStarting();
  auto late = Complete("r-never");
  ASSERT_TRUE(Eventually([&] {
    return Queried("r-never").find("0 s of its 120 s start timeout") != std::string::npos;
  }));
  clock_.Advance(121'000);
  ASSERT_TRUE(late->Wait());
  EXPECT_EQ(late->status(), 503u) << late->body();
  EXPECT_NE(late->body().find("start_timeout_s"), std::string::npos) << late->body();
}

// A worker's last log line (its reason for failing) cut mid-character: the
// request still ends, journaled, with its 503 (the JSON writer threw, the
// row stayed queued and its Idempotency-Key "in flight" until a restart).
TEST_F(LifecycleTest, AFailingWorkersBytesInTheReasonDoNotStrandTheRequest) {
  for (const char* key : {"chat.0", "chat.1"}) {
    workers_.SetStarting(key, clock_.NowMs());
    upstream::WorkerView v;
    v.key = key;
    v.state = upstream::WorkerState::kBackoff;
    v.failed_starts = 2;
    v.last_exit = "exit 1";
    v.last_error = std::string(40, 'x') + "\xE2\x96 loading \xFF";
    v.next_start_ms = clock_.NowMs() + 30'000;
    workers_.SetView(v);
  }
  auto ex = Complete("r-bytes", false, {{"Idempotency-Key", "k-bytes"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_NE(ex->body().find("failed to start 2 times"), std::string::npos) << ex->body();
  EXPECT_EQ(Journaled("r-bytes").state, journal::State::kFailed);
}

TEST_F(LifecycleTest, ARunningRequestEndsAtItsDeadline) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-slow", false, {{"X-Request-Timeout", "0.3"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 504u) << ex->body();
  EXPECT_TRUE(Eventually([&] { return Journaled("r-slow").state == journal::State::kFailed; }));
  EXPECT_NE(Journaled("r-slow").error.find("X-Request-Timeout"), std::string::npos);
  EXPECT_EQ(fallback_.calls(), 0u);
  EXPECT_TRUE(workers_.suspected().empty());
}

// A deadline under a millisecond is one, not none (it was truncated to 0,
// which means no deadline: the request waited for its held answer).
TEST_F(LifecycleTest, ATinyDeadlineIsOneMillisecondNotNone) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-tiny", false, {{"X-Request-Timeout", "0.0004"}});
  ASSERT_TRUE(ex->Wait(std::chrono::seconds(5)));
  EXPECT_EQ(ex->status(), 504u) << ex->body();
}

// ... and a stream: it was relayed until the worker's last token, whatever
// its X-Request-Timeout said. Now it is cut at the deadline, with what was
// delivered kept and an error event saying why.
TEST_F(LifecycleTest, AStreamEndsAtItsDeadlineWithAnErrorEvent) {
  std::mutex mu;
  std::vector<std::shared_ptr<http::Exchange>> open;  // the worker never ends its stream
  primary_.behaviour = [&](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("a", 11));
    std::lock_guard<std::mutex> lk(mu);
    open.push_back(std::move(ex));
  };
  auto ex = Complete("r-long", true, {{"X-Request-Timeout", "0.3"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_TRUE(ex->streamed());
  const std::string body = ex->body();
  EXPECT_NE(body.find("\"a\""), std::string::npos) << body;
  EXPECT_NE(body.find("X-Request-Timeout"), std::string::npos) << body;
  EXPECT_TRUE(Eventually([&] { return Journaled("r-long").state == journal::State::kFailed; }));
  EXPECT_EQ(fallback_.calls(), 0u) << "a deadline is not a reason to continue elsewhere";
  EXPECT_TRUE(workers_.suspected().empty());
  std::lock_guard<std::mutex> lk(mu);
  open.clear();
}

TEST_F(LifecycleTest, ACancelReachesAWaitingRequestAndTheJournalSaysCancelled) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-cancel");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  auto cancel = Send("/v1/requests/r-cancel", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  EXPECT_EQ(cancel->status(), 200u);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 499u);
  EXPECT_TRUE(Eventually([&] { return Journaled("r-cancel").state == journal::State::kCancelled; }));
  EXPECT_EQ(fallback_.calls(), 0u) << "a cancelled request is not moved elsewhere";
}

// A cancel that arrives while the request's first row is still on its way
// to the disk (here: a request with an id of the gateway's making, already
// sent to its worker while its commit syncs): it is cancelled all the same.
// It was a 404, and the request then ran to its end.
TEST_F(LifecycleTest, ACancelBeforeTheFirstRowIsDurableStillCancels) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  faults_->BlockSyncs();
  auto ex = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(faults_->WaitForHeldSyncs(1, std::chrono::seconds(10)));
  const bool sent = Eventually([&] { return primary_.calls() == 1; });
  std::string id;
  if (sent) {
    std::lock_guard<std::mutex> lk(primary_.mu);
    id = primary_.ids[0];
  }
  auto cancel = Send("/v1/requests/" + id, "", "DELETE");
  const bool answered = cancel->Wait();
  faults_->Unblock();  // before any assertion can end the test
  ASSERT_TRUE(sent);
  ASSERT_TRUE(answered);
  EXPECT_EQ(cancel->status(), 200u) << cancel->body();
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 499u) << ex->body();
  EXPECT_TRUE(Eventually([&] { return Journaled(id).state == journal::State::kCancelled; }));
  auto unknown = Send("/v1/requests/r-never", "", "DELETE");
  ASSERT_TRUE(unknown->Wait());
  EXPECT_EQ(unknown->status(), 404u);
}

// A cancel of a request that waits in line (its row says queued): only its
// lifecycle ends it, journal first, then the client's 499. The cancel used
// to end the row itself as well; when its commit came first, the
// lifecycle's end conflicted with it, the client got a 503 saying the
// journal could not write, and a task retried recording that end for ever.
TEST_F(LifecycleTest, ACancelOfAWaitingRequestIsEndedByItsLifecycleAlone) {
  // Both slots of the primary and the CPU line's one are taken by held requests; the others wait.
  const auto running = TakeEveryPlace("r-busy-");
  ASSERT_EQ(running.size(), 3u);
  for (int i = 0; i < 6; ++i) {
    const std::string id = "r-waits-" + std::to_string(i);
    auto waiting = Complete(id, false, {{"Idempotency-Key", "k-" + id}});
    ASSERT_TRUE(Eventually([&] { return journal_->Get(id).ok(); }));  // queued in the journal
    auto cancel = Send("/v1/requests/" + id, "", "DELETE");
    ASSERT_TRUE(cancel->Wait());
    EXPECT_EQ(cancel->status(), 200u) << cancel->body();
    // It waited for the end its cancel brought, and tells it.
    EXPECT_EQ(json::parse(cancel->body(), nullptr, false).value("state", ""), "cancelled") << cancel->body();
    ASSERT_TRUE(waiting->Wait());
    EXPECT_EQ(waiting->status(), 499u) << waiting->body();
    ASSERT_TRUE(Eventually([&] { return journal::IsTerminal(Journaled(id).state); }));
    const auto rec = Journaled(id);
    EXPECT_EQ(rec.state, journal::State::kCancelled);
    EXPECT_EQ(rec.error, "request cancelled") << "ended by the cancel, not by its lifecycle";
  }
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 3u);
  for (int i = 0; i < 3; ++i) Send("/v1/requests/r-busy-" + std::to_string(i), "", "DELETE")->Wait();
  for (const auto& r : running) EXPECT_TRUE(r->Wait());
}

// A request that waits (every place taken) is journaled on its own; when
// that Accept is refused (the disk full), it stops waiting and its client
// hears why at once. It kept its place, then ran on a worker, and only then
// heard the refusal.
TEST_F(LifecycleTest, ARequestWhoseAcceptIsRefusedWhileItWaitsStopsWaiting) {
  const auto running = TakeEveryPlace("r-held-");
  ASSERT_EQ(running.size(), 3u);
  faults_->SetDiskFull(true);
  // (No id of its own: journaled only once it waits.)
  auto waiting = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(waiting->Wait()) << "still waiting for a place";
  EXPECT_EQ(waiting->status(), 503u) << waiting->body();
  EXPECT_NE(waiting->body().find("journal"), std::string::npos) << waiting->body();
  faults_->SetDiskFull(false);
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 3u) << "it ran on a worker";
  for (int i = 0; i < 3; ++i) Send("/v1/requests/r-held-" + std::to_string(i), "", "DELETE")->Wait();
  for (const auto& r : running) EXPECT_TRUE(r->Wait());
}

// The disk fills while a request runs: its end cannot be recorded, so its
// answer is withheld (503; it was sent, though a crash could have lost
// it), and the end is recorded as that 503 once the disk has room again
// (the row said running for ever, and a keyed retry heard "in flight").
// Both ways a request is first journaled: a client's id (a transaction
// before it runs) and the gateway's (a log record that waits for its end's
// sync, or its 50 ms bound).
class EndUnrecordedTest : public LifecycleTest, public ::testing::WithParamInterface<bool> {};

TEST_P(EndUnrecordedTest, AnAnswerWhoseEndCannotBeRecordedIsWithheld) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  const bool own_id = GetParam();
  const std::string body = json{{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump();
  auto ex = own_id ? Complete("r-full") : Send("/v1/completions", body);
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  std::string id;
  {
    std::lock_guard<std::mutex> lk(primary_.mu);
    id = primary_.ids[0];
  }
  // Its attempt is on disk (a client's id: its attempt's commit is asked for
  // once the worker has the request; a disk full before it refuses the
  // attempt instead, AnAttemptTheJournalCannotRecord... below).
  ASSERT_TRUE(Eventually([&] {
    auto r = journal_->Get(id);
    return r.ok() && r->state == journal::State::kRunning;
  }));
  faults_->SetDiskFull(true);
  std::shared_ptr<http::Exchange> held = primary_.TakeHeld(0);
  ASSERT_TRUE(held);
  Answer(held, "primary");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_EQ(ex->body().find("primary"), std::string::npos) << "an answer whose end is not durable reached the client";
  EXPECT_NE(ex->body().find("could not record how the request ended"), std::string::npos) << ex->body();
  EXPECT_NE(ex->body().find("GET /v1/requests/" + id), std::string::npos) << ex->body();
  EXPECT_EQ(ex->header("X-Should-Retry"), "false");
  faults_->SetDiskFull(false);
  EXPECT_TRUE(Eventually([&] { return Journaled(id).state == journal::State::kFailed; }, std::chrono::seconds(15)));
  EXPECT_EQ(Journaled(id).result_status, 503);
}

INSTANTIATE_TEST_SUITE_P(FirstJournaled, EndUnrecordedTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "ByTheClientsId" : "ByTheGatewaysId"; });

// A disk that stalls a commit (here a keyed request's Accept, a transaction
// whose fsync hangs) holds the journal's connection: /v1/status and
// /v1/requests still answer, listing the request from its live state. They
// read the journal per live request, and the residency events, and hung.
TEST_F(LifecycleTest, TheStatusAnswersWhileTheJournalsDiskStalls) {
  faults_->BlockSyncs();
  auto ex = Complete("r-keyed", false, {{"Idempotency-Key", "k-stall"}});
  const bool held = faults_->WaitForHeldSyncs(1, std::chrono::seconds(10));
  auto status = Send("/v1/status", "", "GET");
  auto list = Send("/v1/requests", "", "GET");
  const bool status_answered = status->Wait(std::chrono::seconds(3));
  const bool list_answered = list->Wait(std::chrono::seconds(3));
  faults_->Unblock();  // before any assertion can end the test
  ASSERT_TRUE(held);
  ASSERT_TRUE(status_answered) << "/v1/status waited for the stalled disk";
  ASSERT_TRUE(list_answered) << "/v1/requests waited for the stalled disk";
  EXPECT_EQ(status->status(), 200u) << status->body();
  const json listed = json::parse(list->body());
  ASSERT_EQ(listed["data"].size(), 1u) << list->body();
  EXPECT_EQ(listed["data"][0]["id"], "r-keyed");
  EXPECT_EQ(listed["data"][0]["endpoint"], "completion");
  EXPECT_EQ(listed["data"][0]["stream"], false);
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 200u) << ex->body();
}

// A request recovered after a restart keeps its X-Request-Timeout: one
// already past it ends 504 without running (it ran in full, however late).
class RecoveredLateTest : public LifecycleTest {
 protected:
  std::vector<journal::RequestRecord> Recovered() override {
    return RecoverCompletions({"r-recovered-late"}, clock_.NowMs() - 1000);  // its deadline passed while the gateway was down
  }
};

TEST_F(RecoveredLateTest, ARecoveredRequestPastItsDeadlineEndsWithoutRunning) {
  EXPECT_TRUE(Eventually([&] { return Journaled("r-recovered-late").state == journal::State::kFailed; }));
  const auto rec = Journaled("r-recovered-late");
  EXPECT_EQ(rec.result_status, 504);
  EXPECT_NE(rec.error.find("X-Request-Timeout"), std::string::npos) << rec.error;
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
}

// The gateway's stop cuts what is still under way when its grace ends
// (Gateway::CutForStop): a request not streamed that ran has its answer
// withheld and stays unfinished in the journal, for the next start to run
// again; one its client cancelled first ends cancelled, as asked (the stop
// was one flag for the whole gateway, and a cancel it met ran again at the
// next start).
TEST_F(LifecycleTest, TheStopsCutLeavesARequestThatRanForTheNextStartAndACancelledOneCancelled) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto cut = Complete("r-cut");
  auto asked = Complete("r-asked");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; }));
  // The client's cancel reaches the worker, whose 499 waits until after the
  // cut: the cut meets a request its client cancelled (answered at once, the
  // 499 could end it before the cut, which then found one request).
  primary_.hold_cancelled = true;
  auto cancel = Send("/v1/requests/r-asked", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(Eventually([&] { return primary_.cancels.load() == 1; }));
  EXPECT_EQ(gateway_->CutForStop(), 2u);
  ASSERT_TRUE(Eventually([&] { return primary_.cancels.load() == 2; }));  // (the cut's, of r-cut)
  // (The worker answers each cancel, the client's and the cut's, with 499, as a worker does.)
  primary_.ReleaseCancelled();
  ASSERT_TRUE(cut->Wait());
  ASSERT_TRUE(asked->Wait());
  EXPECT_EQ(cut->status(), 503u) << cut->body();
  EXPECT_NE(cut->body().find("answer_withheld"), std::string::npos) << cut->body();
  EXPECT_NE(cut->body().find("the next start runs it again"), std::string::npos) << cut->body();
  EXPECT_EQ(Journaled("r-cut").state, journal::State::kRunning);
  EXPECT_EQ(asked->status(), 499u) << asked->body();
  EXPECT_EQ(Journaled("r-asked").state, journal::State::kCancelled);
}

// A request the start recovered (its client gone) that still waits when the
// stop cuts it is left as it is for the next start: failed, it was lost,
// and its Idempotency-Key replayed the failure.
class RecoveredThenStoppedTest : public LifecycleTest {
 protected:
  std::vector<journal::RequestRecord> Recovered() override {
    EveryWorkerStarting();  // (before Start runs it: it waits for a worker)
    return RecoverCompletions({"r-recovered-waits"});
  }
};

TEST_F(RecoveredThenStoppedTest, ARecoveredRequestCutByTheStopStaysForTheNextStart) {
  ASSERT_TRUE(Eventually([&] { return gateway_->LiveRequests() == 1; }));
  EXPECT_EQ(gateway_->CutForStop(), 1u);
  ASSERT_TRUE(Eventually([&] { return gateway_->LiveRequests() == 0; }));
  const auto rec = Journaled("r-recovered-waits");
  EXPECT_FALSE(journal::IsTerminal(rec.state)) << journal::StateName(rec.state) << ": " << rec.error;
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
}

// One busy service cannot fill the queue every service shares: each other
// service keeps a share of max_queue (max_queue / 2n) (a flood of one
// service's waiting requests had every other service's requests refused).
class SharedQueueLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "max_queue = 4\n" + std::string(kConfig) +
                   "[[service]]\nname = \"other\"\nmodel = \"/nonexistent/other.gguf\"\n"
                   "[[service.placement]]\ndevice = \"cpu\"\nctx = 256\nslots = 1\n";
    workers_.SetReady("other.0", fallback_.server.port());
    LifecycleTest::SetUp();
  }
};

TEST_F(SharedQueueLifecycleTest, ABusyServiceLeavesTheOthersTheirShareOfTheQueue) {
  EveryWorkerStarting();  // chat's requests wait
  std::vector<std::shared_ptr<RecordingExchange>> waiting;
  for (int i = 0; i < 3; ++i) waiting.push_back(Complete("r-wait-" + std::to_string(i)));
  ASSERT_TRUE(Eventually([&] { return StatusNow()["queue"].value("waiting", 0) == 3; })) << StatusNow()["queue"];
  auto fourth = Complete("r-wait-3");
  ASSERT_TRUE(fourth->Wait());
  EXPECT_EQ(fourth->status(), 503u) << fourth->body();
  EXPECT_NE(fourth->body().find("kept for other services"), std::string::npos) << fourth->body();
  auto other = Send("/v1/completions", json{{"model", "other"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump(), "POST",
                    {{"X-Request-Id", "r-other"}});
  ASSERT_TRUE(other->Wait());
  EXPECT_EQ(other->status(), 200u) << "refused by another service's flood: " << other->body();
  EveryWorkerReadyAgain();
  for (auto& w : waiting) EXPECT_TRUE(w->Wait());
  // A max_queue under 2n keeps nothing for the others (it kept all of
  // itself: every request of every service got 503).
  config_.max_queue = 1;  // read per request
  auto alone = Send("/v1/completions", json{{"model", "other"}, {"prompt", "hello"}, {"max_tokens", 8}}.dump(), "POST",
                    {{"X-Request-Id", "r-alone"}});
  ASSERT_TRUE(alone->Wait());
  EXPECT_EQ(alone->status(), 200u) << alone->body();
}

// Requests recovered after a restart wait for their workers like any other:
// they count against max_queue (new clients got the whole bound on top of
// the recovered backlog).
class RecoveredBacklogTest : public LifecycleTest {
 protected:
  std::vector<journal::RequestRecord> Recovered() override {
    config_.services[0].max_queue = 2;  // read per request
    EveryWorkerStarting();
    return RecoverCompletions({"r-backlog-0", "r-backlog-1"});
  }
};

TEST_F(RecoveredBacklogTest, RecoveredRequestsCountAgainstMaxQueue) {
  auto refused = Complete("r-new");
  ASSERT_TRUE(refused->Wait());
  EXPECT_EQ(refused->status(), 503u) << refused->body();
  EXPECT_NE(refused->body().find("its max_queue"), std::string::npos) << refused->body();
  EXPECT_EQ(refused->header("X-Request-Id"), "r-new") << "a client retrying names what it retries";
  EveryWorkerReadyAgain();
  for (const char* id : {"r-backlog-0", "r-backlog-1"}) {
    EXPECT_TRUE(Eventually([&] { return Journaled(id).state == journal::State::kCompleted; })) << id;
  }
  auto next = Complete("r-next");
  ASSERT_TRUE(next->Wait());
  EXPECT_EQ(next->status(), 200u) << next->body();
}

// An external service "rerank" (routes /v1/rerank), with `extra` keys.
std::string RerankService(const std::string& extra = "") {
  return "[[service]]\nname = \"rerank\"\nkind = \"external\"\ncommand = \"server --port ${PORT}\"\n"
         "routes = { \"/v1/rerank\" = \"/v1/rerank\" }\n" + extra;
}

// A batch service held off the accelerator until interactive work has been
// idle interactive_idle_s: an interactive request still running is
// interactive work now, however long ago it came (a 5 s stream let batch
// work onto the accelerator once 2 s had passed since it began).
class InteractiveIdleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ += RerankService("device = \"sim:0\"\nresident_mib = 100\npriority = \"batch\"\ninteractive_idle_s = 2\n");
    LifecycleTest::SetUp();
  }
  json HeldBack() {
    const json status = StatusNow();
    for (const auto& r : status["residency"]["services"]) {
      if (r.value("service", "") == "rerank") return r["held_back"];
    }
    return "no rerank in /v1/status";
  }
};

TEST_F(InteractiveIdleTest, AnInteractiveRequestStillRunningHoldsBatchWorkOffTheAccelerator) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto running = Complete("r-long");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  clock_.Advance(10'000);  // long past interactive_idle_s since it came
  const json held = HeldBack();
  ASSERT_TRUE(held.is_string()) << "batch work let onto the accelerator while an interactive request runs: " << held;
  EXPECT_NE(held.get<std::string>().find("running"), std::string::npos) << held;
  auto answer = primary_.TakeHeld(0);
  ASSERT_TRUE(answer);
  Answer(answer, "done");
  ASSERT_TRUE(running->Wait());
  EXPECT_TRUE(HeldBack().is_string()) << "idle for 0 s of its 2";
  clock_.Advance(2'500);
  EXPECT_TRUE(HeldBack().is_null()) << HeldBack();
}

// Requests for an external service that is not idempotent, recovered after
// a restart: one whose attempt had reached the server is not sent again;
// one whose attempts never reached it (requeued, waiting for the server
// when the gateway stopped) is sent. Both were failed.
class RecoveredExternalTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ += RerankService();
    workers_.SetReady("rerank.ext", server_.server.port());
    server_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
      ex->Respond(http::MakeResponse(200, "{\"results\":[]}", "application/json"));
    };
    LifecycleTest::SetUp();
  }
  std::vector<journal::RequestRecord> Recovered() override {
    for (const char* id : {"r-reached", "r-unreached"}) {
      journal::RequestRecord r;
      r.id = id;
      r.payload_hash = "h";
      r.service = "rerank";
      r.endpoint = "/v1/rerank";
      r.body = json{{"model", "rerank"}, {"query", "q"}, {"documents", {"a"}}}.dump();
      EXPECT_TRUE(journal_->Accept(r).ok());
      EXPECT_TRUE(journal_->StartAttempt(id, "rerank").ok());
    }
    EXPECT_TRUE(journal_->Requeue("r-unreached", "connection refused").ok());
    auto recovered = journal_->Recover();
    EXPECT_TRUE(recovered.ok());
    return recovered.ok() ? *recovered : std::vector<journal::RequestRecord>{};
  }
  Worker server_;
};

TEST_F(RecoveredExternalTest, OnlyARequestThatReachedTheServerIsNotSentAgain) {
  ASSERT_TRUE(Eventually([&] { return Journaled("r-unreached").state == journal::State::kCompleted; }))
      << Journaled("r-unreached").error;
  ASSERT_TRUE(Eventually([&] { return Journaled("r-reached").state == journal::State::kFailed; }))
      << static_cast<int>(Journaled("r-reached").state) << " " << Journaled("r-reached").error;
  EXPECT_NE(Journaled("r-reached").error.find("not idempotent"), std::string::npos) << Journaled("r-reached").error;
  EXPECT_EQ(server_.calls(), 1u);
}

// An external service's line full (max_queue waiting): a retry under its
// Idempotency-Key is still answered with its stored answer (it was a 503
// "max_queue"), and a new keyed request is refused as any other, its key
// left free for its retry.
class FullExternalLineTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ += RerankService("concurrency = 1\nmax_queue = 1\n");
    workers_.SetReady("rerank.ext", server_.server.port());
    server_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) {
      if (std::string(req["x-request-id"]).rfind("h-", 0) == 0) return server_.Hold(req, std::move(ex));
      ex->Respond(http::MakeResponse(200, "{\"results\":[1]}", "application/json"));
    };
    LifecycleTest::SetUp();
  }
  std::shared_ptr<RecordingExchange> Rerank(const std::string& id, const std::string& key = "") {
    std::vector<std::pair<std::string, std::string>> h = {{"X-Request-Id", id}};
    if (!key.empty()) h.emplace_back("Idempotency-Key", key);
    return Send("/v1/rerank", json{{"model", "rerank"}, {"query", "q"}, {"documents", {"a"}}}.dump(), "POST", h);
  }
  Worker server_;
};

TEST_F(FullExternalLineTest, AKeyedReplayIsAnsweredWhileTheLineIsFull) {
  auto done = Rerank("r-done", "k-done");
  ASSERT_TRUE(done->Wait());
  ASSERT_EQ(done->status(), 200u) << done->body();
  auto running = Rerank("h-running");
  ASSERT_TRUE(Eventually([&] { return server_.calls() == 2; }));
  auto waiting = Rerank("h-waiting");
  ASSERT_TRUE(ToldWhyItWaits("h-waiting"));
  auto replay = Rerank("r-again", "k-done");
  ASSERT_TRUE(replay->Wait());
  EXPECT_EQ(replay->status(), 200u) << replay->body();
  EXPECT_EQ(replay->header("Idempotent-Replayed"), "true");
  auto fresh = Rerank("r-new", "k-new");
  ASSERT_TRUE(fresh->Wait());
  EXPECT_EQ(fresh->status(), 503u) << fresh->body();
  EXPECT_NE(fresh->body().find("max_queue"), std::string::npos) << fresh->body();
  EXPECT_EQ(Journaled("r-new").state, journal::State::kFailed);
  Answer(server_.TakeHeld(1), "one");
  ASSERT_TRUE(running->Wait());
  ASSERT_TRUE(Eventually([&] { return server_.calls() == 3; }));
  Answer(server_.TakeHeld(2), "two");
  ASSERT_TRUE(waiting->Wait());
  auto retried = Rerank("r-new-2", "k-new");  // its key was left free
  ASSERT_TRUE(retried->Wait());
  EXPECT_EQ(retried->status(), 200u) << retried->body();
  EXPECT_EQ(server_.calls(), 4u);
}

// A query string goes on to the external server as sent (some take their
// options there: it was dropped).
// A server's 204 (an SSE server's "do not reconnect") is answered as one: relayed
// as a stream, it went out chunked, with a body a 204 must not have, which its
// client read as the next answer on the connection.
TEST_F(FullExternalLineTest, ANoContentAnswerOfAnEventStreamIsNotRelayedAsAStream) {
  server_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->Respond(http::MakeResponse(204, "", "text/event-stream"));
  };
  auto ex = Rerank("r-204");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 204u) << ex->body();
  EXPECT_FALSE(ex->streamed());
  EXPECT_TRUE(ex->body().empty()) << ex->body();
}

TEST_F(FullExternalLineTest, TheQueryStringIsForwarded) {
  server_.behaviour = [](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    ex->Respond(http::MakeResponse(200, json{{"target", std::string(req.target())}}.dump(), "application/json"));
  };
  auto ex = Send("/v1/rerank?top_n=2&return_documents=true",
                 json{{"model", "rerank"}, {"query", "q"}, {"documents", {"a"}}}.dump(), "POST", {{"X-Request-Id", "r-query"}});
  ASSERT_TRUE(ex->Wait());
  ASSERT_EQ(ex->status(), 200u) << ex->body();
  EXPECT_EQ(json::parse(ex->body())["target"], "/v1/rerank?top_n=2&return_documents=true");
  EXPECT_EQ(Journaled("r-query").endpoint, "/v1/rerank?top_n=2&return_documents=true");
}

// A batch external server on an accelerator, outside its window: it has no
// CPU path, so its requests are told when the window opens (503 with
// Retry-After) instead of starting it on the accelerator.
class ExternalWindowTest : public LifecycleTest {
 protected:
  void SetUp() override {
    const int64_t later = clock_.NowMs() + 3 * 3600'000;
    auto hhmm = [](int64_t ms) {
      const std::time_t t = static_cast<std::time_t>(ms / 1000);
      std::tm tm{};
      localtime_r(&t, &tm);
      char text[8];
      std::snprintf(text, sizeof text, "%02d:%02d", tm.tm_hour, tm.tm_min);
      return std::string(text);
    };
    config_text_ += RerankService("device = \"sim:0\"\nresident_mib = 100\n"
                    "residency = \"on_demand\"\npriority = \"batch\"\nwindows = [\"" + hhmm(later) + "-" +
                    hhmm(later + 3600'000) + "\"]\n");
    workers_.SetReady("rerank.ext", server_.server.port());
    server_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
      ex->Respond(http::MakeResponse(200, "{\"results\":[]}", "application/json"));
    };
    LifecycleTest::SetUp();
  }
  Worker server_;
};

TEST_F(ExternalWindowTest, ARequestOutsideTheWindowIsToldWhenItOpens) {
  auto ex = Send("/v1/rerank", json{{"model", "rerank"}, {"query", "q"}, {"documents", {"a"}}}.dump());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 503u) << ex->body();
  EXPECT_NE(ex->body().find("outside its accelerator window"), std::string::npos) << ex->body();
  const int retry_after = std::atoi(ex->header("Retry-After").c_str());
  EXPECT_GT(retry_after, 2 * 3600) << ex->header("Retry-After");
  EXPECT_LE(retry_after, 3 * 3600 + 60) << ex->header("Retry-After");
  EXPECT_EQ(server_.calls(), 0u);
}

// A fallback that is stopped on demand serves (the next request starts it):
// the status says the requests go there, not that nothing can take them
// (the dashboard said both in one banner).
TEST_F(LifecycleTest, ADegradedServiceWhoseFallbackStartsOnDemandSaysItsRequestsGoThere) {
  upstream::WorkerView fallback;
  fallback.key = "chat.1";
  fallback.state = upstream::WorkerState::kStopped;
  fallback.on_demand = true;
  workers_.SetView(fallback);
  workers_.SetOnDemand("chat.1");
  workers_.Exit("chat.0", "signal 9");  // its breaker opens
  const json status = StatusNow();
  std::string degraded;
  for (const auto& s : status["services"]) {
    if (s.value("name", "") == "chat" && s["degraded"].is_string()) degraded = s["degraded"];
  }
  EXPECT_NE(degraded.find("requests go to the fallback placements"), std::string::npos) << degraded;
  EXPECT_EQ(degraded.find("no other placement"), std::string::npos) << degraded;
}

// The dashboard encodes an id for its path (encodeURIComponent: ':' is
// %3A): the id is found decoded, and its Cancel button works.
TEST_F(LifecycleTest, ARequestIdInAPathIsFoundPercentEncoded) {
  auto ex = Complete("job:42");
  ASSERT_TRUE(ex->Wait());
  auto q = Send("/v1/requests/job%3A42", "", "GET");
  ASSERT_TRUE(q->Wait());
  EXPECT_EQ(q->status(), 200u) << q->body();
  EXPECT_EQ(json::parse(q->body(), nullptr, false).value("id", ""), "job:42") << q->body();
  auto odd = Send("/v1/requests/job%00x", "", "GET");  // not an id's characters once decoded: looked up as sent
  ASSERT_TRUE(odd->Wait());
  EXPECT_EQ(odd->status(), 404u) << odd->body();
}

// A cancel carries the workers' secret: it goes only to a worker that is
// there on the port the request was sent to. One whose worker has gone (the
// supervisor shows it elsewhere, or not at all) sent it to whatever listened
// on that port by then.
TEST_F(LifecycleTest, ACancelGoesOnlyToAWorkerThatIsStillThere) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-moved");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  upstream::WorkerView moved;  // replaced: ready on another port
  moved.key = "chat.0";
  moved.state = upstream::WorkerState::kReady;
  moved.port = fallback_.server.port();
  workers_.SetView(moved);
  auto del = Send("/v1/requests/r-moved", "", "DELETE");
  ASSERT_TRUE(del->Wait());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(primary_.cancels.load(), 0) << "the secret went to a port its worker no longer holds";
  workers_.SetReadyAgain("chat.0", primary_.server.port());
  if (auto held = primary_.TakeHeld(0)) Answer(held, "primary");
  ASSERT_TRUE(ex->Wait());
}

TEST_F(LifecycleTest, AClientThatGoesAwayCancelsItsRequest) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto ex = Complete("r-gone-client", true);
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  ex->Disconnect();
  EXPECT_TRUE(Eventually([&] { return Journaled("r-gone-client").state == journal::State::kCancelled; }));
}

// Past 200 requests in flight, the status still counts them all and lists
// the oldest (it kept 200 in id order: a random sample, counts capped).
class BusyLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "max_requests_per_key = 1000\nmax_queue = 1000\n" + config_text_;
    const std::string table = "[service.cpu_path]\n";
    config_text_.insert(config_text_.find(table) + table.size(), "max_queue = 1000\n");
    LifecycleTest::SetUp();
  }
};

TEST_F(BusyLifecycleTest, TheStatusCountsEveryRequestAndListsTheOldest) {
  const auto running = TakeEveryPlace("r-full-");
  ASSERT_EQ(running.size(), 3u);
  clock_.Advance(1);  // the others came later
  std::vector<std::shared_ptr<RecordingExchange>> waiting;
  std::vector<std::string> ids;
  for (int i = 0; i < 210; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "z-%03d", i);  // (ids sort after the running ones')
    ids.push_back(id);
    waiting.push_back(Complete(id));
  }
  json st;
  ASSERT_TRUE(Eventually([&] {
    auto r = Send("/v1/status", "", "GET");
    if (!r->Wait()) return false;
    st = json::parse(r->body(), nullptr, false);
    const json& n = st["services"][0]["requests"];
    return st.is_object() && n.value("queued", 0) + n.value("running", 0) == 213;
  })) << st["services"][0]["requests"].dump();
  EXPECT_EQ(st["requests"].size(), 200u);
  EXPECT_EQ(st["requests"][0]["id"].get<std::string>().rfind("r-full-", 0), 0u) << "the oldest first";
  for (int i = 0; i < 3; ++i) Send("/v1/requests/r-full-" + std::to_string(i), "", "DELETE")->Wait();
  for (const auto& id : ids) Send("/v1/requests/" + id, "", "DELETE")->Wait();
  for (const auto& w : waiting) EXPECT_TRUE(w->Wait());
}

TEST_F(LifecycleTest, AWaitingRequestSaysWhereItIsInLine) {
  // Both slots of the primary and the CPU line's one are taken by held requests; the fourth waits.
  const auto running = TakeEveryPlace("r-run-");
  ASSERT_EQ(running.size(), 3u);
  auto waiting = Complete("r-wait");
  ASSERT_TRUE(ToldWhyItWaits("r-wait"));
  auto q = Send("/v1/requests/r-wait", "", "GET");
  ASSERT_TRUE(q->Wait());
  const json j = json::parse(q->body());
  EXPECT_EQ(j["phase"], "queued");
  EXPECT_EQ(j["queue"]["position"], 1);
  EXPECT_FALSE(j["queue"].value("reason", "").empty()) << j.dump();
  // Room comes back: the waiting request runs, and its answer says what it was told while it waited.
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "primary"); };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  for (int i = 0; i < 3; ++i) Send("/v1/requests/r-run-" + std::to_string(i), "", "DELETE")->Wait();
  ASSERT_TRUE(waiting->Wait());
  EXPECT_EQ(waiting->status(), 200u) << waiting->body();
  EXPECT_FALSE(waiting->header("X-Spillway-Estimated-Delay").empty());
  for (const auto& r : running) EXPECT_TRUE(r->Wait());
}

// A place in the CPU path's line is kept as long as the line takes (it is
// bounded by max_queue and the request's deadline), not dropped at the 60 s
// every other wait is capped at.
TEST_F(LifecycleTest, APlaceInTheCpuLineOutlastsTheDelayCap) {
  const auto running = TakeEveryPlace("l-run-");
  ASSERT_EQ(running.size(), 3u);
  auto waiting = Complete("l-wait");
  ASSERT_TRUE(ToldWhyItWaits("l-wait"));
  clock_.Advance(90'000);  // the CPU replica's request runs on for 90 s
  EXPECT_FALSE(waiting->Wait(std::chrono::milliseconds(500))) << "dropped from the CPU line: " << waiting->body();
  // Its turn: the CPU path's running request ends (cancelled), and it runs there.
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "primary"); };
  for (int i = 0; i < 3; ++i) Send("/v1/requests/l-run-" + std::to_string(i), "", "DELETE")->Wait();
  ASSERT_TRUE(waiting->Wait());
  EXPECT_EQ(waiting->status(), 200u) << waiting->body();
  for (const auto& r : running) EXPECT_TRUE(r->Wait());
}

// An on-demand CPU replica that loads for longer than 60 s (a large model
// read from disk) is waited for within its start timeout, not dropped at the
// 60 s delay cap.
TEST_F(LifecycleTest, ACpuReplicaThatLoadsIsWaitedForWithinItsStartTimeout) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  workers_.Exit("chat.1", "released when idle");
  workers_.SetOnDemand("chat.1");
  auto a = Complete("o-a");
  auto b = Complete("o-b");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; }));
  auto waiting = Complete("o-wait");
  ASSERT_TRUE(ToldWhyItWaits("o-wait"));
  clock_.Advance(70'000);  // the replica loads for 70 s
  EXPECT_FALSE(waiting->Wait(std::chrono::milliseconds(500))) << "dropped while its replica loaded: " << waiting->body();
  workers_.SetReadyAgain("chat.1", fallback_.server.port());
  ASSERT_TRUE(waiting->Wait());
  EXPECT_EQ(waiting->status(), 200u) << waiting->body();
  EXPECT_EQ(waiting->header("X-Spillway-Placement"), "cpu");
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "primary"); };
  for (const char* id : {"o-a", "o-b"}) Send(std::string("/v1/requests/") + id, "", "DELETE")->Wait();
  EXPECT_TRUE(a->Wait());
  EXPECT_TRUE(b->Wait());
}

TEST_F(LifecycleTest, AServiceQueueIsBoundedByItsOwnMaxQueue) {
  config_.services[0].max_queue = 1;  // read per request
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
  std::vector<std::shared_ptr<RecordingExchange>> running;
  for (int i = 0; i < 3; ++i) {  // one at a time: a request counts as waiting until its first attempt runs
    running.push_back(Complete("q-run-" + std::to_string(i)));
    ASSERT_TRUE(Eventually([&] { return primary_.calls() + fallback_.calls() == static_cast<size_t>(i + 1); }));
  }
  auto waiting = Complete("q-wait");
  ASSERT_TRUE(Eventually([&] {
    auto r = journal_->Get("q-wait");
    return r.ok() && r->state == journal::State::kQueued;
  }));
  auto refused = Complete("q-refused");
  ASSERT_TRUE(refused->Wait());
  EXPECT_EQ(refused->status(), 503u) << refused->body();
  EXPECT_NE(refused->body().find("its max_queue"), std::string::npos) << refused->body();
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "primary"); };
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "fallback"); };
  for (int i = 0; i < 3; ++i) Send("/v1/requests/q-run-" + std::to_string(i), "", "DELETE")->Wait();
  ASSERT_TRUE(waiting->Wait());
  EXPECT_EQ(waiting->status(), 200u) << waiting->body();
  // The place is given back: the next one is taken.
  auto next = Complete("q-next");
  ASSERT_TRUE(next->Wait());
  EXPECT_EQ(next->status(), 200u) << next->body();
  for (const auto& r : running) EXPECT_TRUE(r->Wait());
}

// With keys, a route open without one (health, readiness, the dashboard's
// files, a preflight) takes no body without one: a body's memory comes from
// the budget every body shares, which keyless callers could hold (eight
// slow 8 MiB uploads to /healthz, and keyed requests got 503).
class KeyedLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "api_keys = [\"k-1234567890abcdef\"]\nallowed_origins = [\"http://app.example\"]\n" + config_text_;
    LifecycleTest::SetUp();
  }
  std::optional<http::Response> Refusal(bhttp::verb method, const std::string& target,
                                        std::vector<std::pair<std::string, std::string>> headers) {
    http::Request req{method, target, 11};
    req.set(bhttp::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    return gateway_->AccessRefusal(req);
  }
};

TEST_F(KeyedLifecycleTest, AnOpenRouteTakesNoBodyWithoutAKey) {
  EXPECT_FALSE(Refusal(bhttp::verb::get, "/healthz", {})) << "health is open";
  EXPECT_FALSE(Refusal(bhttp::verb::options, "/v1/chat/completions", {{"Origin", "http://app.example"}}))
      << "a preflight is open";
  for (const auto& [method, target, headers] :
       std::vector<std::tuple<bhttp::verb, std::string, std::vector<std::pair<std::string, std::string>>>>{
           {bhttp::verb::post, "/healthz", {{"Content-Length", "8388608"}}},
           {bhttp::verb::post, "/ui/app.js", {{"Transfer-Encoding", "chunked"}}},
           {bhttp::verb::options, "/v1/chat/completions", {{"Origin", "http://app.example"}, {"Content-Length", "100"}}}}) {
    auto refusal = Refusal(method, target, headers);
    ASSERT_TRUE(refusal) << target << ": a keyless body was taken";
    EXPECT_EQ(refusal->result_int(), 401u) << target;
  }
  EXPECT_FALSE(Refusal(bhttp::verb::post, "/healthz",
                       {{"Content-Length", "10"}, {"Authorization", "Bearer k-1234567890abcdef"}}))
      << "with its key it goes on (and is answered as the route answers)";
}

// Two clients, each with its own key.
class TwoKeysLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "api_keys = [\"k-aaaaaaaaaaaaaaaa\", \"k-bbbbbbbbbbbbbbbb\"]\n" + config_text_;
    LifecycleTest::SetUp();
  }
  static std::vector<std::pair<std::string, std::string>> Key(char c) {
    std::string bearer = "Bearer k-";
    bearer.append(16, c);  // (not "..." + std::string: GCC 12 warns of a memcpy past its bounds there)
    return {{"Authorization", bearer}};
  }
  json StatusOf(char c) {
    auto st = Send("/v1/status", "", "GET", Key(c));
    EXPECT_TRUE(st->Wait());
    return json::parse(st->body(), nullptr, false);
  }
};

// What one client's request did is not another's to read in the status: the
// id of the request probing a half-open breaker, and the words of a failed
// request's upstream (which may echo its prompt) in the incidents. Both
// reached every key's /v1/status and dashboard.
TEST_F(TwoKeysLifecycleTest, AnotherClientsProbeAndFailureWordsAreNotShown) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  KilledAndBack("chat.0", primary_.server.port());
  auto probe = Complete("r-probe-a", false, Key('a'));
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  const json a = StatusOf('a')["services"][0]["placements"][0]["breaker"];
  EXPECT_EQ(a.value("probe", ""), "r-probe-a") << a.dump();
  const json b = StatusOf('b')["services"][0]["placements"][0]["breaker"];
  EXPECT_FALSE(b.contains("probe")) << b.dump();
  EXPECT_EQ(b.value("probing", false), true) << "that one runs is everyone's to know";
  Answer(primary_.TakeHeld(0), "primary");
  ASSERT_TRUE(probe->Wait());

  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    // (A server's failure, on both: a client's own mistake, a 4xx, is no incident.)
    Refuse(ex, Status::Internal("the prompt 'my secret plan' broke the template"));
  };
  fallback_.behaviour = primary_.behaviour;
  auto failed = Complete("r-fail-a", false, Key('a'));
  ASSERT_TRUE(failed->Wait());
  ASSERT_GE(failed->status(), 500u) << failed->body();
  ASSERT_TRUE(Eventually([&] {
    const std::string mine = StatusOf('a')["incidents"].dump();
    return mine.find("my secret plan") != std::string::npos && mine.find("\"failed\"") != std::string::npos;
  })) << StatusOf('a')["incidents"].dump();
  const json others = StatusOf('b')["incidents"];
  EXPECT_EQ(others.dump().find("my secret plan"), std::string::npos) << others.dump();
  EXPECT_EQ(others.dump().find("r-fail-a"), std::string::npos) << others.dump();
  EXPECT_NE(others.dump().find("\"failed\""), std::string::npos) << "the failure itself is shown: " << others.dump();
}

// Without api_keys the Authorization header proves nothing: a client that
// sent another one with each request had a max_requests_per_key of its own
// per value. The places are its address's; another address has its own.
TEST_F(LifecycleTest, WithoutKeysAClientsPlacesAreItsAddresssWhateverItsAuthorization) {
  config_.max_requests_per_key = 2;  // read per request
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  fallback_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { fallback_.Hold(req, std::move(ex)); };
  std::vector<std::shared_ptr<RecordingExchange>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(Complete("cap-" + std::to_string(i), false, {{"Authorization", "Bearer made-up-" + std::to_string(i)}}));
  }
  ASSERT_TRUE(Eventually([&] { return primary_.calls() + fallback_.calls() == 2; }));
  auto third = Complete("cap-2", false, {{"Authorization", "Bearer made-up-2"}});
  ASSERT_TRUE(third->Wait());
  EXPECT_EQ(third->status(), 429u) << third->body();
  EXPECT_NE(third->body().find("this client address"), std::string::npos) << third->body();
  // Ollama's API takes the same places (it had a cap of its own, shared by every address).
  auto ollama = Send("/api/generate", json{{"model", "chat"}, {"prompt", "hi"}, {"stream", false}}.dump());
  ASSERT_TRUE(ollama->Wait());
  EXPECT_EQ(ollama->status(), 429u) << ollama->body();
  peer_ = "192.168.1.20";
  held.push_back(Complete("cap-other", false, {{"Authorization", "Bearer made-up-0"}}));
  EXPECT_TRUE(Eventually([&] { return primary_.calls() + fallback_.calls() == 3; })) << "another address was refused";
  for (const char* id : {"cap-0", "cap-1", "cap-other"}) Send(std::string("/v1/requests/") + id, "", "DELETE")->Wait();
  for (const auto& r : held) EXPECT_TRUE(r->Wait());
}

// Ollama's API takes the same lifecycle: its request is translated, admitted,
// journaled and failed over like an OpenAI one, and the client hears it in
// Ollama's shape, degraded-service headers included.
TEST_F(LifecycleTest, AnOllamaRequestFailsOverAndItsAnswerSaysSoInOllamasShape) {
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv));
  };
  auto ex = Send("/api/generate", json{{"model", "chat:latest"}, {"prompt", "hello"}, {"raw", true}, {"stream", false},
                                       {"options", {{"num_predict", 8}, {"seed", 7}}}}.dump(),
                 "POST", {{"X-Request-Id", "r-ollama"}});
  ASSERT_TRUE(ex->Wait());
  ASSERT_EQ(ex->status(), 200u) << ex->body();
  const json j = json::parse(ex->body());
  EXPECT_EQ(j["model"], "chat:latest");
  EXPECT_EQ(j["response"], "fallback");
  EXPECT_EQ(j["done"], true);
  EXPECT_EQ(ex->header("X-Spillway-Attempts"), "2");
  EXPECT_NE(ex->header("X-Spillway-Degraded").find("fallback"), std::string::npos);
  ASSERT_EQ(fallback_.calls(), 1u);
  EXPECT_EQ(fallback_.bodies[0]["max_tokens"], 8) << "options.num_predict is the OpenAI request's max_tokens";
  EXPECT_EQ(fallback_.bodies[0]["seed"], 7);
  EXPECT_EQ(fallback_.bodies[0]["prompt"], "hello");
  EXPECT_EQ(Journaled("r-ollama").state, journal::State::kCompleted);
}

TEST_F(LifecycleTest, AnOllamaStreamCutMidwayIsOneNdjsonStream) {
  primary_.behaviour = CutStream({{"a", 11}});
  fallback_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    ex->Write(Chunk("b", 12));
    ex->Write(api::SseEvent({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}}));
    ex->Write(api::kSseDone);
    ex->End();
  };
  const std::string body =  // streams by default
      json{{"model", "chat"}, {"prompt", "hello"}, {"raw", true}, {"options", {{"num_predict", 8}}}}.dump();
  auto ex = Send("/api/generate", body, "POST", {{"Idempotency-Key", "k-ollama"}, {"X-Request-Id", "r-ollama-stream"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_TRUE(ex->streamed());
  EXPECT_EQ(ex->header("Content-Type"), "application/x-ndjson");
  std::vector<json> lines;
  std::istringstream in(ex->body());
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 3u) << ex->body();
  EXPECT_EQ(lines[0]["response"], "a");
  EXPECT_EQ(lines[1]["response"], "b");
  EXPECT_EQ(lines[2]["done"], true);
  EXPECT_EQ(lines[2]["done_reason"], "length");
  // The same key again: the stored stream, replayed whole as the NDJSON it streamed.
  auto again = Send("/api/generate", body, "POST", {{"Idempotency-Key", "k-ollama"}});
  ASSERT_TRUE(again->Wait());
  EXPECT_EQ(again->header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again->header("Content-Type"), "application/x-ndjson");
  EXPECT_NE(again->body().find("\"response\":\"b\""), std::string::npos) << again->body();
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 2u);
}

// A worker takes twice max_body_bytes (and 64 KiB): an Ollama body whose
// translation is larger still (tool calls' arguments escaped once more) is
// the gateway's clear 413, never the worker's after admission.
class SmallBodyLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "max_body_bytes = 1024\n" + config_text_;
    LifecycleTest::SetUp();
  }
};

// A body within max_body_bytes that admission's re-serialization would make
// longer than a worker takes (1e9 is written 1000000000.0) is refused before
// it is journaled, not answered 413 by the worker after admission.
class MibBodyLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = "max_body_bytes = 1048576\n" + config_text_;
    LifecycleTest::SetUp();
  }
};

TEST_F(MibBodyLifecycleTest, ABodyThatWouldOutgrowWhatAWorkerTakesIsRefusedBeforeItIsJournaled) {
  std::string pad;
  for (int i = 0; i < 250'000; ++i) pad += "1e9,";
  pad.pop_back();
  const std::string body = R"({"model": "chat", "prompt": "x", "max_tokens": 4, "pad": [)" + pad + "]}";
  ASSERT_LT(body.size(), 1048576u);
  auto ex = Send("/v1/completions", body, "POST", {{"X-Request-Id", "r-grows"}});
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 413u) << ex->body().substr(0, 300);
  EXPECT_NE(ex->body().find("exceeds what a worker takes"), std::string::npos) << ex->body().substr(0, 300);
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
  EXPECT_FALSE(journal_->Get("r-grows").ok()) << "journaled";
  // A small body with such numbers goes on.
  auto small = Send("/v1/completions", R"({"model": "chat", "prompt": "x", "max_tokens": 4, "pad": [1e9, 2e9]})");
  ASSERT_TRUE(small->Wait());
  EXPECT_EQ(small->status(), 200u) << small->body();
}

// chat and another service on demand on one exclusive device (a simulated
// one of 1 GiB): a start of either evicts the other.
class ExclusiveLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(devices::SimLedger::Create(0, 1ull << 30).ok());
    ASSERT_NO_FATAL_FAILURE(ChatAndOtherOnDemand(/*exclusive=*/true));
    LifecycleTest::SetUp();
  }
  // chat's worker loaded on the device (this process stands for it).
  void ChatLoaded() {
    upstream::WorkerView v;
    v.key = "chat.0";
    v.state = upstream::WorkerState::kReady;
    v.pid = ::getpid();
    v.port = primary_.server.port();
    v.on_demand = true;
    workers_.SetView(v);
  }
  testing::ScopedSimDir sim_{"exclusive-lifecycle"};
};

// A victim that ends while it drains (a crash, an OOM kill) has given its
// room: it is no longer "unloading". It stayed so for good: held back from
// every request and never started again, its service served by its CPU
// path alone until the gateway restarted.
TEST_F(ExclusiveLifecycleTest, AVictimThatEndsWhileItDrainsIsNoLongerUnloading) {
  ChatLoaded();
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto running = Complete("r-drained");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  const Status room = gateway_->RoomFor("other.0", 10u << 20);
  EXPECT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();  // making room: chat drains first
  auto held_back = [&] {
    const json status = StatusNow();
    for (const auto& s : status["residency"]["services"]) {
      if (s.value("key", "") == "chat.0") return s["held_back"];
    }
    return json("not listed");
  };
  EXPECT_NE(held_back().dump().find("unloading"), std::string::npos) << held_back();
  workers_.Exit("chat.0", "signal 9");
  EXPECT_TRUE(held_back().is_null()) << "still unloading after it ended: " << held_back();
  if (auto held = primary_.TakeHeld(0)) Answer(held, "primary");
}

// A load nobody waits for, refused because a peer used as much holds the
// device: the residency view says so in the gate's words, not only "no
// room" (found live: nothing said why an idle peer kept it off).
TEST_F(ExclusiveLifecycleTest, ALoadRefusedForAPeerUsedAsMuchSaysSo) {
  ChatLoaded();
  admission::Demand nobody_waits;
  nobody_waits.awaited = false;
  const Status room = gateway_->RoomFor("other.0", 10u << 20, {}, nobody_waits);
  ASSERT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();
  auto other = testing::ViewOf("other.0", upstream::WorkerState::kBackoff, 0);
  other.last_exit = "not admitted: " + room.message();  // (as the supervisor records a refusal)
  workers_.SetView(other);
  json held = "not listed";
  const json status = StatusNow();
  for (const auto& s : status["residency"]["services"]) {
    if (s.value("key", "") == "other.0") held = s["held_back"];
  }
  EXPECT_NE(held.dump().find("no room on its device now (no room on sim:0: exclusive device: chat is loaded there, used "
                             "as much, and no request waits for this load)"),
            std::string::npos)
      << held;
}

// The start gate judges a load nobody waits for by the requester's own
// use: other, with no request, leaves idle chat loaded; other with a
// request a moment ago (served elsewhere, or given up: nobody waits now)
// is in use, more than chat, and chat gives it the device.
TEST_F(ExclusiveLifecycleTest, TheGateWeighsALoadNobodyWaitsForByItsRequestersUse) {
  ChatLoaded();
  workers_.SetView(testing::ViewOf("other.0", upstream::WorkerState::kBackoff, 0));
  EXPECT_FALSE(gateway_->StartGate("other.0", nullptr).ok());
  EXPECT_EQ(workers_.StateOf("chat.0"), upstream::WorkerState::kReady) << "chat unloaded for a service nobody used";
  auto asked = Send("/v1/completions", json{{"model", "other"}, {"prompt", "x"}, {"max_tokens", 2}}.dump(), "POST",
                    {{"X-Request-Id", "r-other"}});
  ASSERT_TRUE(Eventually([&] {
    auto q = Send("/v1/requests/r-other", "", "GET");
    return q->Wait() && q->status() == 200u;
  }));
  auto cancel = Send("/v1/requests/r-other", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(asked->Wait());  // (nobody waits for other's load now)
  (void)gateway_->StartGate("other.0", nullptr);
  EXPECT_EQ(workers_.StateOf("chat.0"), upstream::WorkerState::kStopped) << "chat kept the device from a service in use";
}

// chat and another service of its priority, both on demand, on a shared
// device (a simulated one of 1 GiB) that holds one of them: chat loaded
// there and busy, other's request waiting for its load.
class FairTurnLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(devices::SimLedger::Create(0, 1ull << 30).ok());
    auto l = devices::SimLedger::Open(0);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ledger_ = std::move(*l);
    ASSERT_TRUE(ledger_->Reserve(devices::LedgerKind::kAlloc, "chat.0", 800u << 20));  // this process stands for chat's worker
    ASSERT_NO_FATAL_FAILURE(ChatAndOtherOnDemand(/*exclusive=*/false));
    const size_t chat_residency = config_text_.find("residency = \"on_demand\"\n");  // (chat's: the first service)
    config_text_.insert(chat_residency, chat_turn_);
    config_text_ += "[[service]]\nname = \"third\"\nmodel = \"/nonexistent/third.gguf\"\nresidency = \"on_demand\"\n"
                    "[[service.placement]]\ndevice = \"sim:0\"\nctx = 256\nslots = 1\n";
    workers_.SetOnDemand("third.0");
    workers_.SetView(testing::ViewOf("third.0", upstream::WorkerState::kStopped, 0));
    workers_.SetView(testing::ViewOf("other.0", upstream::WorkerState::kStopped, 0));
    LifecycleTest::SetUp();
    upstream::WorkerView v = testing::ViewOf("chat.0", upstream::WorkerState::kReady, ::getpid());
    v.port = primary_.server.port();
    v.on_demand = true;
    v.ready_since_ms = clock_.NowMs();
    workers_.SetView(v);
  }
  void TearDown() override {
    if (ledger_) ledger_->Release(devices::LedgerKind::kAlloc, "chat.0", ~0ull);
    LifecycleTest::TearDown();
  }
  // Whether chat is being unloaded, as the residency view says.
  bool ChatUnloading() {
    const json status = StatusNow();
    for (const auto& s : status["residency"]["services"]) {
      if (s.value("key", "") == "chat.0") return s["held_back"].dump().find("unloading") != std::string::npos;
    }
    return false;
  }
  // A completion for service `model`, which waits for its load.
  std::shared_ptr<RecordingExchange> Ask(const std::string& model, const std::string& id) {
    return Send("/v1/completions", json{{"model", model}, {"prompt", "x"}, {"max_tokens", 2}}.dump(), "POST",
                {{"X-Request-Id", id}});
  }
  static constexpr uint64_t kNeed = 500u << 20;  // what other's or third's load needs
  std::string chat_turn_;  // chat's fair_turn_s line, if any (set before SetUp)
  testing::ScopedSimDir sim_{"fair-turn-lifecycle"};
  std::unique_ptr<devices::SimLedger> ledger_;
};

// Kept busy, chat gives the device to other once it has served a turn and
// other's request has waited one (admission::kFairTurnMs): it is drained
// (its running request ends first). Before, a busy service gave way only
// to a higher priority, and other's requests waited until they timed out
// for as long as chat's traffic lasted.
TEST_F(FairTurnLifecycleTest, ABusyServiceGivesTheDeviceToAPeerWhoseRequestsWaitedATurn) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto running = Complete("r-busy");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  clock_.Advance(20'000);  // chat has served 20 s when other's request comes
  auto waiting = Ask("other", "r-other");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("other.0") > 0; }));
  EXPECT_EQ(gateway_->LoadDemand("other.0").waited_ms, 0);
  Status room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();
  EXPECT_NE(room.message().find("busy with its priority: chat, which gives way once it has served 30 s"),
            std::string::npos)
      << room.ToString();
  EXPECT_FALSE(ChatUnloading());
  clock_.Advance(admission::kFairTurnMs - 1000);  // chat has served 49 s, but other's request waited 29
  room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();
  EXPECT_FALSE(ChatUnloading()) << "drained before its turn was over";
  clock_.Advance(1000);
  EXPECT_GE(gateway_->LoadDemand("other.0").waited_ms, admission::kFairTurnMs);
  room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_NE(room.message().find("unloading chat (800 MiB, draining"), std::string::npos) << room.ToString();
  EXPECT_TRUE(ChatUnloading()) << "chat kept the device from a peer whose request waited a turn";
  if (auto held = primary_.TakeHeld(0)) Answer(held, "primary");
  ASSERT_TRUE(running->Wait());
  EXPECT_EQ(running->status(), 200u) << "the drained service's running request was not served: " << running->body();
  auto cancel = Send("/v1/requests/r-other", "", "DELETE");
  ASSERT_TRUE(cancel->Wait());
  ASSERT_TRUE(waiting->Wait());
}

// A service that a placement serves already has its turn: its requests
// queued for a slot there give another placement's load no wait for one.
TEST_F(FairTurnLifecycleTest, AServiceAlreadyServingWaitsForASlotNotForATurn) {
  auto running = TakeEveryPlace("r-busy");
  ASSERT_EQ(running.size(), 3u);
  auto queued = Complete("r-queued");
  ASSERT_TRUE(ToldWhyItWaits("r-queued"));
  clock_.Advance(2 * admission::kFairTurnMs);
  EXPECT_EQ(gateway_->LoadDemand("chat.0").waited_ms, 0) << "its queued request counted as waiting for a turn";
  for (size_t i = 0; i < 3; ++i) {
    if (auto held = primary_.TakeHeld(i)) Answer(held, "primary");
    if (auto held = fallback_.TakeHeld(i)) Answer(held, "fallback");
  }
  ASSERT_TRUE(Send("/v1/requests/r-queued", "", "DELETE")->Wait());
  ASSERT_TRUE(queued->Wait());
  for (auto& r : running) ASSERT_TRUE(r->Wait());
}

// With two services waiting for chat's turn, the one whose request waited
// longer gets it, whichever asks first (the supervisor asks in key order,
// and the first to ask took every turn).
TEST_F(FairTurnLifecycleTest, TheTurnGoesToWhoseRequestsWaitedLongest) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto running = Complete("r-busy");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  auto first = Ask("third", "r-third");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("third.0") > 0; }));
  workers_.SetView(testing::ViewOf("third.0", upstream::WorkerState::kBackoff, 0));  // its start wanted, refused for room
  clock_.Advance(10'000);
  auto second = Ask("other", "r-other");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("other.0") > 0; }));
  clock_.Advance(admission::kFairTurnMs);  // chat served 40 s; third's request waited 40 s, other's 30 s
  Status room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();
  EXPECT_NE(room.message().find("the next turn is third's, whose requests waited longer"), std::string::npos)
      << room.ToString();
  EXPECT_FALSE(ChatUnloading()) << "the turn went to other, whose request waited less";
  room = gateway_->RoomFor("third.0", kNeed, {}, gateway_->LoadDemand("third.0"));
  EXPECT_NE(room.message().find("unloading chat (800 MiB, draining"), std::string::npos) << room.ToString();
  EXPECT_TRUE(ChatUnloading());
  if (auto held = primary_.TakeHeld(0)) Answer(held, "primary");
  ASSERT_TRUE(running->Wait());
  for (const char* id : {"r-third", "r-other"}) ASSERT_TRUE(Send(std::string("/v1/requests/") + id, "", "DELETE")->Wait());
  ASSERT_TRUE(first->Wait());
  ASSERT_TRUE(second->Wait());
}

// Chat's own turn (fair_turn_s = 60) is what it serves before it gives way.
class LongFairTurnLifecycleTest : public FairTurnLifecycleTest {
 protected:
  LongFairTurnLifecycleTest() { chat_turn_ = "fair_turn_s = 60\n"; }
};

TEST_F(LongFairTurnLifecycleTest, ABusyServiceServesItsOwnTurn) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto running = Complete("r-busy");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  auto waiting = Ask("other", "r-other");
  ASSERT_TRUE(Eventually([&] { return workers_.demanded("other.0") > 0; }));
  clock_.Advance(2 * admission::kFairTurnMs - 1000);  // both 59 s: past the default turn, not chat's
  Status room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_EQ(room.code(), StatusCode::kResourceExhausted) << room.ToString();
  EXPECT_NE(room.message().find("which gives way once it has served 60 s"), std::string::npos) << room.ToString();
  EXPECT_FALSE(ChatUnloading()) << "drained after the default turn, not its own";
  clock_.Advance(1000);
  room = gateway_->RoomFor("other.0", kNeed, {}, gateway_->LoadDemand("other.0"));
  EXPECT_NE(room.message().find("unloading chat (800 MiB, draining"), std::string::npos) << room.ToString();
  EXPECT_TRUE(ChatUnloading());
  if (auto held = primary_.TakeHeld(0)) Answer(held, "primary");
  ASSERT_TRUE(running->Wait());
  ASSERT_TRUE(Send("/v1/requests/r-other", "", "DELETE")->Wait());
  ASSERT_TRUE(waiting->Wait());
}

// Another service on the same device: its failures there count against the
// device's breaker, which stops every placement on the device.
class SharedDeviceLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ += "[[service]]\nname = \"other\"\nmodel = \"/nonexistent/other.gguf\"\n"
                    "[[service.placement]]\ndevice = \"sim:0\"\nctx = 256\nslots = 1\n";
    workers_.SetReady("other.0", other_.server.port());
    other_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
      Refuse(ex, Status::Unavailable("device lost").WithPhase(FailurePhase::kDevice));
    };
    LifecycleTest::SetUp();
  }
  Worker other_;
};

// A device's open breaker sends a service's requests to its fallback though
// its own placement's breaker is closed and its worker ready: the status
// says so (it read "ready, served by its primary placement").
TEST_F(SharedDeviceLifecycleTest, ADevicesOpenBreakerShowsItsServicesDegraded) {
  auto lost = Send("/v1/completions", json{{"model", "other"}, {"prompt", "x"}, {"max_tokens", 4}}.dump());
  auto status = [&] {
    auto st = Send("/v1/status", "", "GET");
    EXPECT_TRUE(st->Wait());
    return json::parse(st->body(), nullptr, false);
  };
  // (It waits, its one placement ejected: the stepped clock never ends that.)
  ASSERT_TRUE(Eventually([&] {
    return status()["services"][0]["placements"][0]["device_breaker"].value("state", "") == "open";
  })) << status().dump();
  auto ex = Complete("r-after");
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->header("X-Spillway-Placement"), "cpu") << "the device's breaker is open";
  const json chat = status()["services"][0];
  EXPECT_EQ(chat["placements"][0]["breaker"]["state"], "closed");
  EXPECT_EQ(chat["placements"][0]["device_breaker"]["state"], "open");
  EXPECT_EQ(chat["state"], "degraded") << chat.dump();
  EXPECT_EQ(chat["serving"]["placement"], "cpu") << chat["serving"].dump();
  EXPECT_NE(chat["degraded"].get<std::string>().find("its device's breaker is open"), std::string::npos)
      << chat["degraded"].dump();
}

// A lone placement (no fallback) whose half-open breaker one request
// probes: the next request waits, told why (but not the probe's id: a caller
// sees only its own), and goes once the probe answers.
TEST_F(SharedDeviceLifecycleTest, ALonePlacementsNextRequestWaitsForItsProbe) {
  other_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { other_.Hold(req, std::move(ex)); };
  KilledAndBack("other.0", other_.server.port());
  auto send = [&](const std::string& id) {
    return Send("/v1/completions", json{{"model", "other"}, {"prompt", "x"}, {"max_tokens", 4}}.dump(), "POST",
                {{"X-Request-Id", id}});
  };
  auto probe = send("o-probe");
  ASSERT_TRUE(Eventually([&] { return other_.calls() == 1; }));
  auto next = send("o-next");
  ASSERT_TRUE(ToldWhyItWaits("o-next"));
  auto q = Send("/v1/requests/o-next", "", "GET");
  ASSERT_TRUE(q->Wait());
  const std::string reason = json::parse(q->body())["queue"]["reason"];
  EXPECT_NE(reason.find("one request probes it first"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("o-probe"), std::string::npos) << "another caller's request id: " << reason;
  EXPECT_EQ(other_.calls(), 1u) << "went beside the probe";
  Answer(other_.TakeHeld(0), "other");
  ASSERT_TRUE(probe->Wait());
  ASSERT_TRUE(Eventually([&] { return other_.calls() == 2; })) << "the probe's answer closed it";
  Answer(other_.TakeHeld(1), "other");
  ASSERT_TRUE(next->Wait());
  EXPECT_EQ(next->status(), 200u) << next->body();
}

// A device's probe that ends, with its answer or without a result
// (cancelled), lets the requests of every service on the device go at once:
// a request of another service waiting for that probe goes then, not at its
// next look (within 1 s).
TEST_F(SharedDeviceLifecycleTest, ADeviceProbesEndLetsAnotherServicesRequestGoAtOnce) {
  other_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) { Answer(ex, "other"); };
  size_t primary_calls = 0, other_calls = 0;
  // The device is lost, its ejection passes, and chat's request "r-probe-<n>"
  // probes it (held by its worker) while o-next-<n> waits for it; `end` ends the probe.
  auto round = [&](int n, int64_t ejection_ms, const std::function<void()>& end) {
    const std::string probe_id = "r-probe-" + std::to_string(n), next_id = "o-next-" + std::to_string(n);
    primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
      Refuse(ex, Status::Unavailable("device lost").WithPhase(FailurePhase::kDevice));
    };
    auto lost = Complete("r-lost-" + std::to_string(n));
    ASSERT_TRUE(lost->Wait());
    ASSERT_EQ(lost->header("X-Spillway-Placement"), "cpu") << lost->body();
    ASSERT_EQ(StatusNow()["devices"][0]["breaker"]["state"], "open");
    clock_.Advance(ejection_ms);
    primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
    primary_calls += 2;
    auto probe = Complete(probe_id);
    ASSERT_TRUE(Eventually([&] { return primary_.calls() == primary_calls; }));
    ASSERT_EQ(StatusNow()["devices"][0]["breaker"]["probe"], probe_id);
    auto next = Send("/v1/completions", json{{"model", "other"}, {"prompt", "x"}, {"max_tokens", 4}}.dump(), "POST",
                     {{"X-Request-Id", next_id}});
    ASSERT_TRUE(ToldWhyItWaits(next_id));
    EXPECT_EQ(other_.calls(), other_calls) << "went beside the device's probe";
    end();
    // (Woken by the probe's end: its next look, within 1 s, is too late here.)
    EXPECT_TRUE(Eventually([&] { return other_.calls() == other_calls + 1; }, std::chrono::milliseconds(500)))
        << "round " << n << ": the other service's request was not woken by the device probe's end";
    ++other_calls;
    ASSERT_TRUE(next->Wait());
    EXPECT_EQ(next->status(), 200u) << next->body();
    ASSERT_TRUE(probe->Wait());
  };
  round(1, 30'000, [&] {
    auto cancel = Send("/v1/requests/r-probe-1", "", "DELETE");
    ASSERT_TRUE(cancel->Wait());
  });
  round(2, 60'000, [&] { Answer(primary_.TakeHeld(primary_calls - 1), "primary"); });
}

TEST_F(SmallBodyLifecycleTest, AnOllamaBodyTooLargeOnceTranslatedIsA413) {
  const json call = {{"function", {{"name", "write"}, {"arguments", {{"text", std::string(40000, '"')}}}}}};
  const json body = {{"model", "chat"},
                     {"stream", false},
                     {"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", ""}, {"tool_calls", {call}}}}}};
  auto ex = Send("/api/chat", body.dump());
  ASSERT_TRUE(ex->Wait());
  EXPECT_EQ(ex->status(), 413u) << ex->body();
  EXPECT_NE(ex->body().find("as translated for the model"), std::string::npos) << ex->body();
  EXPECT_EQ(primary_.calls() + fallback_.calls(), 0u);
}

TEST_F(LifecycleTest, OllamasErrorsHaveOllamasShape) {
  auto unknown = Send("/api/chat", json{{"model", "nope"}, {"messages", json::array()}}.dump());
  ASSERT_TRUE(unknown->Wait());
  EXPECT_EQ(unknown->status(), 404u);
  EXPECT_EQ(json::parse(unknown->body()), json({{"error", "model 'nope' not found"}}));
  auto bad = Send("/api/generate", json{{"model", "chat"}, {"prompt", "x"}, {"keep_alive", -1},
                                        {"options", {{"temperature", 9}}}}.dump());
  ASSERT_TRUE(bad->Wait());
  EXPECT_EQ(bad->status(), 400u);
  EXPECT_EQ(bad->header("X-Spillway-Keep-Alive"), "") << "a refused request's keep_alive was applied";
  // Refused past the translation (its X-Request-Timeout): nothing applied either.
  config_.services[0].residency.mode = "keep_alive";  // (read per request) a service whose keep_alive acts
  auto late = Send("/api/generate", json{{"model", "chat"}, {"prompt", "x"}, {"keep_alive", -1}}.dump(), "POST",
                   {{"X-Request-Timeout", "abc"}});
  ASSERT_TRUE(late->Wait());
  EXPECT_EQ(late->status(), 400u) << late->body();
  EXPECT_EQ(late->header("X-Spillway-Keep-Alive"), "") << "a refused request's keep_alive was applied";
  config_.services[0].residency.mode = "pinned";
  EXPECT_NE(json::parse(bad->body())["error"].get<std::string>().find("'options.temperature'"), std::string::npos)
      << bad->body();
  // The worker's own refusal, translated.
  primary_.behaviour = [](http::Request&, std::shared_ptr<http::Exchange> ex) {
    Refuse(ex, Status::InvalidArgument("prompt too long"));
  };
  auto refused = Send("/api/generate", json{{"model", "chat"}, {"prompt", "x"}, {"raw", true}, {"stream", false},
                                            {"options", {{"num_predict", 8}}}}.dump());
  ASSERT_TRUE(refused->Wait());
  EXPECT_EQ(refused->status(), 400u);
  EXPECT_EQ(json::parse(refused->body()), json({{"error", "prompt too long"}}));
  EXPECT_EQ(fallback_.calls(), 0u);
}

// Ollama's num_predict is an upper bound: none generates to the end of the
// context, and one past the service's cap or the context's room is lowered
// to it, never refused. Every Ollama chat without num_predict (Open WebUI's,
// ollama-python's default) was cut at the service's default_max_tokens (256),
// and a num_predict the context had no room for was a 400.
// A request the CPU path refuses (here: its prompt over the path's bound)
// while the accelerator placement is only busy waits for that one, as it
// would without a CPU path. It was a 503 at once ("the accelerator path is
// unavailable"), though the accelerator freed a slot moments later.
class CpuPromptBoundLifecycleTest : public LifecycleTest {
 protected:
  void SetUp() override {
    const std::string table = "[service.cpu_path]\n";
    config_text_.insert(config_text_.find(table) + table.size(), "max_prompt_tokens = 2\n");
    LifecycleTest::SetUp();
  }
};

TEST_F(CpuPromptBoundLifecycleTest, ARefusalOfTheCpuPathBesideABusyAcceleratorIsAWait) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  auto a = Complete("p-a");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));  // (in this order: p-a is held first)
  auto b = Complete("p-b");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; })) << "both slots of the accelerator taken";
  auto c = Complete("p-c");
  EXPECT_FALSE(c->Wait(std::chrono::milliseconds(300))) << "refused at once: " << c->body();
  Answer(primary_.TakeHeld(0), "a");
  ASSERT_TRUE(a->Wait());
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 3; })) << "it never went to the freed slot: " << c->received();
  Answer(primary_.TakeHeld(2), "c");
  ASSERT_TRUE(c->Wait());
  EXPECT_EQ(c->status(), 200u) << c->body();
  EXPECT_EQ(c->header("X-Spillway-Placement"), "sim:0/0");
  EXPECT_EQ(fallback_.calls(), 0u);
  Answer(primary_.TakeHeld(1), "b");
  ASSERT_TRUE(b->Wait());
}

// The same beside an accelerator held back only while one request probes
// its half-open breaker: busy, not gone. It was a 503 at once.
TEST_F(CpuPromptBoundLifecycleTest, ARefusalOfTheCpuPathBesideAProbedAcceleratorIsAWait) {
  primary_.behaviour = [this](http::Request& req, std::shared_ptr<http::Exchange> ex) { primary_.Hold(req, std::move(ex)); };
  KilledAndBack("chat.0", primary_.server.port());
  auto probe = Complete("p-probe");
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 1; }));
  auto c = Complete("p-c");
  EXPECT_FALSE(c->Wait(std::chrono::milliseconds(300))) << "refused at once: " << c->body();
  Answer(primary_.TakeHeld(0), "probe");
  ASSERT_TRUE(probe->Wait());
  ASSERT_TRUE(Eventually([&] { return primary_.calls() == 2; })) << "it never went to the primary: " << c->received();
  Answer(primary_.TakeHeld(1), "c");
  ASSERT_TRUE(c->Wait());
  EXPECT_EQ(c->status(), 200u) << c->body();
  EXPECT_EQ(fallback_.calls(), 0u);
}

class OllamaNumPredictTest : public LifecycleTest {
 protected:
  void SetUp() override {
    config_text_ = std::string(kConfig);
    config_text_.replace(config_text_.find("max_tokens = 64"), 15, "max_tokens = 4096");
    LifecycleTest::SetUp();
  }
  json SentFor(const json& options) {
    const size_t before = primary_.calls();
    json body = {{"model", "chat"}, {"prompt", "x"}, {"stream", false}};
    if (!options.is_null()) body["options"] = options;
    auto ex = Send("/api/generate", body.dump());
    EXPECT_TRUE(ex->Wait());
    EXPECT_EQ(ex->status(), 200u) << ex->body();
    std::lock_guard<std::mutex> lk(primary_.mu);
    return primary_.bodies.size() > before ? primary_.bodies.back() : json();
  }
};

TEST_F(OllamaNumPredictTest, IsAnUpperBoundLoweredToTheRoomInTheContext) {
  // 256 cells in 2 slots: 128 a request, 5 of them the prompt's (the fake worker's count).
  const json none = SentFor(nullptr);
  EXPECT_EQ(none["max_tokens"], 123) << none.dump();
  EXPECT_EQ(none["spillway_fit_context"], true);
  EXPECT_EQ(SentFor({{"num_predict", -1}})["max_tokens"], 123);
  EXPECT_EQ(SentFor({{"num_predict", 1000}})["max_tokens"], 123) << "past the room: lowered, not refused";
  EXPECT_EQ(SentFor({{"num_predict", 100000}})["max_tokens"], 123) << "past the service's cap too";
  EXPECT_EQ(SentFor({{"num_predict", 8}})["max_tokens"], 8) << "within the room: as asked";
  // The OpenAI API keeps its contract: max_tokens past the room is refused.
  auto strict = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 1000}}.dump());
  ASSERT_TRUE(strict->Wait());
  EXPECT_EQ(strict->status(), 400u) << strict->body();
  // One that asks for none gets default_max_tokens (256), or the room beside
  // its prompt when less: it was refused for a max_tokens it never sent.
  auto unset = Send("/v1/completions", json{{"model", "chat"}, {"prompt", "x"}}.dump());
  ASSERT_TRUE(unset->Wait());
  EXPECT_EQ(unset->status(), 200u) << unset->body();
  std::lock_guard<std::mutex> lk(primary_.mu);
  EXPECT_EQ(primary_.bodies.back()["max_tokens"], 123) << primary_.bodies.back().dump();
}

}  // namespace
}  // namespace spillway::gateway
