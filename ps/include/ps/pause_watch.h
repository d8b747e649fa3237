// PauseWatch: tells from the ticks of a periodic timer whether this process itself did not run
// for a while (SIGSTOP, a frozen VM, CPU starvation). A peer's silence across such a pause is
// this process's doing, not the peer's: the runtime and the scheduler judge heartbeats by it.
#pragma once

#include <chrono>
#include <utility>

namespace ps {

// Used by one thread (the timer's), after Start; not thread-safe.
class PauseWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // A gap of `threshold` or more between two ticks is a pause.
  explicit PauseWatch(Clock::duration threshold) : threshold_(threshold) {}

  // The reference of the first tick: a pause from `now` on counts.
  void Start(Clock::time_point now) { last_tick_ = now; }

  // On each tick: the gap since the previous tick (or Start) when it is a pause, else zero.
  Clock::duration Tick(Clock::time_point now) {
    const Clock::duration gap = now - std::exchange(last_tick_, now);
    if (gap < threshold_) return Clock::duration::zero();
    last_pause_ = gap;
    last_pause_ended_ = now;
    return gap;
  }

  // The gap since the last tick: a pause in progress as seen from another thread, before the
  // next tick reports it (the caller must order its reads with Tick, e.g. under one mutex).
  Clock::duration SinceTick(Clock::time_point now) const { return now - last_tick_; }

  // The latest pause, and when it ended (zero and the clock's epoch: none yet).
  Clock::duration last_pause() const { return last_pause_; }
  Clock::time_point last_pause_ended() const { return last_pause_ended_; }

 private:
  const Clock::duration threshold_;
  Clock::time_point last_tick_;
  Clock::duration last_pause_{};
  Clock::time_point last_pause_ended_{};
};

}  // namespace ps
