// SaveCheckpoint / LoadCheckpoint: a restored job goes on bit for bit as the saved one did
// (values and optimizer state: momentum, Adam moments, update counts), also with another
// number of servers; damaged checkpoints are clear errors on every worker and change nothing.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvstore/checkpoint.h"
#include "kvstore/local_kvstore.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/kvstore/kv_rounds.h"
#include "tests/util/temp_dir.h"

namespace {

using ps::test::AllOk;
using ps::test::Expect;
using ps::test::KVCluster;
using ps::test::TempDir;

constexpr std::size_t kSmall = 6;
constexpr std::size_t kBig = 3000;  // sliced over every server (bound 1000 below)

ps::OptimizerConfig Adam() {
  ps::OptimizerConfig adam;
  adam.name = "adam";
  adam.learning_rate = 0.01f;
  adam.weight_decay = 0.001f;
  return adam;
}

// Gradients that differ per worker, key, element and round, so that state mistakes show.
std::vector<float> Gradient(int rank, std::size_t size, int round, int key) {
  std::vector<float> grad(size);
  for (std::size_t i = 0; i < size; ++i) {
    grad[i] = static_cast<float>((static_cast<int>(i) * 7 + round * 13 + rank * 5 + key) % 17) - 8;
  }
  return grad;
}

// Init keys 1 (small) and 2 (big), then `rounds` dist_sync PushPulls; returns both values.
std::vector<std::vector<float>> Run(ps::KVStore& kv, int first_round, int rounds) {
  std::vector<std::vector<float>> values{std::vector<float>(kSmall), std::vector<float>(kBig)};
  const std::size_t sizes[] = {kSmall, kBig};
  for (int round = first_round; round < first_round + rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      auto grad = Gradient(kv.Rank(), sizes[k], round, k + 1);
      kv.PushPull(k + 1, ps::Tensor(grad.data(), sizes[k]),
                  ps::Tensor(values[static_cast<std::size_t>(k)].data(), sizes[k]));
      kv.WaitAll();
    }
  }
  return values;
}

void InitKeys(ps::KVStore& kv) {
  std::vector<float> small(kSmall, 0.5f), big(kBig, -0.25f);
  kv.Init({1, 2}, {ps::Tensor(small.data(), kSmall), ps::Tensor(big.data(), kBig)});
  kv.SetOptimizer(Adam());
}

ps::test::Env SlicedEnv() { return {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"}}; }

// Puts a FIFO in the place of `file` (a file system that answers only as fast as someone
// writes into it, or never); returns what the file held.
std::string ReplaceWithFifo(const std::string& file) {
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::remove(file);
  Expect(mkfifo(file.c_str(), 0600) == 0, "mkfifo " + file);
  return bytes;
}

}  // namespace

TEST_CASE("checkpoint: dist_sync resumes bit for bit, also with another number of servers",
          "[dist][checkpoint]") {
  TempDir dir;
  std::vector<std::vector<float>> straight;  // 5 rounds, a save after the 3rd
  // An earlier checkpoint's file there, of 3 servers, goes with the save; other files stay.
  for (const std::string name : {"server-2-of-3.psckpt", "server-2-of-3.psckpt.bak", "notes"}) {
    std::ofstream(dir.path() + "/" + name) << "earlier\n";
  }
  {
    KVCluster cluster(2, 2, SlicedEnv());
    std::vector<std::vector<std::vector<float>>> results(2);
    const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
      InitKeys(kv);
      Run(kv, 0, 3);
      kv.SaveCheckpoint(dir.path());
      results[static_cast<std::size_t>(kv.Rank())] = Run(kv, 3, 2);
    });
    REQUIRE(AllOk(outcomes) == "");
    CHECK(cluster.EndedCleanly());
    CHECK(results[0] == results[1]);
    straight = results[0];
  }
  CHECK(std::filesystem::exists(dir.path() + "/MANIFEST"));
  CHECK(std::filesystem::exists(dir.path() + "/server-1-of-2.psckpt"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/server-2-of-3.psckpt"));
  CHECK(std::filesystem::exists(dir.path() + "/server-2-of-3.psckpt.bak"));
  CHECK(std::filesystem::exists(dir.path() + "/notes"));
  // The last: another key layout on as many servers, without replication (where each server
  // would read only its own file): server weights move the big key's slices between them.
  ps::test::Env weighted = SlicedEnv();
  weighted["PS_SERVER_WEIGHTS"] = "1,0.25";
  weighted["PS_REPLICATION"] = "0";
  const std::vector<std::pair<int, ps::test::Env>> jobs = {
      {2, SlicedEnv()}, {3, SlicedEnv()}, {1, SlicedEnv()}, {2, weighted}};
  for (const auto& [servers, env] : jobs) {
    INFO(servers << " servers" << (env.contains("PS_SERVER_WEIGHTS") ? ", weighted" : ""));
    KVCluster cluster(servers, 2, env);
    const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
      InitKeys(kv);
      kv.LoadCheckpoint(dir.path());
      Expect(Run(kv, 3, 2) == straight, "the resumed rounds match the uninterrupted ones");
    });
    CHECK(AllOk(outcomes) == "");
    CHECK(cluster.EndedCleanly());
  }
}

