#include "cli/status_command.h"

#include "common/utf8.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "config/config.h"

namespace spillway::cli {

using nlohmann::json;

namespace {

// A request id as one path segment: every byte but the unreserved ones
// percent-encoded (the gateway decodes it). Sent as typed, "ID?x" asked for
// request ID, and CR/LF went into the request line.
std::string PathSegment(const std::string& id) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : id) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ':') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct Target {
  std::string url, config_path;
  bool json_out = false;
};

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// "http://127.0.0.1:8480", "127.0.0.1:8480", "http://[::1]:8480/", "localhost:8480".
StatusOr<Endpoint> ParseUrl(std::string url) {
  if (url.rfind("http://", 0) == 0) url = url.substr(7);
  else if (url.find("://") != std::string::npos) return Status::InvalidArgument("--url must be http://HOST:PORT");
  if (auto slash = url.find('/'); slash != std::string::npos) url = url.substr(0, slash);
  Endpoint e;
  if (!config::SplitHostPort(url, &e.host, &e.port) || e.port == 0) {
    return Status::InvalidArgument("--url must be http://HOST:PORT (got '" + url + "')");
  }
  if (e.host.size() > 1 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  if (e.host == "localhost") e.host = "127.0.0.1";
  return e;
}

StatusOr<Endpoint> Resolve(const Target& t) {
  if (!t.url.empty()) return ParseUrl(t.url);
  if (!t.config_path.empty()) {
    auto cfg = config::LoadConfigFile(t.config_path);
    if (!cfg.ok()) return cfg.status();
    Endpoint e{cfg->listen_host, cfg->listen_port};
    if (e.host == "0.0.0.0") e.host = "127.0.0.1";
    if (e.host == "::") e.host = "::1";
    return e;
  }
  return ParseUrl("http://127.0.0.1:8480");
}

// One call to the gateway; its JSON answer, or why there is none.
StatusOr<json> Call(const Target& t, const std::string& method, const std::string& path) {
  auto ep = Resolve(t);
  if (!ep.ok()) return ep.status();
  http::HeaderList headers;
  if (const char* key = std::getenv("SPILLWAY_API_KEY"); key && *key) headers.emplace_back("Authorization", std::string("Bearer ") + key);
  auto r = http::Fetch(ep->host, ep->port, method, path, "", headers, std::chrono::seconds(10));
  if (!r.ok()) {
    // (One started on another address, or on port 0, is not found here by itself.)
    const std::string hint = t.url.empty() ? " (is it running? one on another address: --url http://HOST:PORT, or "
                                             "--config with its spillway.toml)"
                                           : " (is it running?)";
    return Status::Unavailable("no gateway answers at " + ep->host + ":" + std::to_string(ep->port) + ": " +
                               r.status().message() + hint);
  }
  json body = json::parse(r->body, nullptr, false);
  if (r->status >= 300) {
    // OpenAI's shape ({"error": {"message"}}), Ollama's ({"error": "..."}), or the body as it came.
    std::string why = r->body;
    if (body.is_object() && body.contains("error")) {
      const json& e = body["error"];
      if (e.is_string()) why = e.get<std::string>();
      if (e.is_object() && e.contains("message") && e["message"].is_string()) why = e["message"].get<std::string>();
    }
    return Status::Unavailable("the gateway answered " + std::to_string(r->status) + ": " + why +
                               (r->status == 401 ? " (set $SPILLWAY_API_KEY)" : ""));
  }
  if (!body.is_object()) return Status::Unavailable("the answer at " + path + " is not a Spillway gateway's (not a JSON object)");
  return body;
}

std::string Mib(const json& bytes) {
  if (!bytes.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes.get<double>() / (1024.0 * 1024.0));
  return buf;
}

std::string Age(const json& ms) {
  if (!ms.is_number()) return "-";
  const int64_t s = ms.get<int64_t>() / 1000;
  if (s < 60) return std::to_string(s) + " s";
  return std::to_string(s / 60) + " min " + std::to_string(s % 60) + " s";
}

std::string Clock(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

// Columns padded to their widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      if (i >= width.size()) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) line += r[i] + (i + 1 < r.size() ? std::string(width[i] - r[i].size() + 2, ' ') : "");
    out += line + "\n";
  }
  return out;
}

std::string Str(const json& j, const char* key, const std::string& fallback = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::string RequestsTable(const json& requests) {
  std::vector<std::vector<std::string>> rows = {{"REQUEST", "SERVICE", "PHASE", "POS", "AGE", "PLACEMENT", "ATTEMPTS"}};
  for (const auto& r : requests) {
    rows.push_back({Str(r, "id"), Str(r, "service"), Str(r, "phase") == "queued" ? "waiting" : Str(r, "phase"),
                    r.contains("position") ? Str(r, "position") : "", Age(r.value("age_ms", json())),
                    Str(r, "placement", "") .empty() ? "-" : Str(r, "placement"), Str(r, "attempts", "0")});
  }
  return requests.empty() ? "no request is running or waiting\n" : Table(rows);
}

}  // namespace

