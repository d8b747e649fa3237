#pragma once
// Two small RAII threads every node uses: a periodic task and the receive loop.
// Both stop and join in their destructors, so an owner's teardown leaves no thread behind.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>

#include "ps/message.h"
#include "ps/src/start_thread.h"
#include "ps/src/zmq_transport.h"

namespace ps {

// Runs `task` every `period` on its own thread until destroyed. Waiting is a condition
// variable tied to the thread's stop token, so destruction never waits out a period.
class PeriodicTask {
 public:
  PeriodicTask(std::chrono::milliseconds period, std::function<void()> task)
      : thread_(internal::StartThread("the timer",
                                      [period, task = std::move(task)](std::stop_token stop) {
                                        std::mutex mu;
                                        std::condition_variable_any wake;
                                        std::unique_lock lock(mu);
                                        while (true) {
                                          wake.wait_for(lock, stop, period, [] { return false; });
                                          if (stop.stop_requested()) return;
                                          task();
                                        }
                                      })) {}

 private:
  std::jthread thread_;
};

// Calls `handler` on its own thread for every message the transport receives, until the
// transport is shut down. The owner shuts the transport down before destroying this. One
// Message is received into again and again: a handler that leaves its lists in place (the
// server store does) lets the next message reuse their memory.
class ReceiveLoop {
 public:
  ReceiveLoop(ZmqTransport& transport, std::function<void(Message&&)> handler)
      : thread_(internal::StartThread("the receive", [&transport, handler = std::move(handler)] {
          Message msg;
          while (transport.Recv(msg)) handler(std::move(msg));
        })) {}

 private:
  std::jthread thread_;
};

}  // namespace ps