TEST_CASE("checkpoint: a key whose optimizer state outgrows a header loads with replication",
          "[dist][checkpoint]") {
  // Adam keeps two floats per element: a whole key of 300000 floats has 2.4 MB of state, more
  // than a message header may hold. Loading copies every slice with its state to its replica
  // (two servers: replication on), which once sent the state in the header: the replica
  // dropped it and the load waited for ever. Now it loads, and the job goes on exactly.
  constexpr std::size_t kWide = 300000;
  TempDir dir;
  KVCluster cluster(2, 1);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kWide, 0.5f), out(kWide), resumed(kWide);
    kv.Init(7, ps::Tensor(value.data(), kWide));
    kv.SetOptimizer(Adam());
    const auto round = [&](int r, std::vector<float>& into) {
      auto grad = Gradient(0, kWide, r, 7);
      kv.PushPull(7, ps::Tensor(grad.data(), kWide), ps::Tensor(into.data(), kWide));
      kv.WaitAll();
    };
    round(0, out);
    kv.SaveCheckpoint(dir.path());
    round(1, out);  // the value and the state past the checkpoint
    kv.LoadCheckpoint(dir.path());
    round(1, resumed);  // the same round again, from the checkpoint
    Expect(resumed == out, "the round after the load matches the one after the save");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("checkpoint: a relative directory is the calling worker's, for the servers too",
          "[dist][checkpoint]") {
  // The servers run in the directory they were started in, the worker in another: every file
  // of the checkpoint goes to the worker's, and it loads from there by either name.
  TempDir workdir;
  const std::filesystem::path started_in = std::filesystem::current_path();
  KVCluster cluster(2, 1, SlicedEnv());
  std::filesystem::current_path(workdir.path());  // after the servers started
  std::vector<std::vector<float>> after_save;
  std::vector<std::vector<float>> after_load;
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    Run(kv, 0, 2);
    kv.SaveCheckpoint("relative/ck");
    after_save = Run(kv, 2, 1);
    kv.LoadCheckpoint(workdir.path() + "/relative/ck");
    after_load = Run(kv, 2, 1);
    kv.LoadCheckpoint("relative/ck");
  });
  std::filesystem::current_path(started_in);
  CHECK(AllOk(outcomes) == "");
  CHECK(after_load == after_save);
  CHECK(cluster.EndedCleanly());
  for (const std::string name : {"MANIFEST", "server-0-of-2.psckpt", "server-1-of-2.psckpt"}) {
    CHECK(std::filesystem::exists(workdir.path() + "/relative/ck/" + name));
  }
  CHECK_FALSE(std::filesystem::exists(started_in / "relative"));
}