std::string StatusTable(const json& status) {
  std::ostringstream os;
  std::vector<std::vector<std::string>> rows = {{"SERVICE", "STATE", "SERVING", "MODEL", "RUNNING", "WAITING", "EST. WAIT"}};
  std::vector<std::string> notes;
  for (const auto& s : status.value("services", json::array())) {
    const json v = s.value("serving", json::object());
    const json r = s.value("requests", json::object());
    std::string wait = "-";
    if (v.contains("est_wait_s") && v["est_wait_s"].is_number() && v["est_wait_s"].get<double>() >= 1) wait = "~" + std::to_string(static_cast<int>(v["est_wait_s"].get<double>() + 0.999)) + " s";
    rows.push_back({Str(s, "name"), Str(s, "state"), v.contains("placement") ? Str(v, "placement") + " (" + Str(v, "role") + ")" : "-",
                    Str(v, "model"), Str(r, "running", "0"), Str(r, "queued", "0"), wait});
    if (Str(s, "state") != "ready") notes.push_back("  " + Str(s, "name") + ": " + Str(v, "summary", ""));
    if (s.contains("degraded") && s["degraded"].is_string()) notes.push_back("  " + Str(s, "name") + ": why: " + Str(s, "degraded"));
  }
  // External servers (kind = "external"): their own state, line and last problem.
  for (const auto& e : status.value("externals", json::array())) {
    const json r = e.value("requests", json::object());
    rows.push_back({Str(e, "name"), Str(e, "state"), "external", e.contains("url") ? Str(e, "url") : Str(e, "device", "-"),
                    Str(r, "running", "0"), Str(r, "waiting", "0"), "-"});
    const std::string state = Str(e, "state");
    if (state != "ready" && state != "external" && (e.contains("last_error") || e.contains("last_exit"))) {
      std::string why = Str(e, "last_exit", "");
      if (e.contains("last_error")) why += (why.empty() ? "" : ": ") + Str(e, "last_error");
      if (state == "unreachable" && e.contains("unreachable_s")) {
        why = "unreachable for " + std::to_string(static_cast<int64_t>(e["unreachable_s"].get<double>())) + " s: " + why;
      }
      notes.push_back("  " + Str(e, "name") + ": " + why);
    }
  }
  os << Table(rows);
  for (const auto& n : notes) os << n << "\n";
  os << "\n";
  rows = {{"DEVICE", "CAPACITY", "USED", "FREE", "HEADROOM", "OTHERS", "BREAKER"}};
  std::vector<std::string> uses;
  for (const auto& d : status.value("devices", json::array())) {
    std::string breaker = d.contains("breaker") ? Str(d["breaker"], "state") : "-";
    if (breaker != "-" && breaker != "closed") breaker += ": " + Str(d["breaker"], "last_reason", "");
    rows.push_back({Str(d, "name"), Mib(d.value("total_bytes", json())), Mib(d.value("used_bytes", json())),
                    Mib(d.value("free_bytes", json())), Mib(d.value("headroom_bytes", json())),
                    Mib(d.value("other_bytes", json())), breaker});
    for (const auto& u : d.value("services", json::array())) {
      if (Str(u, "kind", "") == "external") {  // (no buffers it reports: what it holds, or its resident size)
        const bool held = u.value("held_bytes", uint64_t{0}) > 0;
        uses.push_back("  " + Str(d, "name") + "  " + Str(u, "service") + " (external): " +
                       Mib(held ? u["held_bytes"] : u.value("resident_bytes", json())) + (held ? " held" : " resident"));
        continue;
      }
      uses.push_back("  " + Str(d, "name") + "  " + Str(u, "service") + " " + Str(u, "placement") + ": weights " +
                     Mib(u.value("weights_bytes", json())) + ", KV " + Mib(u.value("kv_bytes", json())) + ", compute " +
                     Mib(u.value("compute_bytes", json())) +
                     (u.contains("transient_bytes") ? ", transient " + Mib(u["transient_bytes"]) : ""));
    }
  }
  os << Table(rows);
  for (const auto& u : uses) os << u << "\n";
  os << "\n" << RequestsTable(status.value("requests", json::array()));
  const json incidents = status.value("incidents", json::array());
  if (!incidents.empty()) {
    os << "\nRECENT INCIDENTS\n";
    const size_t from = incidents.size() > 8 ? incidents.size() - 8 : 0;
    for (size_t i = from; i < incidents.size(); ++i) {
      const json& e = incidents[i];
      os << "  " << Clock(e.value("time_ms", int64_t{0})) << "  " << Str(e, "kind") << "  "
         << (e.contains("service") ? Str(e, "service") + ": " : "")
         << (e.contains("request_id") ? Str(e, "request_id") + " " : "") << Str(e, "reason", "") << "\n";
    }
  }
  return os.str();
}

