// ps-kvstore-check: a KVStore program that checks its own results exactly. Run it as every
// worker of a job (or, MXNet style, as every role: KVStore::Create runs the scheduler or server
// role when DMLC_ROLE says so). Integer-valued gradients keep every float sum exact.
//
// Each round, worker r pushes (r + 1) * (k + 1) into every element of key k; with SGD at
// learning rate 1 a key's value after R rounds is -R * (k + 1) * W(W+1)/2 (W workers).
// dist_sync checks that value after every round; dist_async and local check it at the end.
// With --collectives_every N, every N rounds the workers also set the optimizer again, Init a
// new key and pull it back, and with --checkpoint_dir save and load a checkpoint: none of
// which may change a value.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ps/cli/cli.h"
#include "ps/kvstore.h"
#include "ps/src/stderr_log.h"

DEFINE_string(type, "dist_sync", "KVStore type: local, dist_sync or dist_async");
DEFINE_int32(rounds, 20, "Push/pull rounds");
DEFINE_int32(keys, 4, "Number of keys");
DEFINE_int32(size, 1000, "Elements per key");
DEFINE_int32(big_size, 0, "Also use one key of this many elements (0: none)");
DEFINE_int32(report_every, 0, "Print 'kvstore-check: round N' every N rounds (0: never)");
DEFINE_int32(pause_at_round, -1, "Stop and wait forever at this round (tests kill it)");
DEFINE_bool(separate_pull, false,
            "Push, then Pull, instead of one PushPull per round; in dist_sync wait for the pulls "
            "alone (WaitPulls: the pushes are answered later, with replication once the "
            "replica has them)");
DEFINE_int32(collectives_every, 0,
             "Every N rounds also SetOptimizer, Init a new key and check it, and save and load "
             "a checkpoint in --checkpoint-dir (0: never)");
DEFINE_string(checkpoint_dir, "",
              "Where --collectives-every saves and loads (\"\": no checkpoints)");