TEST_CASE("checkpoint: the local store and a dist store read each other's checkpoints",
          "[dist][checkpoint]") {
  TempDir dir;
  ps::LocalKVStore local;
  std::vector<float> value(kSmall, 1.0f), grad(kSmall, 2.0f), out(kSmall);
  local.Init(7, ps::Tensor(value.data(), kSmall));
  ps::OptimizerConfig sgd;
  sgd.learning_rate = 0.5f;
  sgd.momentum = 0.9f;
  local.SetOptimizer(sgd);
  local.Push(7, ps::Tensor(grad.data(), kSmall));
  local.SaveCheckpoint(dir.path());
  local.Push(7, ps::Tensor(grad.data(), kSmall));
  local.Pull(7, ps::Tensor(out.data(), kSmall));
  const std::vector<float> after_two = out;

  KVCluster cluster(1, 1);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> fresh(kSmall, 0.0f), pushed(kSmall, 2.0f), pulled(kSmall);
    kv.Init(7, ps::Tensor(fresh.data(), kSmall));
    kv.SetOptimizer(sgd);
    kv.LoadCheckpoint(dir.path());
    // The momentum came along: the second step lands where the local store's did.
    kv.PushPull(7, ps::Tensor(pushed.data(), kSmall), ps::Tensor(pulled.data(), kSmall));
    kv.WaitAll();
    Expect(pulled == after_two, "a local checkpoint continues in dist_sync");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("checkpoint: missing, corrupt or mismatched checkpoints fail on every worker",
          "[dist][checkpoint][errors]") {
  TempDir dir;
  KVCluster cluster(2, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kSmall, 3.0f), out(kSmall);
    kv.Init({1, 2}, {ps::Tensor(value.data(), kSmall), ps::Tensor(value.data(), kSmall)});
    const auto error_of = [&](const std::string& path) -> std::string {
      try {
        kv.LoadCheckpoint(path);
      } catch (const ps::Error& e) {
        return e.what();
      }
      return "no error";
    };
    std::string e = error_of(dir.path() + "/none");
    Expect(e.find("MANIFEST is missing") != std::string::npos, "no checkpoint: " + e);
    kv.SaveCheckpoint(dir.path());
    kv.Barrier();
    e = error_of(dir.path() + "/MANIFEST");  // a file of the checkpoint, not its directory
    Expect(e.find("it is a file, not a directory") != std::string::npos, "a file: " + e);
    if (kv.Rank() == 0) {  // flip one byte of server 1's file
      std::fstream file(dir.path() + "/server-1-of-2.psckpt",
                        std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(40);
      file.put('\x7f');
    }
    kv.Barrier();
    e = error_of(dir.path());
    Expect(e.find("server-1-of-2.psckpt is corrupt") != std::string::npos, "corrupt: " + e);
    if (kv.Rank() == 0) std::filesystem::remove(dir.path() + "/server-1-of-2.psckpt");
    kv.Barrier();
    e = error_of(dir.path());
    Expect(e.find("server-1-of-2.psckpt is missing") != std::string::npos, "missing: " + e);
    // Nothing changed on any server: the values are still those of Init.
    kv.Pull(1, ps::Tensor(out.data(), kSmall));
    kv.WaitAll();
    Expect(out == value, "values untouched");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());

  // A checkpoint with Adam's state does not load into a job without that optimizer.
  TempDir adam_dir;
  ps::LocalKVStore saved;
  std::vector<float> value(kSmall, 1.0f);
  saved.Init(1, ps::Tensor(value.data(), kSmall));
  saved.SetOptimizer(Adam());
  saved.Push(1, ps::Tensor(value.data(), kSmall));
  saved.SaveCheckpoint(adam_dir.path());
  ps::LocalKVStore plain;
  plain.Init(1, ps::Tensor(value.data(), kSmall));
  CHECK_THROWS_WITH(plain.LoadCheckpoint(adam_dir.path()),
                    Catch::Contains("call SetOptimizer before LoadCheckpoint"));
  ps::OptimizerConfig sgd;
  plain.SetOptimizer(sgd);
  CHECK_THROWS_WITH(plain.LoadCheckpoint(adam_dir.path()),
                    Catch::Contains("holds adam optimizer state, this job's optimizer is sgd"));
  ps::LocalKVStore bigger;
  std::vector<float> longer(kSmall + 1, 1.0f);
  bigger.Init(1, ps::Tensor(longer.data(), kSmall + 1));
  // Another model is named as such before its optimizer is looked at.
  CHECK_THROWS_AS(bigger.LoadCheckpoint(adam_dir.path()), ps::CheckpointMismatchError);
  bigger.SetOptimizer(Adam());
  CHECK_THROWS_WITH(
      bigger.LoadCheckpoint(adam_dir.path()),
      Catch::Contains("key 1: the checkpoint holds 6 x float32, this job 7 x float32"));
  // Another model's parameters are a type of their own; another optimizer is not.
  CHECK_THROWS_AS(bigger.LoadCheckpoint(adam_dir.path()), ps::CheckpointMismatchError);
  CHECK(ps::test::ErrorKindOf([&] { plain.LoadCheckpoint(adam_dir.path()); }) ==
        ps::ErrorKind::kOther);
}

TEST_CASE("checkpoint: SGD saved with momentum does not load into SGD without, in either store",
          "[dist][checkpoint][errors]") {
  TempDir dir;
  ps::OptimizerConfig with_momentum;
  with_momentum.momentum = 0.9f;
  const ps::OptimizerConfig without_momentum;  // sgd, no state buffers
  std::vector<float> value(kSmall, 1.0f);
  ps::LocalKVStore saved;
  saved.Init(1, ps::Tensor(value.data(), kSmall));
  saved.SetOptimizer(with_momentum);
  saved.Push(1, ps::Tensor(value.data(), kSmall));
  saved.SaveCheckpoint(dir.path());
  const std::string why =
      "key 1: the checkpoint keeps 1 optimizer buffer(s) per element, sgd as set now keeps 0 (e.g. "
      "SGD saved with momentum, loaded without): set the same optimizer";
  ps::LocalKVStore local;
  local.Init(1, ps::Tensor(value.data(), kSmall));
  local.SetOptimizer(without_momentum);
  CHECK_THROWS_WITH(local.LoadCheckpoint(dir.path()), "local kvstore: LoadCheckpoint: " + why);
  std::vector<float> out(kSmall);
  local.Pull(1, ps::Tensor(out.data(), kSmall));
  CHECK(out == value);  // unchanged
  // The servers check each slice the same way, in the same words.
  KVCluster cluster(1, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    kv.Init(1, ps::Tensor(value.data(), kSmall));
    kv.SetOptimizer(without_momentum);
    std::string what = "no error";
    try {
      kv.LoadCheckpoint(dir.path());
    } catch (const ps::Error& e) {
      what = e.what();
    }
    Expect(what.find("dist kvstore: LoadCheckpoint failed on every worker") == 0 &&
               what.find(why) != std::string::npos,
           "the dist store's message: " + what);
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("checkpoint: a push residual file reads back, and is refused when it cannot be one",
          "[checkpoint][errors]") {
  namespace cp = ps::checkpoint;
  TempDir dir;
  cp::Residuals written;
  written.manifest_id = 0x1234;
  written.compression = "type=2bit threshold=0.5";
  written.rank = 1;
  written.workers = 2;
  written.keys[3] = {0.25f, -0.5f, 0.0f};
  written.keys[9] = {1.0f};
  cp::WriteResidualFile(dir.path(), written);
  const std::uint64_t most = cp::ResidualFileBytes(written.compression.size(), {3, 1});
  const auto read = cp::ReadResidualFile(dir.path(), 1, most);
  REQUIRE(read.has_value());
  CHECK(read->manifest_id == 0x1234);
  CHECK(read->compression == written.compression);
  CHECK(read->workers == 2);
  CHECK(read->keys == written.keys);
  CHECK_FALSE(cp::ReadResidualFile(dir.path(), 0, most).has_value());  // none for worker 0
  const std::string path = dir.path() + "/" + cp::ResidualFileName(1);
  // Longer than this job's keys can make it: not read whole into memory.
  CHECK_THROWS_WITH(cp::ReadResidualFile(dir.path(), 1, most - 1),
                    Catch::Contains(path + " is larger than this job's residuals can be"));
  // A link to an endless device is not a file.
  std::filesystem::remove(path);
  std::filesystem::create_symlink("/dev/zero", path);
  CHECK_THROWS_WITH(cp::ReadResidualFile(dir.path(), 1, most),
                    "push residual file " + path + " is not a file");
  // Another worker's file under this name, and a flipped byte.
  std::filesystem::remove(path);
  written.rank = 0;
  cp::WriteResidualFile(dir.path(), written);
  std::filesystem::rename(dir.path() + "/" + cp::ResidualFileName(0), path);
  CHECK_THROWS_WITH(cp::ReadResidualFile(dir.path(), 1, most),
                    Catch::Contains(path + " holds worker 0's residuals, not worker 1's"));
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('\x7f');
  }
  CHECK_THROWS_WITH(cp::ReadResidualFile(dir.path(), 1, most),
                    Catch::Contains("is corrupt: its checksum does not match"));
}

TEST_CASE("checkpoint: each save's MANIFEST carries a number of its own", "[checkpoint]") {
  // Two saves of the same files differ, so a residual file names one save only.
  TempDir one, two;
  ps::checkpoint::Manifest manifest;
  manifest.servers = 1;
  manifest.files.push_back({"server-0-of-1.psckpt", 10, 0xabc});
  ps::checkpoint::WriteManifest(one.path(), manifest);
  ps::checkpoint::WriteManifest(two.path(), manifest);
  const std::string first = ps::checkpoint::ReadManifestText(one.path());
  const std::string second = ps::checkpoint::ReadManifestText(two.path());
  CHECK(first != second);
  const auto parsed = ps::checkpoint::Manifest::Parse(first, "MANIFEST");
  CHECK(parsed.save != 0);
  CHECK(parsed.files.size() == 1);
  CHECK(parsed.Encode() == first);
  CHECK(ps::checkpoint::ManifestId(first) != ps::checkpoint::ManifestId(second));
}

TEST_CASE("checkpoint: a malformed MANIFEST names what is wrong with it", "[checkpoint][errors]") {
  const auto error_of = [](const std::string& text) -> std::string {
    try {
      ps::checkpoint::Manifest::Parse(text, "/ckpt/MANIFEST");
    } catch (const ps::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string prefix = "checkpoint manifest /ckpt/MANIFEST is not valid: ";
  CHECK(error_of("ps-checkpoint 1\nservers 2\n") == prefix + "0 files listed for 2 servers");
  // A checksum that is not hexadecimal: the line, not a bare "stoull" from the library.
  CHECK(error_of("ps-checkpoint 1\nservers 1\nfile server-0-of-1.psckpt 10 zzzzzzzzzzzzzzzz\n") ==
        prefix + "malformed line 'file server-0-of-1.psckpt 10 zzzzzzzzzzzzzzzz'");
  CHECK(error_of("ps-checkpoint 1\nsurvers 2\n") == prefix + "no 'servers N' line");
  CHECK(error_of("ps-checkpoint 1\nservers 1\nsave 12\n") == prefix + "malformed line 'save 12'");
  CHECK(error_of("ps-checkpoint 1\nservers 100000000\n") ==
        prefix + "'servers 100000000' names no server count in 1..65536");
  CHECK(error_of("ps-checkpoint 1\nservers 0\x1b[2J\n") ==
        prefix + "'servers 0\\x1b[2J' names no server count in 1..65536");
}

TEST_CASE("checkpoint: another model's checkpoint is a CheckpointMismatchError on every worker",
          "[dist][checkpoint][errors]") {
  // The server that finds a key missing answers so; worker 0's outcome vote carries the kind
  // through the scheduler to the other worker, so both can tell it from other failures.
  TempDir dir;
  const auto load_error = [&](ps::KVStore& kv) {
    try {
      kv.LoadCheckpoint(dir.path());
      return std::string("no error");
    } catch (const ps::CheckpointMismatchError& e) {
      return std::string(e.what());
    } catch (const ps::Error& e) {
      return std::string("another kind: ") + e.what();
    }
  };
  KVCluster cluster(2, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kSmall, 3.0f);
    kv.Init({1, 2}, {ps::Tensor(value.data(), kSmall), ps::Tensor(value.data(), kSmall)});
    kv.SetOptimizer(Adam());  // the checkpoint holds optimizer state
    kv.Push({1, 2}, {ps::Tensor(value.data(), kSmall), ps::Tensor(value.data(), kSmall)});
    kv.WaitAll();
    kv.SaveCheckpoint(dir.path());
    kv.Init(3, ps::Tensor(value.data(), kSmall));
    const std::string what = load_error(kv);
    Expect(what.find("LoadCheckpoint failed on every worker") != std::string::npos &&
               what.find("key 3: not in the checkpoint") != std::string::npos,
           "a CheckpointMismatchError naming key 3: " + what);
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
  // Another model's job that set no optimizer yet: the model is named first, not the
  // optimizer.
  KVCluster other(2, 2);
  const auto other_outcomes = other.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> longer(kSmall + 1, 3.0f);
    kv.Init({1, 2}, {ps::Tensor(longer.data(), kSmall + 1), ps::Tensor(longer.data(), kSmall + 1)});
    const std::string what = load_error(kv);
    Expect(what.find("the checkpoint holds 6 x float32, this job 7 x float32") != std::string::npos,
           "a CheckpointMismatchError naming the size: " + what);
  });
  CHECK(AllOk(other_outcomes) == "");
  CHECK(other.EndedCleanly());
}

TEST_CASE("checkpoint: a load that one server cannot make changes no server's keys",
          "[dist][checkpoint][errors]") {
  // 16 keys spread over 3 servers; a key Init'd after the save is missing from the checkpoint
  // on one server only. The others must not load theirs: the model stays as it was, whole.
  const std::string replication = GENERATE("0", "1");
  INFO("PS_REPLICATION=" << replication);
  TempDir dir;
  KVCluster cluster(3, 2, {{"PS_REPLICATION", replication}});
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    constexpr ps::Key kFirst = 100;
    constexpr int kKeys = 16;
    std::vector<std::vector<float>> values(kKeys, std::vector<float>(kSmall, 0.0f));
    std::vector<ps::Key> keys;
    std::vector<ps::Tensor> tensors;
    for (int k = 0; k < kKeys; ++k) {
      keys.push_back(kFirst + static_cast<ps::Key>(k));
      tensors.emplace_back(values[static_cast<std::size_t>(k)].data(), kSmall);
    }
    kv.Init(keys, tensors);
    kv.SaveCheckpoint(dir.path());  // every key 0
    std::vector<float> one(kSmall, 1.0f);
    for (const ps::Key key : keys) kv.Push(key, ps::Tensor(one.data(), kSmall));
    kv.WaitAll();  // every key 2 (the sum of both workers' pushes)
    kv.Init(3, ps::Tensor(one.data(), kSmall));
    std::string what = "no error";
    try {
      kv.LoadCheckpoint(dir.path());
    } catch (const ps::Error& e) {
      what = e.what();
    }
    Expect(what.find("key 3: not in the checkpoint") != std::string::npos,
           "the load fails naming key 3: " + what);
    kv.Pull(keys, tensors);
    kv.WaitAll();
    std::string loaded;
    for (int k = 0; k < kKeys; ++k) {
      if (values[static_cast<std::size_t>(k)] != std::vector<float>(kSmall, 2.0f)) {
        loaded += " " + std::to_string(kFirst + static_cast<ps::Key>(k));
      }
    }
    Expect(loaded.empty(), "keys changed by the failed load:" + loaded);
    // The servers dropped what they read: the next load (of a checkpoint with key 3) is made.
    kv.SaveCheckpoint(dir.path());  // every key 2
    for (const ps::Key key : keys) kv.Push(key, ps::Tensor(one.data(), kSmall));
    kv.WaitAll();  // every key 4
    kv.LoadCheckpoint(dir.path());
    kv.Pull(keys, tensors);
    kv.WaitAll();
    for (const auto& value : values) Expect(value == std::vector<float>(kSmall, 2.0f), "reload");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("checkpoint: after a load a compressed pull brings the loaded values exactly",
          "[dist][checkpoint][compression]") {
  // A 2bit pull sends the change since the worker's copy, coarsely: after a load that change
  // is the whole checkpoint, so the next pull must go in full, or the worker starts from an
  // approximation of what it loaded (a resumed ps-train lost 7 points of accuracy).
  TempDir dir;
  KVCluster cluster(2, 2);
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    std::vector<float> value(kBig), out(kBig);
    for (std::size_t i = 0; i < kBig; ++i) value[i] = 0.001f * static_cast<float>(i % 997);
    kv.Init(1, ps::Tensor(value.data(), kBig));
    kv.SetGradientCompression({.type = "none", .threshold = 0.5f, .pull_type = "2bit"});
    kv.Pull(1, ps::Tensor(out.data(), kBig));  // the worker's copy, and the server's mirror
    kv.WaitAll();
    kv.SaveCheckpoint(dir.path());
    std::vector<float> grad(kBig, 3.0f);
    kv.Push(1, ps::Tensor(grad.data(), kBig));
    kv.Pull(1, ps::Tensor(out.data(), kBig));
    kv.WaitAll();
    kv.LoadCheckpoint(dir.path());
    kv.Pull(1, ps::Tensor(out.data(), kBig));
    kv.WaitAll();
    Expect(out == value, "the pull after the load brings the checkpoint's values exactly");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("checkpoint: a save that cannot hold every slice fails and keeps the last checkpoint",
          "[dist][checkpoint][failover]") {
  // Servers 0 and 1 die together: the slices whose home is server 0 had their copy on server
  // 1, so both copies are gone. The survivor holds the others; a checkpoint of it alone would
  // silently lack keys, so the save must fail and leave the previous checkpoint as it was.
  TempDir dir;
  auto env = SlicedEnv();
  env["PS_REPLICATION"] = "1";
  KVCluster cluster(3, 1, env);
  std::string manifest_before;
  const auto read_manifest = [&] {
    std::ifstream in(dir.path() + "/MANIFEST");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    Run(kv, 0, 2);
    kv.SaveCheckpoint(dir.path());
    manifest_before = read_manifest();
    cluster.servers()[0]->Kill(SIGKILL);
    cluster.servers()[1]->Kill(SIGKILL);
    kv.SaveCheckpoint(dir.path());  // throws
  });
  REQUIRE(outcomes.size() == 1);
  CHECK_THAT(outcomes[0], Catch::Contains("SaveCheckpoint failed on every worker") &&
                              Catch::Contains("key slices (the others died with the servers "
                                              "that held them)"));
  CHECK_FALSE(manifest_before.empty());
  CHECK(read_manifest() == manifest_before);
}

TEST_CASE("checkpoint: a load whose file never answers ends the job naming it, bounded",
          "[dist][checkpoint][errors]") {
  // A file system that stops answering, played by a FIFO that nobody writes: opening server
  // 0's file blocks for ever. Its receive thread, held there, reads nothing, the scheduler's
  // heartbeat answers included: before, the server failed with "lost contact with the
  // scheduler ... the network failed" and its process never exited. Now the server names the
  // file once the read made no progress for the heartbeat timeout (3 s here), the job ends
  // with that, and the server exits.
  TempDir dir;
  KVCluster cluster(1, 1);
  const std::string file = dir.path() + "/server-0-of-1.psckpt";
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    kv.SaveCheckpoint(dir.path());
    ReplaceWithFifo(file);
    kv.LoadCheckpoint(dir.path());
  });
  CHECK_THAT(outcomes[0],
             Catch::Contains("reading checkpoint file " + file + " has made no progress for") &&
                 Catch::Contains("the file system does not answer"));
  CHECK(cluster.scheduler().Wait(std::chrono::seconds(20)) == 1);
  CHECK(cluster.servers()[0]->Wait(std::chrono::seconds(20)) == 1);
}

TEST_CASE("checkpoint: a save whose file never answers ends the job, the next save tidies up",
          "[dist][checkpoint][errors]") {
  // The same for a save: a FIFO where server 0 opens its temporary file. The job ends naming
  // the file; a later save into the directory (the local store's, as server 0 of 1) removes
  // the temporary a server left behind.
  TempDir dir;
  KVCluster cluster(1, 1);
  const std::string temporary =
      dir.path() + "/.server-0-of-1.psckpt.tmp." + std::to_string(cluster.servers()[0]->pid());
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    Expect(mkfifo(temporary.c_str(), 0600) == 0, "mkfifo " + temporary);
    kv.SaveCheckpoint(dir.path());
  });
  CHECK_THAT(outcomes[0], Catch::Contains("writing checkpoint file " + dir.path() +
                                          "/server-0-of-1.psckpt has made no progress for"));
  CHECK(cluster.scheduler().Wait(std::chrono::seconds(20)) == 1);
  CHECK(cluster.servers()[0]->Wait(std::chrono::seconds(20)) == 1);
  REQUIRE(std::filesystem::exists(temporary));
  ps::LocalKVStore local;
  std::vector<float> value(kSmall, 1.0f);
  local.Init(7, ps::Tensor(value.data(), kSmall));
  local.SaveCheckpoint(dir.path());
  CHECK_FALSE(std::filesystem::exists(temporary));
  CHECK(std::filesystem::exists(dir.path() + "/server-0-of-1.psckpt"));
}