void AddStatusCommands(CLI::App& app, int* exit_code) {
  auto target = std::make_shared<Target>();
  auto add_target = [target](CLI::App* cmd) {
    cmd->add_option("--url", target->url, "the gateway, http://HOST:PORT (default: --config's listen, else http://127.0.0.1:8480)");
    cmd->add_option("--config", target->config_path, "read the gateway's address from this config");
    cmd->add_flag("--json", target->json_out, "print the gateway's JSON");
  };
  auto fail = [exit_code](const Status& st) {
    std::fprintf(stderr, "spillway: %s\n", st.message().c_str());
    *exit_code = 1;
  };

  auto watch = std::make_shared<double>(0);
  CLI::App* status = app.add_subcommand(
      "status", "What a running gateway is doing: services, devices' memory, requests, recent incidents "
                "(API key from $SPILLWAY_API_KEY)");
  add_target(status);
  status->add_option("--watch", *watch, "redraw every SECONDS until interrupted")
      ->expected(0, 1)->default_str("2")->type_name("[SECONDS]")->check(CLI::Number)->check(CLI::Range(0.2, 3600.0));
  status->callback([target, watch, fail, status] {
    const bool watching = status->count("--watch") > 0;
    const double period = *watch > 0 ? *watch : 2.0;
    for (;;) {
      auto body = Call(*target, "GET", "/v1/status");
      if (!body.ok() && !watching) return fail(body.status());
      if (watching) std::fputs("\x1b[H\x1b[2J", stdout);
      if (!body.ok()) std::printf("%s\n", body.status().message().c_str());
      else if (target->json_out) std::printf("%s\n", body->dump(watching ? -1 : 2).c_str());
      else std::fputs(TerminalSafe(StatusTable(*body)).c_str(), stdout);  // (it quotes servers' words)
      std::fflush(stdout);
      if (!watching) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(period * 1000)));
    }
  });

  CLI::App* requests = app.add_subcommand("requests", "List, show and cancel a running gateway's requests (yours, or all with an operator key)");
  add_target(requests);
  requests->require_subcommand(0, 1);
  requests->fallthrough();  // --url, --json after `list`, `show ID`, `cancel ID` too
  auto print = [target](const json& j, const std::string& text) {
    std::fputs(target->json_out ? (j.dump(2) + "\n").c_str() : TerminalSafe(text).c_str(), stdout);
  };
  auto list = [target, fail, print] {
    auto body = Call(*target, "GET", "/v1/requests");
    if (!body.ok()) return fail(body.status());
    print(*body, RequestsTable(body->value("data", json::array())));
  };
  requests->callback([requests, list] {
    if (requests->get_subcommands().empty()) list();
  });
  CLI::App* ls = requests->add_subcommand("list", "requests in flight and waiting (the default)");
  ls->callback(list);
  auto id = std::make_shared<std::string>();
  CLI::App* show = requests->add_subcommand("show", "one request: state, placement, attempts, admission, result");
  show->add_option("id", *id, "request id")->required();
  show->callback([target, id, fail, print] {
    auto body = Call(*target, "GET", "/v1/requests/" + PathSegment(*id));
    if (!body.ok()) return fail(body.status());
    std::string text = Str(*body, "id") + "  " + Str(*body, "state") + "  service " + Str(*body, "service") + "  placement " +
                       Str(*body, "placement", "-") + "  attempts " + Str(*body, "attempts", "0") + "\n";
    if (body->contains("phase")) text += "  phase " + Str(*body, "phase") + " for " + Age((*body)["phase_age_ms"]) + "\n";
    for (const auto& a : body->value("attempt_log", json::array())) {
      text += "  attempt " + Str(a, "n") + " on " + Str(a, "placement") + ": " + Str(a, "outcome", "running") +
              (a.contains("error") ? " (" + Str(a, "error") + ")" : "") + "\n";
    }
    if (body->contains("admission")) {
      const json& d = (*body)["admission"];
      text += "  admission: " + Str(d, "decision") + (d.contains("reason") ? " (" + Str(d, "reason") + ")" : "") + "\n";
    }
    if (body->contains("error")) text += "  error: " + Str(*body, "error") + "\n";
    if (body->contains("result")) text += "  result: HTTP " + Str((*body)["result"], "status") + ", " + Str((*body)["result"], "content_type") + "\n";
    print(*body, text);
  });
  CLI::App* cancel = requests->add_subcommand("cancel", "cancel a waiting or running request");
  cancel->add_option("id", *id, "request id")->required();
  cancel->callback([target, id, fail, print] {
    auto body = Call(*target, "DELETE", "/v1/requests/" + PathSegment(*id));
    if (!body.ok()) return fail(body.status());
    print(*body, Str(*body, "id") + ": " + Str(*body, "state") + "\n");
  });
}

}  // namespace spillway::cli
