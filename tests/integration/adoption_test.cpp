// Workers outlive a crash of the gateway and are adopted by the next one on
// the same state directory (upstream/supervisor.h): real gateway and worker
// processes, port 0, conditions waited for rather than fixed sleeps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "devices/sim_ledger.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "scoped_sim_dir.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Steady = std::chrono::steady_clock;

// A state directory of the test's own, shared by the gateways it starts
// (declared before them: removed after they are gone).
struct StateDir {
  std::string path;
  StateDir() {
    std::string t = (fs::temp_directory_path() / "spillway-adopt-XXXXXX").string();
    path = std::string(mkdtemp(t.data())) + "/state";
  }
  ~StateDir() {
    std::error_code ec;
    fs::remove_all(fs::path(path).parent_path(), ec);
  }
};

// Each placement's worker in /v1/status, by key ("chat.0", "embed.0").
std::map<std::string, json> Workers(uint16_t port) {
  std::map<std::string, json> out;
  auto r = http::Fetch("127.0.0.1", port, "GET", "/v1/status", "", {}, std::chrono::seconds(10));
  if (!r.ok() || r->status != 200) return out;
  const json s = Body(*r);
  for (const auto& svc : s["services"]) {
    for (const auto& p : svc["placements"]) out[p["key"].get<std::string>()] = p;
  }
  return out;
}

// Starts `gw` and lists its workers (none when it did not start: the test fails there).
std::map<std::string, json> Started(GatewayProcess& gw) {
  const bool started = gw.Start();
  EXPECT_TRUE(started) << gw.Output();
  return started ? Workers(gw.port()) : std::map<std::string, json>{};
}

pid_t PidOf(const json& w) { return w.value("pid", 0); }

// Exists and is not a zombie (an orphaned worker is reaped by init, maybe late).
bool Alive(pid_t pid) { return pid > 0 && devices::ProcessAlive(pid, 0); }

template <class F>
bool WaitFor(F done, std::chrono::seconds timeout) {
  const auto deadline = Steady::now() + timeout;
  while (Steady::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// Live worker processes of `key` in `state_dir`, whoever started them (their
// command line names the key's port file).
int LiveWorkersOf(const std::string& state_dir, const std::string& key) {
  const std::string needle = state_dir + "/run/" + key + ".port";
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(it->path() / "cmdline");
    std::stringstream ss;
    ss << f.rdbuf();
    if (ss.str().find(needle) != std::string::npos && Alive(std::stoi(name))) ++n;
  }
  return n;
}

TEST(WorkerAdoptionTest, Kill9ThenRestartServesOnTheSameWorkersWithoutReload) {
  StateDir state;
  GatewayProcess gw(TestConfig(2), state.path);
  const auto before = Started(gw);
  const pid_t chat = PidOf(before.at("chat.0")), embed = PidOf(before.at("embed.0"));
  ASSERT_GT(chat, 0);
  EXPECT_FALSE(before.at("chat.0")["adopted"].get<bool>());
  EXPECT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);

  gw.Kill9();
  EXPECT_TRUE(Alive(chat)) << "the chat worker died with its gateway";
  EXPECT_TRUE(Alive(embed)) << "the embed worker died with its gateway";

  const auto after = Started(gw);
  for (const auto& [key, pid] : std::map<std::string, pid_t>{{"chat.0", chat}, {"embed.0", embed}}) {
    const json& w = after.at(key);
    EXPECT_EQ(PidOf(w), pid) << key << " was started again: " << w.dump();
    EXPECT_TRUE(w["adopted"].get<bool>()) << w.dump();
    EXPECT_TRUE(w["ever_ready"].get<bool>()) << "adopted, it was loaded (unloaded later, it read as never loaded)";
    EXPECT_EQ(w["state"], "ready");
    EXPECT_EQ(w["restarts"], 0);
  }
  // Served at once, by the adopted worker, with the kept secret.
  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(4));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(gw.Output().find("worker chat.0 adopted from the previous gateway (pid " + std::to_string(chat)),
            std::string::npos)
      << gw.Output();
}