TEST_CASE("checkpoint: worker 0's manifest that never answers ends the job naming it, bounded",
          "[dist][checkpoint][errors]") {
  // Worker 0 writes (SaveCheckpoint) or reads (LoadCheckpoint) a checkpoint's MANIFEST itself,
  // in its call, while the other workers wait in theirs. A FIFO that nobody opens at the other
  // end plays a file system that stops answering: before, every worker waited for ever
  // (worker 0 still sent its heartbeats). Now worker 0 gives up once the I/O made no progress
  // for the heartbeat timeout (3 s here), and the job ends naming the file on every worker.
  const bool save = GENERATE(false, true);
  INFO((save ? "SaveCheckpoint" : "LoadCheckpoint"));
  TempDir dir;
  KVCluster cluster(1, 2);
  const std::string manifest = dir.path() + "/MANIFEST";
  // The save writes a temporary file first (the workers are threads of this process).
  const std::string fifo =
      save ? dir.path() + "/.MANIFEST.tmp." + std::to_string(::getpid()) : manifest;
  const std::string stuck =
      (save ? "saving the checkpoint manifest " + manifest + " (and removing the files it replaces)"
            : "reading the checkpoint manifest " + manifest) +
      " has made no progress for";
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    kv.SaveCheckpoint(dir.path());
    const auto call = [&] {
      if (save) {
        kv.SaveCheckpoint(dir.path());
      } else {
        kv.LoadCheckpoint(dir.path());
      }
    };
    if (kv.Rank() != 0) {
      call();
      return;
    }
    if (save) {
      Expect(mkfifo(fifo.c_str(), 0600) == 0, "mkfifo " + fifo);
    } else {
      ReplaceWithFifo(manifest);
    }
    // Lets worker 0's blocked open go once the job has ended (or after 30 s if it did not:
    // the test fails then, but ends): the other end opens; a reader stays open until the call
    // returned (a write into a FIFO with no reader would raise SIGPIPE), a writer closes at
    // once (the read sees the end).
    std::atomic<bool> returned{false};
    std::thread opener([&] {
      cluster.scheduler().WaitForOutput(stuck, std::chrono::seconds(30));
      const int fd = ::open(fifo.c_str(), (save ? O_RDONLY : O_WRONLY) | O_NONBLOCK | O_CLOEXEC);
      for (int waits = 0; save && fd >= 0 && !returned.load() && waits < 3000; ++waits) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // bounded: 30 s
      }
      if (fd >= 0) ::close(fd);
    });
    try {
      call();
    } catch (...) {
      returned.store(true);
      opener.join();
      throw;
    }
    returned.store(true);
    opener.join();
  });
  CHECK_THAT(cluster.scheduler().Output(), Catch::Contains("worker 0 (") &&
                                               Catch::Contains(stuck) &&
                                               Catch::Contains("the job waits for that call"));
  CHECK_THAT(outcomes[1], Catch::Contains(stuck));
  CHECK_FALSE(outcomes[0].empty());
  CHECK(cluster.scheduler().Wait(std::chrono::seconds(20)) == 1);
}