namespace {

// Ends the check: the job learns why at once (`kv`, when there is one, tells the others, and
// is closed before the exit, which its threads must not outlive), and so does the user.
[[noreturn]] void Fail(std::unique_ptr<ps::KVStore> kv, const std::string& message) {
  if (kv != nullptr) {
    kv->ReportFailure(message);
    kv.reset();
  }
  std::fflush(stdout);  // its progress lines first
  ps::internal::FlushStderrLog();
  std::fprintf(stderr, "ps-kvstore-check: error: %s\n", message.c_str());
  std::exit(1);
}

// The collectives between rounds (--collectives_every): each leaves every value as it was.
void RunCollectives(ps::KVStore& kv, const ps::OptimizerConfig& optimizer, int round) {
  kv.SetOptimizer(optimizer);
  const auto key = static_cast<ps::Key>(1000000 + round);
  std::vector<float> initial(static_cast<std::size_t>(FLAGS_size), static_cast<float>(round));
  std::vector<float> pulled(initial.size(), 0.0f);
  kv.Init(key, ps::Tensor(initial.data(), initial.size()));
  kv.Pull(key, ps::Tensor(pulled.data(), pulled.size()));
  kv.WaitAll();
  if (pulled != initial) {
    throw ps::Error("rank " + std::to_string(kv.Rank()) + " round " + std::to_string(round) +
                    ": the key initialized then did not pull back its initial values");
  }
  if (!FLAGS_checkpoint_dir.empty()) {
    kv.SaveCheckpoint(FLAGS_checkpoint_dir);
    kv.LoadCheckpoint(FLAGS_checkpoint_dir);
  }
}

// Refuses flags out of range, naming them.
void CheckFlags() {
  for (const auto& [flag, value, least] :
       {std::tuple{"--rounds", FLAGS_rounds, 1}, std::tuple{"--keys", FLAGS_keys, 0},
        std::tuple{"--size", FLAGS_size, 1}, std::tuple{"--big-size", FLAGS_big_size, 0},
        std::tuple{"--report-every", FLAGS_report_every, 0},
        std::tuple{"--collectives-every", FLAGS_collectives_every, 0}}) {
    if (value < least) {
      ps::cli::Die("ps-kvstore-check", std::string(flag) + " " + std::to_string(value) + ": want " +
                                           std::to_string(least) + " or more");
    }
  }
  if (FLAGS_keys == 0 && FLAGS_big_size == 0) {
    ps::cli::Die("ps-kvstore-check", "--keys 0 without --big-size checks nothing: give a key");
  }
}

// The checked keys and the buffers their calls use. The views point into the vectors beside
// them, which are never resized.
struct CheckedKeys {
  std::vector<ps::Key> keys;
  std::vector<std::vector<float>> weights, grads, outs;
  std::vector<ps::Tensor> weight_views, grad_views, out_views;
};

// --keys keys of --size elements and the --big-size one; worker `rank` pushes (rank + 1) * (k + 1).
CheckedKeys MakeKeys(int rank) {
  CheckedKeys c;
  std::vector<std::size_t> sizes;
  for (int k = 0; k < FLAGS_keys; ++k) {
    c.keys.push_back(static_cast<ps::Key>(k));
    sizes.push_back(static_cast<std::size_t>(FLAGS_size));
  }
  if (FLAGS_big_size > 0) {
    c.keys.push_back(static_cast<ps::Key>(FLAGS_keys));
    sizes.push_back(static_cast<std::size_t>(FLAGS_big_size));
  }
  for (std::size_t k = 0; k < c.keys.size(); ++k) {
    c.weights.emplace_back(sizes[k], 0.0f);
    c.grads.emplace_back(sizes[k], static_cast<float>((rank + 1) * (k + 1)));
    c.outs.emplace_back(sizes[k], 0.0f);
  }
  for (std::size_t k = 0; k < c.keys.size(); ++k) {
    c.weight_views.emplace_back(c.weights[k].data(), sizes[k]);
    c.grad_views.emplace_back(c.grads[k].data(), sizes[k]);
    c.out_views.emplace_back(c.outs[k].data(), sizes[k]);
  }
  return c;
}

// Throws, naming `where` and the key, unless every pulled element of key k is
// `per_key * (k + 1)`.
void ExpectPulled(const CheckedKeys& c, float per_key, const std::string& where) {
  for (std::size_t k = 0; k < c.keys.size(); ++k) {
    const float expected = per_key * static_cast<float>(k + 1);
    for (const float value : c.outs[k]) {
      if (value != expected) {
        throw ps::Error(where + " key " + std::to_string(k) + ": expected " +
                        std::to_string(expected) + ", got " + std::to_string(value));
      }
    }
  }
}

// One round's push and pull, waited for.
void PushAndPull(ps::KVStore& kv, CheckedKeys& c, bool sync) {
  if (FLAGS_separate_pull) {
    kv.Push(c.keys, c.grad_views);
    kv.Pull(c.keys, c.out_views);
  } else {
    kv.PushPull(c.keys, c.grad_views, c.out_views);
  }
  if (FLAGS_separate_pull && sync) {
    kv.WaitPulls(c.keys);  // the pushed buffers never change: their answers may come later
  } else {
    kv.WaitAll();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "ps-kvstore-check: checks a KVStore job's results exactly.\nUsage: ps-kvstore-check [flags] "
      "(cluster from the DMLC_* environment)";
  if (ps::cli::HelpOrParseFlags(&argc, &argv, usage, "kvstore_check.cc")) return 0;
  CheckFlags();
  std::unique_ptr<ps::KVStore> kv;
  try {
    kv = ps::KVStore::Create(FLAGS_type);
    const int rank = kv->Rank();
    const int workers = kv->NumWorkers();
    CheckedKeys c = MakeKeys(rank);
    kv->Init(c.keys, c.weight_views);
    ps::OptimizerConfig sgd;
    sgd.name = "sgd";
    sgd.learning_rate = 1.0f;
    kv->SetOptimizer(sgd);

    const float per_round = static_cast<float>(workers * (workers + 1) / 2);
    const bool sync = FLAGS_type == "dist_sync";
    for (int round = 1; round <= FLAGS_rounds; ++round) {
      if (round == FLAGS_pause_at_round) {
        std::printf("kvstore-check: paused at round %d\n", round);
        std::fflush(stdout);
        while (true) std::this_thread::sleep_for(std::chrono::hours(1));  // killed by the test
      }
      PushAndPull(*kv, c, sync);
      if (sync || FLAGS_type == "local") {
        ExpectPulled(c,
                     -static_cast<float>(round) * (sync ? per_round : static_cast<float>(rank + 1)),
                     "rank " + std::to_string(rank) + " round " + std::to_string(round));
      }
      if (FLAGS_collectives_every > 0 && round % FLAGS_collectives_every == 0) {
        RunCollectives(*kv, sgd, round);
      }
      if (FLAGS_report_every > 0 && round % FLAGS_report_every == 0) {
        std::printf("kvstore-check: round %d\n", round);
        std::fflush(stdout);
      }
    }
    kv->WaitAll();  // this worker's pushes are answered: applied (and replicated)
    kv->Barrier();  // every worker's pushes are in
    kv->Pull(c.keys, c.out_views);
    kv->WaitAll();
    ExpectPulled(c, -static_cast<float>(FLAGS_rounds) * (FLAGS_type == "local" ? 1.0f : per_round),
                 "rank " + std::to_string(rank) + " final");
    std::printf("kvstore-check: ok rank=%d workers=%d keys=%zu rounds=%d\n", rank, workers,
                c.keys.size(), FLAGS_rounds);
    return 0;
  } catch (const ps::Error& e) {
    Fail(std::move(kv), e.what());
  } catch (const std::bad_alloc&) {
    Fail(std::move(kv),
         "out of memory for the keys' values and gradients (--keys, --size, --big-size): lower "
         "them, or give the process more memory");
  }
}
