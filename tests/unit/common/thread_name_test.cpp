#include "common/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "common/thread_pool.h"

namespace spillway {
namespace {

std::string CommOf(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// Each thread says what it is (top -H, perf); a name past Linux's 15 bytes is cut, not refused.
TEST(ThreadNameTest, AThreadIsNamedAndALongNameIsCut) {
  std::string named, cut;
  std::thread([&] {
    NameThisThread("sw-journal");
    named = CommOf(::syscall(SYS_gettid));
    NameThisThread("sw-a-name-longer-than-fifteen");
    cut = CommOf(::syscall(SYS_gettid));
  }).join();
  EXPECT_EQ(named, "sw-journal");
  EXPECT_EQ(cut, "sw-a-name-longe");
}

TEST(ThreadNameTest, APoolsThreadsCarryItsThreadName) {
  ThreadPool pool(1, "test's", "sw-test-pool");
  std::promise<std::string> name;
  boost::asio::post(pool.get_executor(), [&] { name.set_value(CommOf(::syscall(SYS_gettid))); });
  EXPECT_EQ(name.get_future().get(), "sw-test-pool");
}

}  // namespace
}  // namespace spillway