TEST_CASE("checkpoint: a load slower than the heartbeat timeout succeeds while it progresses",
          "[dist][checkpoint]") {
  // The same server file, served through a FIFO by a writer that takes about twice the
  // heartbeat timeout (3 s) over it, in pieces. The receive thread reads nothing else
  // meanwhile; before, the server took that for lost contact with the scheduler and failed.
  // Now every piece read counts as progress: the load succeeds, and the values are the saved.
  TempDir dir;
  KVCluster cluster(1, 1);
  const std::string file = dir.path() + "/server-0-of-1.psckpt";
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    InitKeys(kv);
    const auto saved = Run(kv, 0, 1);
    kv.SaveCheckpoint(dir.path());
    Run(kv, 1, 1);  // values past the checkpoint
    const std::string bytes = ReplaceWithFifo(file);
    // Writes the file's bytes into the FIFO once the server opens it to read, in pieces; gives
    // up after 30 s without a reader (the load failed before it read), so it never hangs.
    std::thread writer([&] {
      int fd = -1;
      for (int tries = 0; fd < 0 && tries < 3000; ++tries) {
        fd = ::open(file.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // ENXIO: no reader yet
        if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (fd < 0) return;
      ::fcntl(fd, F_SETFL, 0);  // blocking from here: the server reads at its pace
      constexpr int kPieces = 30;
      const std::size_t piece = bytes.size() / kPieces + 1;
      for (std::size_t at = 0; at < bytes.size(); at += piece) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the slow disk's pace
        const std::size_t size = std::min(piece, bytes.size() - at);
        if (::write(fd, bytes.data() + at, size) != static_cast<ssize_t>(size)) break;
      }
      ::close(fd);
    });
    const auto started = std::chrono::steady_clock::now();
    try {
      kv.LoadCheckpoint(dir.path());
    } catch (...) {
      writer.join();
      throw;
    }
    writer.join();
    Expect(std::chrono::steady_clock::now() - started > std::chrono::seconds(4),
           "the load took longer than the heartbeat timeout");
    std::vector<float> small(kSmall), big(kBig);
    kv.Pull({1, 2}, {ps::Tensor(small.data(), kSmall), ps::Tensor(big.data(), kBig)});
    kv.WaitAll();
    Expect(small == saved[0] && big == saved[1], "the loaded values are the saved ones");
  });
  CHECK(AllOk(outcomes) == "");
  CHECK(cluster.EndedCleanly());
}