TEST(WorkerAdoptionTest, ASurvivingWorkerHoldsNothingOfTheDeadGateway) {
  StateDir state;
  GatewayProcess gw(TestConfig(2), state.path);
  ASSERT_TRUE(gw.Start()) << gw.Output();
  // Restarted while the gateway listens: spawned after its listening socket exists.
  const pid_t first = PidOf(Workers(gw.port()).at("chat.0"));
  kill(-first, SIGKILL);
  json w;
  ASSERT_TRUE(WaitFor([&] {
    w = Workers(gw.port())["chat.0"];
    return w.value("state", "") == "ready" && PidOf(w) != first;
  }, std::chrono::seconds(30))) << w.dump();
  const uint16_t old_port = gw.port();
  gw.Kill9();
  ASSERT_TRUE(Alive(PidOf(w)));
  // Refused at once, not queued on a listening socket the worker inherited.
  const auto t0 = Steady::now();
  auto r = http::Fetch("127.0.0.1", old_port, "GET", "/healthz", "", {}, std::chrono::seconds(5));
  EXPECT_FALSE(r.ok()) << "something still listens on the dead gateway's port";
  EXPECT_LT(Steady::now() - t0, std::chrono::seconds(2)) << "a client of the dead gateway hung";
}

TEST(WorkerAdoptionTest, ChangedConfigStopsTheOldWorkerBeforeItsReplacementNeverTwo) {
  StateDir state;
  GatewayProcess first(TestConfig(2), state.path);
  GatewayProcess changed(TestConfig(1), state.path);  // chat: other ctx and slots; embed as it was
  const auto before = Started(first);
  const pid_t old_chat = PidOf(before.at("chat.0")), embed = PidOf(before.at("embed.0"));
  first.Kill9();
  ASSERT_TRUE(Alive(old_chat));

  // Sampled all through the restart: never two chat workers at once.
  std::atomic<bool> sampling{true};
  std::atomic<int> most{0};
  std::thread sampler([&] {
    while (sampling) {
      most = std::max(most.load(), LiveWorkersOf(state.path, "chat.0"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const bool started = changed.Start();
  sampling = false;
  sampler.join();
  ASSERT_TRUE(started) << changed.Output();
  EXPECT_LE(most.load(), 1) << "two chat workers ran at once";
  EXPECT_FALSE(Alive(old_chat)) << "the worker of the old config is still running";

  const auto after = Workers(changed.port());
  EXPECT_NE(PidOf(after.at("chat.0")), old_chat);
  EXPECT_FALSE(after.at("chat.0")["adopted"].get<bool>());
  EXPECT_EQ(PidOf(after.at("embed.0")), embed) << "the unchanged placement was not adopted";
  EXPECT_TRUE(after.at("embed.0")["adopted"].get<bool>());
  EXPECT_NE(changed.Output().find("worker chat.0 of the previous gateway (pid " + std::to_string(old_chat) +
                                  ") stopped: its spec changed"),
            std::string::npos)
      << changed.Output();
  EXPECT_EQ(Call(changed.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);
}

// A gateway serving chat.0 and embed.0, then killed with -9: its workers
// and their records stay behind in `state` (pids 0 when it did not start).
struct CrashedGateway {
  StateDir state;
  GatewayProcess gw{TestConfig(2), state.path};
  pid_t chat = 0, embed = 0;
  CrashedGateway() {
    const auto before = Started(gw);
    if (before.count("chat.0") && before.count("embed.0")) {
      chat = PidOf(before.at("chat.0"));
      embed = PidOf(before.at("embed.0"));
    }
    gw.Kill9();
  }
};

// A device with room for one worker: a restart whose config changed the
// placement stops the old worker before placement admission, which then
// sees the room (it counted the old worker's memory, refused the placement
// for good, and only then stopped the old worker: the device stood empty).
TEST(WorkerAdoptionTest, AChangedPlacementIsAdmittedWithoutTheMemoryOfTheWorkerItReplaces) {
  ScopedSimDir sim("adopt-room");
  ASSERT_TRUE(devices::SimLedger::Create(0, 64 << 20).ok());
  auto config = [](int threads) {
    std::ostringstream os;
    os << "[[device]]\nname = \"sim:0\"\nheadroom_pct = 5\n[[service]]\nname = \"chat\"\nmodel = \""
       << ModelPath("tiny-chat") << "\"\n[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 512\n"
       << "slots = 1\nbatch = 64\nthreads = " << threads << "\n";
    return os.str();
  };
  auto used = [] { return (*devices::SimLedger::Open(0))->Snapshot().used; };
  StateDir state;
  GatewayProcess first(config(1), state.path);
  const auto before = Started(first);
  ASSERT_TRUE(before.count("chat.0") && before.at("chat.0")["state"] == "ready") << first.Output();
  const pid_t old_chat = PidOf(before.at("chat.0"));
  const uint64_t one = used();
  first.Kill9();
  ASSERT_TRUE(Alive(old_chat));
  // Another program takes what leaves room for one worker, not two.
  const uint64_t hold_mib = ((64ull << 20) - one - one / 2) >> 20;
  ASSERT_GT(hold_mib, 0u) << "one worker takes " << one << " bytes";
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", std::to_string(hold_mib), "--seconds", "120"}, "spillway");
  ASSERT_TRUE(WaitFor([&] { return used() >= one + (hold_mib << 20); }, std::chrono::seconds(10)));

  GatewayProcess changed(config(2), state.path);  // the spec changed: not adopted
  const auto after = Started(changed);
  kill(holder, SIGTERM);
  waitpid(holder, nullptr, 0);
  ASSERT_TRUE(after.count("chat.0")) << changed.Output();
  EXPECT_TRUE(after.at("chat.0")["admitted"].get<bool>()) << after.at("chat.0").dump() << changed.Output();
  EXPECT_FALSE(Alive(old_chat));
  EXPECT_TRUE(WaitFor([&] { return Workers(changed.port()).at("chat.0")["state"] == "ready"; }, std::chrono::seconds(60)))
      << changed.Output();
}

TEST(WorkerAdoptionTest, RecordOfAGoneOrReusedPidIsNotAdoptedAndItsProcessNotSignalled) {
  CrashedGateway crashed;
  auto& [state, gw, chat, embed] = crashed;
  ASSERT_TRUE(chat && embed);
  // chat.0's process is gone.
  kill(-chat, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return !Alive(chat); }, std::chrono::seconds(10)));
  // embed.0's pid now stands for another process: its start time is not the recorded one.
  const std::string record = state.path + "/run/embed.0.json";
  json r = json::parse(std::ifstream(record), nullptr, false);
  ASSERT_TRUE(r.is_object());
  r["start_time"] = r["start_time"].get<uint64_t>() + 1;
  std::ofstream(record, std::ios::trunc) << r.dump();

  const auto after = Started(gw);
  EXPECT_NE(PidOf(after.at("chat.0")), chat);
  EXPECT_FALSE(after.at("chat.0")["adopted"].get<bool>());
  EXPECT_NE(PidOf(after.at("embed.0")), embed);
  EXPECT_FALSE(after.at("embed.0")["adopted"].get<bool>());
  EXPECT_TRUE(Alive(embed)) << "a process that merely holds a recorded pid was signalled";
  kill(-embed, SIGKILL);  // the test's stranger, to be cleaned up here
  EXPECT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);
}

// A record that names another placement's worker (copied, or planted in
// the state directory) is not adopted: that process was not started as this
// key's worker (its command line names another port file). chat.0 (read
// first) adopted embed.0's worker, which served chat requests with the
// embedding model, and embed.0 adopted the same process too.
TEST(WorkerAdoptionTest, ARecordNamingAnotherPlacementsWorkerIsNotAdopted) {
  CrashedGateway crashed;
  auto& [state, gw, chat, embed] = crashed;
  ASSERT_TRUE(chat && embed);
  // chat.0's record now names embed.0's process (its pid, start time and port).
  json chat_record = json::parse(std::ifstream(state.path + "/run/chat.0.json"), nullptr, false);
  json embed_record = json::parse(std::ifstream(state.path + "/run/embed.0.json"), nullptr, false);
  ASSERT_TRUE(chat_record.is_object() && embed_record.is_object());
  for (const char* k : {"pid", "start_time", "port"}) chat_record[k] = embed_record[k];
  std::ofstream(state.path + "/run/chat.0.json", std::ios::trunc) << chat_record.dump();

  const auto after = Started(gw);
  EXPECT_EQ(PidOf(after.at("embed.0")), embed);
  EXPECT_TRUE(after.at("embed.0")["adopted"].get<bool>());
  EXPECT_NE(PidOf(after.at("chat.0")), embed) << "another placement's worker adopted";
  EXPECT_FALSE(after.at("chat.0")["adopted"].get<bool>());
  kill(-chat, SIGKILL);  // its record was overwritten: the test's to clean up
  EXPECT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);
  EXPECT_TRUE(Alive(embed)) << "a worker adopted for its own placement was signalled for another";
}

// A socket on 127.0.0.1 that takes connections and keeps what they send:
// another program on a worker's recorded port.
class Eavesdropper {
 public:
  Eavesdropper() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd_, 8) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        ++connections_;
        char buf[4096];
        pollfd q{c, POLLIN, 0};
        while (::poll(&q, 1, 500) > 0) {
          const ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          std::lock_guard<std::mutex> lk(mu_);
          heard_.append(buf, static_cast<size_t>(n));
        }
        ::close(c);
      }
    });
  }
  ~Eavesdropper() {
    stop_ = true;
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  uint16_t port() const { return port_; }
  int connections() const { return connections_; }
  std::string heard() {
    std::lock_guard<std::mutex> lk(mu_);
    return heard_;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::string heard_;
  std::thread thread_;
};

// A worker's recorded port held by another program (the worker closed its
// listener as it exited, and another user bound the port meanwhile; here a
// record whose port was changed): the restarted gateway sends the worker
// secret only to a port the recorded worker holds alone, so that program
// hears nothing, and the worker, not adoptable, is stopped and replaced.
TEST(WorkerAdoptionTest, TheWorkerSecretGoesOnlyToAPortTheRecordedWorkerHolds) {
  CrashedGateway crashed;
  auto& [state, gw, chat, embed] = crashed;
  ASSERT_TRUE(chat && embed);
  Eavesdropper other;
  ASSERT_NE(other.port(), 0);
  json record = json::parse(std::ifstream(state.path + "/run/chat.0.json"), nullptr, false);
  ASSERT_TRUE(record.is_object());
  record["port"] = other.port();
  std::ofstream(state.path + "/run/chat.0.json", std::ios::trunc) << record.dump();

  const auto after = Started(gw);
  EXPECT_EQ(other.connections(), 0) << "the restarted gateway called another program's port";
  EXPECT_EQ(other.heard().find(TestWorkerSecret()), std::string::npos) << "the worker secret went to another program";
  ASSERT_TRUE(after.count("chat.0"));
  EXPECT_FALSE(after.at("chat.0")["adopted"].get<bool>());
  EXPECT_NE(PidOf(after.at("chat.0")), chat) << "a worker whose port is another's was adopted";
  EXPECT_TRUE(WaitFor([&] { return !Alive(chat); }, std::chrono::seconds(30))) << "the unadoptable worker was not stopped";
  EXPECT_TRUE(after.at("embed.0")["adopted"].get<bool>());
  EXPECT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);
}

