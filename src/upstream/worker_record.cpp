#include "upstream/worker_record.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "common/hash.h"
#include "common/private_files.h"

namespace spillway::upstream {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::string_view kRecordSuffix = ".json";
constexpr size_t kMaxRecordBytes = 64 << 10;

bool IsHex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

std::string RecordToJson(const WorkerRecord& r) {
  return json{{"key", r.key},
              {"pid", r.pid},
              {"start_time", r.start_time},
              {"port", r.port},
              {"spec_hash", r.spec_hash},
              {"protocol_version", r.protocol_version},
              {"external", r.external},
              {"stop_signal", r.stop_signal},
              {"dir_dev", r.dir_dev},
              {"dir_ino", r.dir_ino},
              {"session", r.session},
              {"boot", r.boot}}
             .dump() +
         "\n";
}

StatusOr<WorkerRecord> ParseWorkerRecord(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  auto bad = [](const char* field) { return Status::InvalidArgument(std::string("missing or bad '") + field + "'"); };
  WorkerRecord r;
  if (!j.contains("key") || !j["key"].is_string() || j["key"].get<std::string>().empty()) return bad("key");
  r.key = j["key"].get<std::string>();
  if (!j.contains("pid") || !j["pid"].is_number_integer() || j["pid"].get<int64_t>() <= 1 ||
      j["pid"].get<int64_t>() > (int64_t{1} << 22)) {
    return bad("pid");  // never 0, -1 or init: kill(-pid) of those would reach far too much
  }
  r.pid = static_cast<pid_t>(j["pid"].get<int64_t>());
  if (!j.contains("start_time") || !j["start_time"].is_number_unsigned() || j["start_time"].get<uint64_t>() == 0) {
    return bad("start_time");
  }
  r.start_time = j["start_time"].get<uint64_t>();
  if (!j.contains("port") || !j["port"].is_number_unsigned() || j["port"].get<uint64_t>() > 65535) return bad("port");
  r.port = static_cast<uint16_t>(j["port"].get<uint64_t>());
  if (!j.contains("spec_hash") || !j["spec_hash"].is_string() || !IsHex64(j["spec_hash"].get<std::string>())) {
    return bad("spec_hash");
  }
  r.spec_hash = j["spec_hash"].get<std::string>();
  if (!j.contains("protocol_version") || !j["protocol_version"].is_number_integer()) return bad("protocol_version");
  r.protocol_version = j["protocol_version"].get<int>();
  if (j.contains("external")) {
    if (!j["external"].is_boolean()) return bad("external");
    r.external = j["external"].get<bool>();
  }
  if (j.contains("stop_signal")) {  // a standard signal, never 0 (a probe) or a real-time one
    if (!j["stop_signal"].is_number_integer() || j["stop_signal"].get<int64_t>() < 1 ||
        j["stop_signal"].get<int64_t>() > 31) {
      return bad("stop_signal");
    }
    r.stop_signal = j["stop_signal"].get<int>();
  }
  for (const auto& [field, out] : {std::pair<const char*, uint64_t*>{"dir_dev", &r.dir_dev}, {"dir_ino", &r.dir_ino}}) {
    if (!j.contains(field)) continue;
    if (!j[field].is_number_unsigned()) return bad(field);
    *out = j[field].get<uint64_t>();
  }
  if (j.contains("session")) {
    if (!j["session"].is_number_integer() || j["session"].get<int64_t>() < 0 ||
        j["session"].get<int64_t>() > (int64_t{1} << 22)) {
      return bad("session");
    }
    r.session = static_cast<pid_t>(j["session"].get<int64_t>());
  }
  if (j.contains("boot")) {
    if (!j["boot"].is_string() || j["boot"].get<std::string>().size() > 128) return bad("boot");
    r.boot = j["boot"].get<std::string>();
  }
  return r;
}

std::string SpecHash(const std::vector<std::string>& args) {
  std::string all;
  for (const auto& a : args) all += std::to_string(a.size()) + ":" + a + ";";
  return Sha256Hex(all);
}

std::string RecordPath(const std::string& run_dir, const std::string& key) {
  return run_dir + "/" + key + std::string(kRecordSuffix);
}

std::vector<RecordFile> ReadWorkerRecords(const std::string& run_dir) {
  std::vector<RecordFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= kRecordSuffix.size() || !name.ends_with(kRecordSuffix)) continue;
    // Regular files only: a link planted in the run directory is not followed.
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    RecordFile f{name.substr(0, name.size() - kRecordSuffix.size()), it->path().string(),
                 Status::NotFound("unread")};
    // (No link, FIFO or device opened; a record is a few hundred bytes: what is past 64 KiB is not one.)
    const auto text = ReadPrivateFile(f.path, kMaxRecordBytes + 1);
    if (!text.ok()) {
      f.record = text.status();
    } else if (text->size() > kMaxRecordBytes) {
      f.record = Status::InvalidArgument("it is larger than " + std::to_string(kMaxRecordBytes) + " bytes");
    } else {
      f.record = ParseWorkerRecord(*text);
    }
    if (f.record.ok() && f.record->key != f.key) {
      f.record = Status::InvalidArgument("its key '" + f.record->key + "' is not its file name's");
    }
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const RecordFile& a, const RecordFile& b) { return a.key < b.key; });
  return out;
}

