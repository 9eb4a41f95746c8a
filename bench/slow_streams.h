// Many streaming requests held open by slow readers, all on one client
// thread (Asio, non-blocking sockets): each reads one SSE event per
// interval and leaves the rest in the socket, so the server sees a client
// that keeps its stream open and drains it slowly, as a person reading a
// long answer would, not one thread per stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace spillway::bench {

class SlowStreams {
 public:
  struct Options {
    uint16_t port = 0;
    std::string target = "/v1/chat/completions";
    std::string body;  // a streaming request ("stream": true)
    int streams = 0;
    std::chrono::milliseconds interval{1000};  // one event read per interval
  };
  // Where the streams stand (each counter a number of streams, except events).
  struct Counts {
    int connected = 0;   // TCP connected and the request written
    int answered = 0;    // got a 200 event-stream head
    int with_data = 0;   // got at least one data event (their request runs on a worker)
    int done = 0;        // read to [DONE]
    int refused = 0;     // answered with another status (e.g. 503 after waiting too long)
    int failed = 0;      // connection failed or closed before [DONE]
    int last_refusal = 0;  // the status of the latest refusal
    uint64_t events = 0;   // data events read, all streams
  };

  explicit SlowStreams(Options o);
  ~SlowStreams();  // Close()
  SlowStreams(const SlowStreams&) = delete;
  SlowStreams& operator=(const SlowStreams&) = delete;

  void Open();  // connects every stream and sends its request; returns at once
  Counts counts() const;
  void Close();  // closes every connection (the server sees the clients go) and joins the thread

  struct Shared;  // what the readers and this object share (slow_streams.cpp)

 private:
  Options o_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  std::function<void()> close_;  // run on the client thread
};

}  // namespace spillway::bench
