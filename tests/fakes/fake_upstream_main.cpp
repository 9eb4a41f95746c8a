// fake-upstream: a small HTTP server standing in for an external service
// (whisper-server, an image server, another OpenAI-compatible server) in the
// gateway's integration tests. It does what a test asks of each request:
//
//   fake-upstream --port P [--log FILE] [--sim-device N --resident-mib M]
//                 [--ready-after-ms T] [--crash-at-health N]
//
//   GET  /health     200 once ready (after --ready-after-ms), 503 before;
//                    with --crash-at-health, exit(3) instead of its Nth
//                    answer (a server that crashes soon after it is ready)
//   POST (any path)  answers JSON: the path, content type, body size and
//                    SHA-256, the request's X-Request-Id (and X-Request-Timeout) and how many
//                    requests this process has seen. The body (JSON, or a
//                    multipart form's fields) may ask for:
//                      fake_delay_ms    answer after this long
//                      fake_crash       exit(3) before answering (after reading the request)
//                      fake_stream      N: answer as N server-sent events, 50 ms apart
//                      fake_cut         with fake_stream: exit(3) after the events, the stream unended
//                      fake_audio_mib   N: answer audio/wav of N MiB, streamed a MiB at a time
//                      fake_status      answer with this HTTP status
//                      fake_transient_mib  hold this much more on the sim device while answering
//
// Every request received is appended to --log as a line "<X-Request-Id> <path>"
// before it is acted on, so a test can count deliveries across restarts.
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "api/http_server.h"
#include "common/hash.h"
#include "devices/sim_ledger.h"
#include "gateway/external_route.h"

namespace {

using spillway::http::Exchange;
using spillway::http::Request;
using json = nlohmann::json;

struct Options {
  uint16_t port = 0;
  std::string log;
  int sim_device = -1;
  double resident_mib = 0;
  int64_t ready_after_ms = 0;
  int crash_at_health = 0;
};

std::string Field(const Request& req, const json& body, const std::string& name) {
  if (body.is_object() && body.contains(name)) {
    const auto& v = body[name];
    return v.is_string() ? v.get<std::string>() : v.dump();
  }
  const std::string boundary = spillway::gateway::MultipartBoundary(std::string(req[boost::beast::http::field::content_type]));
  return spillway::gateway::MultipartField(req.body(), boundary, name).value_or("");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--port") o.port = static_cast<uint16_t>(std::atoi(v.c_str()));
    else if (k == "--log") o.log = v;
    else if (k == "--sim-device") o.sim_device = std::atoi(v.c_str());
    else if (k == "--resident-mib") o.resident_mib = std::atof(v.c_str());
    else if (k == "--ready-after-ms") o.ready_after_ms = std::atoll(v.c_str());
    else if (k == "--crash-at-health") o.crash_at_health = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "fake-upstream: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::unique_ptr<spillway::devices::SimLedger> ledger;
  if (o.sim_device >= 0) {
    auto l = spillway::devices::SimLedger::Open(o.sim_device);
    if (!l.ok()) {
      std::fprintf(stderr, "fake-upstream: %s\n", l.status().message().c_str());
      return 2;
    }
    ledger = std::move(*l);
    if (o.resident_mib > 0 && !ledger->Reserve(spillway::devices::LedgerKind::kAlloc, "resident",
                                               static_cast<uint64_t>(o.resident_mib * (1 << 20)))) {
      std::fprintf(stderr, "fake-upstream: no room for its resident memory on sim:%d\n", o.sim_device);
      return 3;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  std::atomic<int> seen{0}, health_seen{0};
  boost::asio::io_context ioc;
  spillway::http::ServerOptions so;
  so.max_body_bytes = 64 << 20;
  spillway::http::Server server(ioc, so, [&](Request req, std::shared_ptr<Exchange> ex) {
    const std::string path(req.target());
    if (req.method() == boost::beast::http::verb::get && path == "/health") {
      if (++health_seen == o.crash_at_health) _exit(3);
      const bool ready = std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(o.ready_after_ms);
      ex->Respond(spillway::http::MakeResponse(ready ? 200 : 503, ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}",
                                               "application/json", req.version()));
      return;
    }
    const int n = ++seen;
    const std::string id(req["X-Request-Id"]);
    if (!o.log.empty()) {
      std::ofstream(o.log, std::ios::app) << id << " " << path << "\n" << std::flush;
    }
    const json body = json::parse(req.body(), nullptr, false);
    if (!Field(req, body, "fake_crash").empty()) _exit(3);
    const int64_t delay = std::atoll(Field(req, body, "fake_delay_ms").c_str());
    const int events = std::atoi(Field(req, body, "fake_stream").c_str());
    const bool cut = !Field(req, body, "fake_cut").empty();
    const int audio_mib = std::atoi(Field(req, body, "fake_audio_mib").c_str());
    const int status = std::atoi(Field(req, body, "fake_status").c_str());
    const double transient = std::atof(Field(req, body, "fake_transient_mib").c_str());
    json answer = {{"path", path},
                   {"content_type", std::string(req[boost::beast::http::field::content_type])},
                   {"body_bytes", req.body().size()},
                   {"body_sha256", spillway::Sha256Hex(req.body())},
                   {"request_id", id},
                   {"request_timeout", std::string(req["X-Request-Timeout"])},
                   {"model", Field(req, body, "model")},
                   {"seen", n}};
    // Answered from a thread of its own: a delay holds no other request.
    std::thread([&ledger, ex, answer, delay, events, cut, audio_mib, status, transient, v = req.version()] {
      const auto bytes = static_cast<uint64_t>(transient * (1 << 20));
      bool held = false;
      if (ledger && bytes > 0) held = ledger->Reserve(spillway::devices::LedgerKind::kAlloc, "transient", bytes);
      if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      if (audio_mib > 0) {
        ex->StartStream(spillway::http::MakeResponse(200, "", "audio/wav", v));
        for (int i = 0; i < audio_mib; ++i) {
          while (ex->unsent_bytes() > (8 << 20)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ex->Write(std::string(1 << 20, static_cast<char>('a' + i % 26)));
        }
        ex->End();
      } else if (events > 0) {
        ex->StartStream(spillway::http::MakeResponse(200, "", "text/event-stream", v));
        for (int i = 0; i < events; ++i) {
          ex->Write("data: {\"event\":" + std::to_string(i) + "}\n\n");
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (cut) _exit(3);
        ex->Write("data: [DONE]\n\n");
        ex->End();
      } else {
        auto res = spillway::http::MakeResponse(status > 0 ? static_cast<unsigned>(status) : 200, answer.dump(),
                                                "application/json", v);
        if (status == 429 || status == 503) res.set(boost::beast::http::field::retry_after, "7");  // (busy: a server's own)
        ex->Respond(std::move(res));
      }
      if (held) ledger->Release(spillway::devices::LedgerKind::kAlloc, "transient", bytes);
    }).detach();
  });
  if (auto st = server.Listen("127.0.0.1", o.port); !st.ok()) {
    std::fprintf(stderr, "fake-upstream: %s\n", st.message().c_str());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::printf("fake-upstream listening on %u\n", server.port());
  std::fflush(stdout);
  ioc.run();
  return 0;
}
