#include "common/proc_file.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace spillway {
namespace {

// A child that waits to be killed; the caller reaps it.
pid_t SleepingChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

TEST(ProcFileTest, ReadsAFileWhole) {
  const auto path = std::filesystem::temp_directory_path() / ("spillway-proc-file-" + std::to_string(getpid()));
  const std::string text(10000, 'x');  // more than one read's buffer
  std::ofstream(path) << text;
  EXPECT_EQ(ReadSmallFile(path.string()), text);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadSmallFile(path.string()), std::nullopt);
}

// The chaos harness died of this in CI: /proc/<pid>/stat opened while the
// process lived, read after it was reaped, fails with ESRCH, and
// std::istreambuf_iterator turned that into an exception no one caught.
TEST(ProcFileTest, AProcFileWhoseProcessWasReapedReadsAsAbsent) {
  const pid_t pid = SleepingChild();
  ASSERT_GT(pid, 0);
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(ReadAll(fd), std::nullopt);
  ::close(fd);
}

// A TCP socket listening on 127.0.0.1 (port 0: a free one); its port in *port.
int Listener(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

TEST(ProcFileTest, ListensAloneTellsWhoseSocketHoldsAPort) {
  uint16_t port = 0;
  const int fd = Listener(&port);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ListensAlone(getpid(), port), true);
  // Held by another process: a child that took the socket with it.
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  ::close(fd);
  // (The child's copy is the only one now.)
  EXPECT_EQ(ListensAlone(child, port), true);
  EXPECT_EQ(ListensAlone(getpid(), port), false) << "the port is the child's, not this process's";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Nobody listens there: not held.
  EXPECT_EQ(ListensAlone(getpid(), port), false);
  // A process whose descriptors cannot be read: cannot tell.
  EXPECT_EQ(ListensAlone(child, port), false) << "(nobody listens: false before the descriptors are read)";
  uint16_t other = 0;
  const int fd2 = Listener(&other);
  ASSERT_GE(fd2, 0);
  EXPECT_EQ(ListensAlone(child, other), std::nullopt) << "a reaped process's descriptors cannot be read";
  ::close(fd2);
}

// A /proc of the test's own making: its sockets' tables and a process's descriptors.
struct FakeProc {
  std::filesystem::path root = std::filesystem::temp_directory_path() / ("spillway-fake-proc-" + std::to_string(getpid()));
  FakeProc() {
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root / "net");
    std::filesystem::create_directories(root / "42" / "fd");
  }
  ~FakeProc() { std::filesystem::remove_all(root); }
  void Table(const std::string& name, const std::string& rows) {
    std::ofstream(root / "net" / name)
        << "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        << rows;
  }
  void Fd(int n, const std::string& target) { std::filesystem::create_symlink(target, root / "42" / "fd" / std::to_string(n)); }
};

TEST(ProcFileTest, ListensAloneReadsBothTablesAndEverySocketOnThePort) {
  FakeProc p;
  // Port 0x1F90 = 8080: listening (0A) on 127.0.0.1 with inode 111; an
  // established connection (01) from that port, which is not a listener.
  p.Table("tcp",
          "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0\n"
          "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 999 1 0 20 4 30 10 -1\n");
  p.Table("tcp6", "");
  p.Fd(3, "socket:[111]");
  p.Fd(4, "/dev/null");
  EXPECT_EQ(ListensAlone(42, 8080, p.root.string()), true);
  EXPECT_EQ(ListensAlone(42, 8081, p.root.string()), false);
  // Another listener on the same port (IPv6, any address: another user's, say) that is not its.
  p.Table("tcp6",
          "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 "
          "00:00000000 00000000  1001        0 222 1 0 100 0 0 10 0\n");
  EXPECT_EQ(ListensAlone(42, 8080, p.root.string()), false);
  p.Fd(5, "socket:[222]");
  EXPECT_EQ(ListensAlone(42, 8080, p.root.string()), true);
  // What cannot be read or is not in proc(5)'s form: cannot tell.
  p.Table("tcp", "   0: garbage\n");
  EXPECT_EQ(ListensAlone(42, 8080, p.root.string()), std::nullopt);
  std::filesystem::remove(p.root / "net" / "tcp");
  EXPECT_EQ(ListensAlone(42, 8080, p.root.string()), std::nullopt);
  p.Table("tcp", "");
  EXPECT_EQ(ListensAlone(43, 8080, p.root.string()), std::nullopt) << "no descriptors to read";
}

// hidepid=1 lists every process but lets a user read only its own entries.
// Another user's unreadable entry is not one of its groups' members (under
// hidepid=2 it is not even listed); its own unreadable entry cannot be told.
// Run as `nobody` in a child over a /proc of the test's making (root reads everything).
TEST(ProcFileTest, ProcessesOfGroupSkipsOtherUsersEntriesThatCannotBeRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make entries of two users";
  const auto root = std::filesystem::temp_directory_path() / ("spillway-hidepid-" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  const auto entry = [&](int pid, uid_t owner, mode_t dir_mode, mode_t file_mode) {
    const auto dir = root / std::to_string(pid);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "stat") << pid << " (x) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0\n";
    ASSERT_EQ(::chown(dir.c_str(), owner, owner), 0);
    ASSERT_EQ(::chown((dir / "stat").c_str(), owner, owner), 0);
    ASSERT_EQ(::chmod((dir / "stat").c_str(), file_mode), 0);
    ASSERT_EQ(::chmod(dir.c_str(), dir_mode), 0);
  };
  const uid_t nobody = 65534;
  std::filesystem::create_directories(root);
  ASSERT_EQ(::chmod(root.c_str(), 0755), 0);
  entry(100, 0, 0700, 0444);       // root's, not readable by nobody: left out
  entry(200, nobody, 0755, 0444);  // nobody's own: a member
  const auto run_as_nobody = [&](int want) {
    const pid_t child = fork();
    if (child == 0) {
      if (setgid(nobody) != 0 || setuid(nobody) != 0) _exit(10);
      const auto members = ProcessesOfGroup(100, root.string());
      if (!members) _exit(want == 2 ? 0 : 11);
      if (want != 1 || members->size() != 1 || (*members)[0].first != 200) _exit(12);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
  };
  EXPECT_EQ(run_as_nobody(1), 0) << "root's unreadable entry must be left out, nobody's own counted";
  entry(300, nobody, 0755, 0000);  // nobody's own, unreadable (no descriptor left, say): cannot tell
  EXPECT_EQ(run_as_nobody(2), 0) << "an own entry that cannot be read must make the walk unable to tell";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace spillway