// The same state directory named another way (here with a "/." more) is
// the same: its workers are adopted, not forgotten beside a second set
// (the check of a worker's command line compared path strings).
TEST(WorkerAdoptionTest, TheStateDirectoryNamedAnotherWayAdoptsTheSameWorkers) {
  CrashedGateway crashed;
  ASSERT_TRUE(crashed.chat && crashed.embed);
  const std::string link = crashed.state.path + "/.";
  GatewayProcess again(TestConfig(2), link);
  const auto after = Started(again);
  ASSERT_FALSE(after.empty()) << again.Output();
  EXPECT_EQ(PidOf(after.at("chat.0")), crashed.chat);
  EXPECT_TRUE(after.at("chat.0")["adopted"].get<bool>());
  EXPECT_EQ(PidOf(after.at("embed.0")), crashed.embed);
  EXPECT_EQ(LiveWorkersOf(crashed.state.path, "chat.0") + LiveWorkersOf(link, "chat.0"), 1);
}

// A state directory named relative to where the gateway started: its
// workers are told absolute paths (a gateway restarted from elsewhere read
// a worker's relative --port-file against its own directory, took the
// worker for gone and started a second one beside it).
TEST(WorkerAdoptionTest, ARelativeStateDirectoryIsAbsoluteToItsWorkers) {
  StateDir state;
  const std::string relative = fs::relative(state.path).string();
  ASSERT_FALSE(fs::path(relative).is_absolute());
  GatewayProcess gw(TestConfig(2), relative);
  const auto started = Started(gw);
  ASSERT_TRUE(started.count("chat.0")) << gw.Output();
  std::ifstream f("/proc/" + std::to_string(PidOf(started.at("chat.0"))) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  EXPECT_NE(cmdline.find("--port-file " + fs::absolute(relative).string() + "/run/"), std::string::npos) << cmdline;
}

TEST(WorkerAdoptionTest, SigtermStopsEveryWorkerAdoptedOnesIncluded) {
  StateDir state;
  GatewayProcess gw(TestConfig(2), state.path);
  const auto fresh = Started(gw);
  gw.Stop();
  for (const auto& [key, w] : fresh) EXPECT_FALSE(Alive(PidOf(w))) << key << " outlived a SIGTERM to its gateway";

  const auto spawned = Started(gw);
  gw.Kill9();
  const auto adopted = Started(gw);
  for (const auto& [key, w] : adopted) {
    EXPECT_TRUE(w["adopted"].get<bool>()) << key;
    EXPECT_EQ(PidOf(w), PidOf(spawned.at(key))) << key;
  }
  gw.Stop();
  for (const auto& [key, w] : adopted) {
    EXPECT_FALSE(Alive(PidOf(w))) << key << " (adopted) outlived a SIGTERM to its gateway";
  }
  std::error_code ec;
  for (fs::directory_iterator it(state.path + "/run", ec), end; !ec && it != end; it.increment(ec)) {
    EXPECT_NE(it->path().extension(), ".json") << it->path() << " left behind by a clean stop";
  }
}

TEST(WorkerAdoptionTest, WorkersWithoutAGatewayExitAfterTheirOrphanTimeout) {
  StateDir state;
  GatewayProcess gw(TestConfig(2), state.path);
  gw.SetExtraArgs({"--worker-orphan-timeout", "2"});
  const auto workers = Started(gw);
  // A gateway that lives keeps them (its health checks count): proving a
  // negative takes the timeout and some.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  for (const auto& [key, w] : Workers(gw.port())) {
    EXPECT_EQ(PidOf(w), PidOf(workers.at(key))) << key << " left a living gateway";
    EXPECT_EQ(w["restarts"], 0) << key;
  }
  const auto killed = Steady::now();
  gw.Kill9();
  for (const auto& [key, w] : workers) {
    EXPECT_TRUE(WaitFor([&] { return !Alive(PidOf(w)); }, std::chrono::seconds(30))) << key << " never left";
  }
  EXPECT_GE(Steady::now() - killed, std::chrono::milliseconds(1500)) << "they did not outlive the gateway";
  std::ifstream log(state.path + "/logs/chat.0.log");
  std::stringstream ss;
  ss << log.rdbuf();
  EXPECT_NE(ss.str().find("\"orphan\":true"), std::string::npos) << ss.str();
}

