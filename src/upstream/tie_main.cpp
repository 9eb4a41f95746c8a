// spillway-tie: runs an external server's command tied to the gateway that
// started it, with everything the command starts in its process group.
//
//   spillway-tie GATEWAY_PID STOP_SIGNAL -- COMMAND [ARG...]
//
// The supervisor starts every external server through it (it leads the
// server's session and group, see supervisor.h). An external server is
// never adopted, so it must end with its gateway, one killed with -9 too.
// util-linux's setpriv --pdeathsig signals only the process it execs: a
// wrapper script that does not exec its server ended, and the server ran
// on in its group with its device memory and port until some later gateway
// came (or for good). spillway-tie stays as the group's leader instead:
//   - when the gateway dies (the parent-death signal, or a gateway already
//     gone when it starts), it gives its whole group STOP_SIGNAL, waits up
//     to 5 s for everything there to end (it is the group's subreaper:
//     what a wrapper leaves is reparented to it), then SIGKILLs the group;
//   - when its command ends, it ends the same way (its exit code, or the
//     same signal), so the supervisor reads the server's end as before;
//   - a signal someone sends it (`kill PID`, the pid /v1/status shows) is
//     passed on to its group, as the gateway's stop would be; not one from
//     the gateway (it signals the whole group, the command has it already)
//     or from within the group.
// Nothing else: no threads, no allocation after the start, libc only.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kGraceSeconds = 5;

// The gateway's death. Every other signal it can wait for is blocked and
// read with sigwaitinfo: its command's end (SIGCHLD), and those it passes
// on to its group (none of which may end it first: the gateway would read
// that as the server's end and SIGKILL the group without grace). The
// faults of its own execution are left to act.
int PdeathSignal() { return SIGRTMIN; }
constexpr int kOwnFaults[] = {SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};

int Usage() {
  std::fprintf(stderr,
               "usage: spillway-tie GATEWAY_PID STOP_SIGNAL -- COMMAND [ARG...]\n"
               "runs COMMAND in this process group, which gets STOP_SIGNAL (then SIGKILL after %d s) once the "
               "process GATEWAY_PID is gone\n",
               kGraceSeconds);
  return 2;
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Ends as `status` says its command ended.
[[noreturn]] void EndAs(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    std::signal(sig, SIG_DFL);
    sigset_t just;
    sigemptyset(&just);
    sigaddset(&just, sig);
    sigprocmask(SIG_UNBLOCK, &just, nullptr);
    prctl(PR_SET_DUMPABLE, 0);  // (no core of its own for a command's crash)
    raise(sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

// Its group, the command's and what it left there, stopped: STOP_SIGNAL,
// up to kGraceSeconds for every process it reaps (its subreaper's children
// included) to end, then SIGKILL for the group, itself included.
[[noreturn]] void StopGroup(int stop_signal, const sigset_t& waited) {
  const pid_t group = getpgrp();
  kill(-group, stop_signal);  // (blocked here: only the others act on it)
  kill(-group, SIGCONT);      // (one stopped would wait out the grace)
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += kGraceSeconds;
  while (true) {
    int status = 0;
    pid_t r;
    while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
    }
    if (r < 0 && errno == ECHILD) break;  // nothing of it is left
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > deadline.tv_sec || (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec)) break;
    timespec left{deadline.tv_sec - now.tv_sec, deadline.tv_nsec - now.tv_nsec};
    if (left.tv_nsec < 0) {
      left.tv_nsec += 1000000000L;
      --left.tv_sec;
    }
    sigtimedwait(&waited, nullptr, &left);  // a child's end, or the grace's
  }
  // What did not end in time, and what is not its child (a process that
  // left for another parent stays in the group): killed. Itself last.
  kill(-group, SIGKILL);
  _exit(128 + stop_signal);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::strcmp(argv[3], "--") != 0) return Usage();
  long gateway = 0, stop_signal = 0;
  if (!ParseInt(argv[1], 1, 1L << 22, &gateway) || !ParseInt(argv[2], 1, SIGRTMAX, &stop_signal)) return Usage();
  sigset_t waited, original;
  sigfillset(&waited);
  for (int s : kOwnFaults) sigdelset(&waited, s);
  sigprocmask(SIG_BLOCK, &waited, &original);
  // (SIGCHLD ignored would reap its children before it could read their end.)
  std::signal(SIGCHLD, SIG_DFL);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Asked for first, then the parent checked: a gateway that died before
  // the request is not missed.
  prctl(PR_SET_PDEATHSIG, PdeathSignal());
  const bool orphaned = getppid() != static_cast<pid_t>(gateway);
  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "spillway-tie: fork: %s\n", std::strerror(errno));
    return 126;
  }
  if (child == 0) {
    sigprocmask(SIG_SETMASK, &original, nullptr);
    execvp(argv[4], argv + 4);
    std::fprintf(stderr, "spillway-tie: cannot run %s: %s\n", argv[4], std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  if (orphaned) StopGroup(static_cast<int>(stop_signal), waited);
  while (true) {
    siginfo_t info{};
    const int sig = sigwaitinfo(&waited, &info);
    if (sig < 0) continue;  // (EINTR)
    // The gateway gone comes first, whatever woke it: sigwaitinfo hands out
    // lower signals first, and a command's end (SIGCHLD) or the next
    // gateway's stop, read before the death signal, ended it without its
    // group's stop or passed that stop on a second time.
    if (getppid() != static_cast<pid_t>(gateway)) StopGroup(static_cast<int>(stop_signal), waited);
    if (sig == SIGCHLD) {
      int status = 0;
      pid_t r;
      while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
        if (r == child) EndAs(status);  // (what it left in the group: the supervisor stops that)
      }
      continue;
    }
    if (sig == PdeathSignal()) continue;  // (a gateway thread's end, not the gateway's; or someone else's)
    // The gateway's stop reached the whole group; one from within it (its
    // own passing on among them) is not passed back. A sender outside this
    // pid namespace reads as pid 0: passed on.
    if ((info.si_code == SI_USER || info.si_code == SI_QUEUE) && info.si_pid > 0) {
      if (info.si_pid == getppid() || getpgid(info.si_pid) == getpgrp()) continue;
    }
    kill(-getpgrp(), sig);
  }
}
