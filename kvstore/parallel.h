#pragma once
// Spreading an element-wise loop over threads: ParallelFor splits [0, n) into contiguous
// chunks, the calling thread takes the first and the others run on helper threads, either
// started for the call or, when ParallelOptions::pool is set, a ParallelPool's threads that
// live as long as their owner (a server: no thread is started or allocated per update).
// Every caller's work is element-wise, so the result is the same whatever the split.
#include <cstddef>
#include <thread>
#include <vector>

#include "ps/mutex.h"
#include "ps/thread_annotations.h"

namespace ps {

class ParallelPool;

// How element-wise kernels spread a big array over threads.
struct ParallelOptions {
  // Arrays shorter than this run on the calling thread: below ~1 MB of floats, starting
  // threads costs more than the memory traffic they would share.
  std::size_t min_parallel_elements = 256 * 1024;
  // Most threads one call uses, the calling thread included. 0: the hardware thread count,
  // capped at 4 (a few threads already saturate memory bandwidth; the server has other work).
  unsigned max_threads = 0;
  // Helper threads to use instead of starting some per call (not owned; may be null). A call
  // uses at most its helpers plus the calling thread.
  ParallelPool* pool = nullptr;
};

// Threads a call over n elements uses with these options (>= 1).
unsigned ParallelThreads(std::size_t n, const ParallelOptions& options);

// A non-owning reference to fn(begin, end): passing one allocates nothing.
class ChunkFn {
 public:
  template <class Fn>
  explicit ChunkFn(const Fn& fn)
      : fn_(&fn), call_([](const void* f, std::size_t begin, std::size_t end) {
          (*static_cast<const Fn*>(f))(begin, end);
        }) {}
  void operator()(std::size_t begin, std::size_t end) const { call_(fn_, begin, end); }

 private:
  const void* fn_;
  void (*call_)(const void*, std::size_t, std::size_t);
};

// Helper threads for ParallelFor, started once and joined at destruction. Run() may be called
// from several threads; calls are served one at a time.
class ParallelPool {
 public:
  // helpers: threads besides the caller's (0: the hardware thread count minus one, capped at 3).
  explicit ParallelPool(unsigned helpers = 0);
  ~ParallelPool();
  ParallelPool(const ParallelPool&) = delete;
  ParallelPool& operator=(const ParallelPool&) = delete;

  unsigned helpers() const { return static_cast<unsigned>(threads_.size()); }
  // Runs fn over `chunks` chunks of `chunk` elements of [0, n); chunk 0 on the calling thread.
  // Returns when every chunk is done. fn must not throw on a helper (a throw there terminates).
  void Run(std::size_t n, std::size_t chunk, unsigned chunks, ChunkFn fn);

 private:
  void Help();  // a helper thread's loop
  // Runs the job's next chunk, releasing mu_ around it; false when none is left.
  bool RunNextChunk() PS_REQUIRES(mu_);

  Mutex run_mu_;  // one Run at a time
  Mutex mu_;
  CondVar work_ready_;
  CondVar work_done_;
  // The job being run.
  const ChunkFn* fn_ PS_GUARDED_BY(mu_) = nullptr;
  std::size_t n_ PS_GUARDED_BY(mu_) = 0;
  std::size_t chunk_ PS_GUARDED_BY(mu_) = 0;
  unsigned next_chunk_ PS_GUARDED_BY(mu_) = 0;  // the next chunk a helper takes
  unsigned chunks_ PS_GUARDED_BY(mu_) = 0;      // chunks in the job
  unsigned unfinished_ PS_GUARDED_BY(mu_) = 0;  // helper chunks not done yet
  bool stopping_ PS_GUARDED_BY(mu_) = false;
  std::vector<std::jthread> threads_;  // last: started after, joined before the members above
};

namespace detail {
// ParallelFor's threaded case: `threads` > 1 contiguous chunks.
void RunChunks(std::size_t n, unsigned threads, const ParallelOptions& options, ChunkFn fn);
}  // namespace detail

// Runs fn(begin, end) over [0, n) split into contiguous chunks (see above); returns when all
// chunks are done. fn must not throw on a helper thread (a throw there terminates). A template
// so that no call wraps (and allocates) a std::function.
template <class Fn>
void ParallelFor(std::size_t n, const ParallelOptions& options, const Fn& fn) {
  if (n == 0) return;
  const unsigned threads = ParallelThreads(n, options);
  if (threads <= 1) {
    fn(std::size_t{0}, n);
    return;
  }
  detail::RunChunks(n, threads, options, ChunkFn(fn));
}

}  // namespace ps
