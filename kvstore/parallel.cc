#include "kvstore/parallel.h"

#include <algorithm>
#include <exception>
#include <system_error>

namespace ps {
namespace {

// Chunk boundaries are multiples of this many elements (one 64-byte line of floats), so two
// threads never write the same cache line of a float array.
constexpr std::size_t kChunkAlign = 16;

unsigned DefaultThreads() { return std::clamp(std::thread::hardware_concurrency(), 1u, 4u); }

}  // namespace

unsigned ParallelThreads(std::size_t n, const ParallelOptions& options) {
  if (n < options.min_parallel_elements || n < 2 * kChunkAlign) return 1;
  unsigned threads = options.max_threads == 0 ? DefaultThreads() : options.max_threads;
  if (options.pool != nullptr) threads = std::min(threads, options.pool->helpers() + 1);
  // Never more threads than aligned chunks.
  const std::size_t max_chunks = n / kChunkAlign;
  return static_cast<unsigned>(std::min<std::size_t>(threads, max_chunks));
}

ParallelPool::ParallelPool(unsigned helpers) {
  if (helpers == 0) helpers = DefaultThreads() - 1;
  threads_.reserve(helpers);
  for (unsigned i = 0; i < helpers; ++i) {
    try {
      threads_.emplace_back([this] { Help(); });
    } catch (const std::system_error&) {
      break;  // no more threads available: work with those started
    }
  }
}

ParallelPool::~ParallelPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  work_ready_.NotifyAll();
  // threads_ is destroyed first and joins every helper.
}

bool ParallelPool::RunNextChunk() {
  if (next_chunk_ >= chunks_) return false;
  const unsigned index = next_chunk_++;
  const std::size_t begin = index * chunk_;
  const std::size_t end = std::min(n_, begin + chunk_);
  const ChunkFn& fn = *fn_;
  mu_.Unlock();
  try {
    fn(begin, end);
  } catch (...) {
    mu_.Lock();  // the caller's scoped lock holds mu_ again, as it expects
    throw;
  }
  mu_.Lock();
  if (--unfinished_ == 0) work_done_.NotifyAll();
  return true;
}

void ParallelPool::Help() {
  MutexLock lock(mu_);
  while (true) {
    while (!stopping_ && next_chunk_ >= chunks_) work_ready_.Wait(mu_);
    if (stopping_) return;
    while (RunNextChunk()) {
    }
  }
}

void ParallelPool::Run(std::size_t n, std::size_t chunk, unsigned chunks, ChunkFn fn) {
  MutexLock run(run_mu_);
  {
    MutexLock lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_chunk_ = 1;  // chunk 0 is the caller's
    chunks_ = chunks;
    unfinished_ = chunks - 1;
  }
  work_ready_.NotifyAll();
  std::exception_ptr failure;
  try {
    fn(0, std::min(n, chunk));
  } catch (...) {
    failure = std::current_exception();
  }
  MutexLock lock(mu_);
  // Chunks no helper has taken yet (a helper slow to wake) are the caller's too.
  while (!failure && RunNextChunk()) {
  }
  if (failure) {
    unfinished_ -= chunks_ - next_chunk_;  // never started: nobody will finish them
    next_chunk_ = chunks_;
  }
  // Helpers still running reference fn: wait for them, also when the caller's chunk threw.
  while (unfinished_ != 0) work_done_.Wait(mu_);
  chunks_ = 0;
  next_chunk_ = 0;
  fn_ = nullptr;
  lock.Unlock();
  if (failure) std::rethrow_exception(failure);
}

void detail::RunChunks(std::size_t n, unsigned threads, const ParallelOptions& options,
                       ChunkFn fn) {
  std::size_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  const auto chunks = static_cast<unsigned>((n + chunk - 1) / chunk);
  if (options.pool != nullptr) {
    options.pool->Run(n, chunk, chunks, fn);
    return;
  }
  // Helpers are joined by ~jthread at scope exit, also when fn throws on this thread.
  std::vector<std::jthread> helpers;
  helpers.reserve(chunks - 1);
  for (std::size_t begin = chunk; begin < n; begin += chunk) {
    const std::size_t end = std::min(n, begin + chunk);
    try {
      helpers.emplace_back([fn, begin, end] { fn(begin, end); });
    } catch (const std::system_error&) {
      fn(begin, end);  // no thread available: do the chunk here
    }
  }
  fn(0, std::min(n, chunk));
}

}  // namespace ps