TEST(WorkerAdoptionTest, TheSecretKeptInTheStateDirectoryLetsARestartedGatewayAdopt) {
  StateDir state;
  GatewayProcess gw(TestConfig(2), state.path);
  gw.UnsetEnv("SPILLWAY_WORKER_SECRET");  // the gateway keeps its own
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const std::string path = state.path + "/run/worker.secret";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << "no kept secret";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string secret;
  std::ifstream(path) >> secret;
  const auto before = Workers(gw.port());
  const uint16_t worker_port = before.at("chat.0")["port"];
  auto with = [&](const std::string& s) {
    auto r = http::Fetch("127.0.0.1", worker_port, "GET", "/health", "", {{"Authorization", "Bearer " + s}});
    return r.ok() ? static_cast<int>(r->status) : 0;
  };
  EXPECT_EQ(with(secret), 200);
  EXPECT_EQ(with(TestWorkerSecret()), 401);  // not the environment's

  gw.Kill9();
  const auto after = Started(gw);
  EXPECT_EQ(PidOf(after.at("chat.0")), PidOf(before.at("chat.0")));
  EXPECT_TRUE(after.at("chat.0")["adopted"].get<bool>());
  EXPECT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(4)).status, 200);
}

}  // namespace
}  // namespace spillway::testing