const char* AdoptActionName(AdoptAction a) {
  switch (a) {
    case AdoptAction::kAdopt: return "adopt";
    case AdoptAction::kForget: return "forget";
    case AdoptAction::kStop: return "stop";
    case AdoptAction::kWait: return "wait";
  }
  return "unknown";
}

AdoptDecision DecideAdoption(const WorkerRecord& record, const std::optional<std::string>& configured_hash,
                             int protocol_version, devices::Liveness process,
                             const std::optional<WorkerInfoFacts>& info, bool external,
                             std::optional<size_t> orphans) {
  const std::string pid = "pid " + std::to_string(record.pid);
  // First: is it ours at all? A pid that now names another process must never be signalled.
  if (process == devices::Liveness::kUnknown) {
    // (Taken for gone, its record was dropped and a second worker started beside it.)
    return {AdoptAction::kWait, pid + " is there but its /proc entry cannot be read, so whether it is the one "
                                      "recorded cannot be told: it is not signalled, and no worker starts beside it "
                                      "until it has ended"};
  }
  if (process == devices::Liveness::kGone && !orphans) {
    return {AdoptAction::kWait,
            pid + " has ended, and whether processes it started live on in its group cannot be told (/proc cannot "
                  "be read): they are not signalled, and no worker starts beside them until that can be told",
            /*leader_gone=*/true};
  }
  if (process == devices::Liveness::kGone && *orphans > 0) {
    return {AdoptAction::kStop,
            pid + " has ended, but " + std::to_string(*orphans) + (*orphans == 1 ? " process" : " processes") +
                " it started in its group outlived it (a wrapper that does not exec its server): stopped, so that "
                "nothing of it runs beside what starts anew",
            /*leader_gone=*/true};
  }
  if (process == devices::Liveness::kGone) {
    return {AdoptAction::kForget, pid + " is gone or is another process now (start time or command line differs)"};
  }
  if (!configured_hash) return {AdoptAction::kStop, "placement no longer configured or admitted"};
  if (record.spec_hash != *configured_hash) return {AdoptAction::kStop, "its spec changed (model, device, ctx...)"};
  if (external) {
    return {AdoptAction::kStop, "an external server is not adopted (it cannot prove it is the one recorded): it is "
                                "started again"};
  }
  if (record.protocol_version != protocol_version) {
    return {AdoptAction::kStop, "it was started for protocol version " + std::to_string(record.protocol_version) +
                                    ", this gateway speaks " + std::to_string(protocol_version)};
  }
  if (record.port == 0) return {AdoptAction::kStop, "it was still loading (no port)"};
  if (!info) return {AdoptAction::kStop, "it does not answer GET /v1/worker/info on port " +
                                             std::to_string(record.port) + " with the worker secret"};
  if (info->pid != record.pid) {
    return {AdoptAction::kStop, "port " + std::to_string(record.port) + " is answered by pid " +
                                    std::to_string(info->pid) + ", not by " + pid};
  }
  if (info->protocol_version != protocol_version) {
    return {AdoptAction::kStop, "it speaks protocol version " + std::to_string(info->protocol_version) +
                                    ", this gateway " + std::to_string(protocol_version)};
  }
  return {AdoptAction::kAdopt, pid + " on port " + std::to_string(record.port)};
}

}  // namespace spillway::upstream
