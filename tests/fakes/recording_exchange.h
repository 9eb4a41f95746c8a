// A client exchange that records what the gateway said (status, headers,
// body or stream) and lets a test wait until the answer is complete.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "api/http_server.h"

namespace spillway::testing {

class RecordingExchange : public http::Exchange {
 public:
  void Respond(http::Response res) override {
    std::lock_guard<std::mutex> lk(mu_);
    status_ = res.result_int();
    head_ = res;
    body_ = res.body();
    done_ = true;
    cv_.notify_all();
  }
  void StartStream(http::Response head) override {
    std::lock_guard<std::mutex> lk(mu_);
    status_ = head.result_int();
    head_ = head;
    streamed_ = true;
  }
  void Write(std::string data) override {
    std::lock_guard<std::mutex> lk(mu_);
    body_ += data;
  }
  void End() override {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Abort() override {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = aborted_ = true;
    cv_.notify_all();
  }
  // The stream was ended as cut (Abort), not completed (End).
  bool aborted() const {
    std::lock_guard<std::mutex> lk(mu_);
    return aborted_;
  }
  void OnDisconnect(std::function<void()> cb) override {
    std::lock_guard<std::mutex> lk(mu_);
    on_disconnect_ = std::move(cb);
  }
  bool disconnected() const override { return disconnected_; }
  // What a slow reader leaves unsent (set by a test; 0: a reader that keeps up).
  size_t unsent_bytes() const override { return pretend_unsent.load(); }
  std::atomic<size_t> pretend_unsent{0};
  std::string peer_address() const override { return peer; }
  std::string peer = "127.0.0.1";  // where the client calls from (set before the gateway sees it)
  // The client goes away: the gateway's disconnect hook runs.
  void Disconnect() {
    std::function<void()> cb;
    {
      std::lock_guard<std::mutex> lk(mu_);
      disconnected_ = true;
      cb = on_disconnect_;
    }
    if (cb) cb();
  }

  // Waits until the answer (or the stream) is complete; false on timeout.
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return done_; });
  }
  // Waits until the body holds `text` (a stream in progress); false on timeout.
  bool WaitFor(const std::string& text, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (body_.find(text) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  bool done() const {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  // The answer's status, a header, the body (so far, of a stream): read
  // only once there is an answer or a stream. Many routes answer on another
  // thread after Handle returns (a journal read, a coroutine), so a read
  // before Wait() would pass or fail by which thread ran first; such a read
  // fails the test at once, every time.
  unsigned status() const {
    std::lock_guard<std::mutex> lk(mu_);
    AnsweredOrStreaming("status()");
    return status_;
  }
  std::string header(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    AnsweredOrStreaming("header()");
    auto it = head_.find(name);
    return it == head_.end() ? "" : std::string(it->value());
  }
  std::string body() const {
    std::lock_guard<std::mutex> lk(mu_);
    AnsweredOrStreaming("body()");
    return body_;
  }
  // What reached the client so far, answered or not: for checks that
  // nothing (or nothing more) did.
  std::string received() const {
    std::lock_guard<std::mutex> lk(mu_);
    return body_;
  }
  bool streamed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return streamed_;
  }

 private:
  void AnsweredOrStreaming(const char* what) const {
    if (!done_ && !streamed_) ADD_FAILURE() << "RecordingExchange::" << what << " read before any answer: Wait() first";
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  unsigned status_ = 0;
  http::Response head_;
  std::string body_;
  bool streamed_ = false, done_ = false, aborted_ = false;
  std::atomic<bool> disconnected_{false};
  std::function<void()> on_disconnect_;
};

}  // namespace spillway::testing
