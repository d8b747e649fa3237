// The KVStore trainer against a fake single-worker store: the protocol (Init, SetOptimizer,
// pushes in reverse layer order with priorities, pulls, per-layer waits in the next forward pass
// or one WaitAll per step), agreement with local SGD in both update modes, and the ps-train log
// format.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "tests/worker/fake_kvstore.h"
#include "tests/worker/forwarding_backend.h"
#include "tests/worker/test_util.h"
#include "worker/cpu_backend.h"
#include "worker/errors.h"
#include "worker/run_training.h"
#include "worker/sgd_trainer.h"
#include "worker/trainer.h"

namespace ps::worker {
namespace {

using testing::FakeKVStore;

TrainConfig SmallConfig(bool update_on_kvstore) {
  TrainConfig c;
  c.kvstore = "local";
  c.update_on_kvstore = update_on_kvstore;
  c.batch_size = 50;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.weight_decay = 1e-4f;
  c.log_interval = 10;
  return c;
}

// The CPU backend dressed as a GPU: it reports DeviceKind::kCUDA, so the trainer takes its
// device path (gradients staged through pinned host buffers, pulled values copied back), and
// it fills every fresh allocation with NaN bytes, so that a value the staging forgets to copy
// shows. With `deferred`, it also behaves like a stream: the asynchronous copies are queued and
// run only when a later call, a Synchronize or a mark's Wait needs them (a mark's Reached runs
// one and says no while any before it is queued), so a push of gradients not yet copied gives
// wrong weights.
// Lets machines without a GPU test that path.
class DeviceLikeCpuBackend final : public testing::ForwardingBackend {
 public:
  explicit DeviceLikeCpuBackend(bool deferred = false) : deferred_(deferred) {}

  DeviceKind kind() const override { return DeviceKind::kCUDA; }
  std::string Name() const override { return "cpu dressed as cuda"; }
  void* Allocate(std::size_t bytes) override { return Poisoned(inner().Allocate(bytes), bytes); }
  void* AllocateHost(std::size_t bytes) override {
    ++host_allocations;
    return Poisoned(inner().AllocateHost(bytes), bytes);
  }
  void CopyToHostAsync(void* d, const void* s, std::size_t b) override { Queue(d, s, b); }
  void CopyToDeviceAsync(void* d, const void* s, std::size_t b) override { Queue(d, s, b); }
  std::unique_ptr<StreamMark> NewMark() override { return std::make_unique<Mark>(*this); }

  int host_allocations = 0;  // the trainer's pinned staging buffers
  int deferred_copies = 0;   // copies that were still queued when the next call came

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  // Marks the queue's position; reached once every copy queued before it has run.
  class Mark final : public StreamMark {
   public:
    explicit Mark(DeviceLikeCpuBackend& backend) : backend_(backend) {}
    void Record() override { position_ = backend_.queued_; }
    bool Reached() override {
      if (backend_.done_ >= position_) return true;
      backend_.RunOne();
      return false;
    }
    void Wait() override {
      while (backend_.done_ < position_) backend_.RunOne();
    }

   private:
    DeviceLikeCpuBackend& backend_;
    std::size_t position_ = 0;
  };

  static void* Poisoned(void* p, std::size_t bytes) {
    if (p != nullptr) std::memset(p, 0xFF, bytes);  // every float a NaN
    return p;
  }
  void Queue(void* dst, const void* src, std::size_t bytes) {
    if (!deferred_) {
      std::memcpy(dst, src, bytes);
      return;
    }
    queue_.push_back({dst, src, bytes});
    ++queued_;
  }
  void RunOne() {
    const Copy c = queue_.front();
    queue_.pop_front();
    std::memcpy(c.dst, c.src, c.bytes);
    ++done_;
  }
  void BeforeCall() override {
    if (!queue_.empty()) ++deferred_copies;
    while (!queue_.empty()) RunOne();
  }

  bool deferred_;
  std::deque<Copy> queue_;
  std::size_t queued_ = 0;  // copies ever queued
  std::size_t done_ = 0;    // copies ever run (in queue order)
};

// Trains `steps` batches through the fake store and, from the same seed, locally with
// SgdOptimizer on the CPU; every weight must agree. `device_path`: the trainer's model lives
// on a DeviceLikeCpuBackend, so its GPU staging code runs.
void CheckAgainstLocalSgd(bool update_on_kvstore, bool device_path = false, bool deferred = false) {
  const Dataset data = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 1000);
  const TrainConfig config = SmallConfig(update_on_kvstore);
  const ShardSampler sampler(data.count, 0, 1, config.batch_size, 3);
  std::ostringstream log;
  MetricsLog metrics(log, "", 0);

  auto backend = MakeCpuBackend();
  DeviceLikeCpuBackend device(deferred);
  auto via_kv = BuildModel("mlp", device_path ? device : *backend, config.batch_size);
  via_kv->InitParams(11);
  FakeKVStore kv;
  KVTrainer trainer(config, kv, *via_kv);
  trainer.Start();
  const EpochResult r = trainer.TrainEpoch(data, sampler, 0, metrics);

  auto local = BuildModel("mlp", *backend, config.batch_size);
  local->InitParams(11);
  SgdOptimizer sgd(*local, SgdOptions{config.lr, config.momentum, config.weight_decay});
  const EpochResult expected = TrainEpoch(*local, sgd, data, sampler, 0);

  CHECK(r.train.samples == expected.train.samples);
  CHECK(r.train.loss_sum == Approx(expected.train.loss_sum).epsilon(1e-5));
  for (std::size_t i = 0; i < local->params().size(); ++i) {
    INFO(local->params()[i]->name);
    CHECK(testing::MaxScaledDiff(via_kv->params()[i]->value.ToHost(),
                                 local->params()[i]->value.ToHost()) < 1e-5);
  }
  CHECK(kv.has_optimizer == update_on_kvstore);
  const int layers = via_kv->num_param_layers();
  if (update_on_kvstore) {
    // Start; then one wait per layer and step: in the next forward pass, or at the epoch's end.
    CHECK(kv.wait_alls == 1);
    CHECK(kv.waits.size() == static_cast<std::size_t>(layers * sampler.batches_per_epoch()));
    // Staged on a GPU, the forward pass waits for the pulls alone; the pushes are waited for
    // before their staging buffer is written again (the fake checks it was not before).
    CHECK(kv.pull_waits.size() == (device_path ? kv.waits.size() : 0));
  } else {
    CHECK(kv.wait_alls == 1 + sampler.batches_per_epoch());  // Start, then one per step
    CHECK(kv.waits.empty());
  }
  if (device_path) CHECK(device.host_allocations == 2);  // one push, one pull staging buffer
  if (deferred) CHECK(device.deferred_copies > 0);       // the queue did defer copies
  // Two Speedometer lines for 20 batches at an interval of 10.
  const std::string text = log.str();
  CHECK(text.find("Epoch[0] Batch[10] Speed: ") != std::string::npos);
  CHECK(text.find("Epoch[0] Batch[20] Speed: ") != std::string::npos);
}

TEST_CASE("trainer with update on kvstore matches local SGD", "[trainer]") {
  CheckAgainstLocalSgd(true);
}

TEST_CASE("trainer with update on the worker matches local SGD", "[trainer]") {
  CheckAgainstLocalSgd(false);
}

TEST_CASE("trainer's GPU staging path matches local SGD (update on kvstore)", "[trainer]") {
  CheckAgainstLocalSgd(true, true);
}

TEST_CASE("trainer's GPU staging path matches local SGD (update on the worker)", "[trainer]") {
  CheckAgainstLocalSgd(false, true);
}

TEST_CASE("trainer's GPU path waits for queued copies before it pushes or reuses a buffer",
          "[trainer]") {
  CheckAgainstLocalSgd(true, true, true);
  CheckAgainstLocalSgd(false, true, true);
}

TEST_CASE(
    "trainer pushes each layer as its backward finishes, first layer first priority, "
    "and waits for each layer's weights just before its forward pass",
    "[trainer]") {
  const Dataset data = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 100);
  TrainConfig config = SmallConfig(true);
  const ShardSampler sampler(data.count, 0, 1, config.batch_size, 3);
  auto backend = MakeCpuBackend();
  auto model = BuildModel("mlp", *backend, config.batch_size);
  model->InitParams(1);
  FakeKVStore kv;
  KVTrainer trainer(config, kv, *model);
  trainer.Start();
  CHECK(kv.init_keys == std::vector<Key>{0, 1, 2, 3, 4, 5});
  CHECK(kv.optimizer.name == "sgd");
  CHECK(kv.optimizer.learning_rate == config.lr);
  CHECK(kv.optimizer.rescale_grad == 1.0f);  // one worker
  kv.ops.clear();
  std::ostringstream log;
  MetricsLog metrics(log, "", 0);
  trainer.TrainEpoch(data, sampler, 0, metrics);  // 2 steps
  using Op = FakeKVStore::Op;
  const std::vector<std::tuple<Op::Kind, Key, int>> one_step = {
      {Op::kPush, 4, -2}, {Op::kPush, 5, -2}, {Op::kPull, 4, -2}, {Op::kPull, 5, -2},
      {Op::kPush, 2, -1}, {Op::kPush, 3, -1}, {Op::kPull, 2, -1}, {Op::kPull, 3, -1},
      {Op::kPush, 0, 0},  {Op::kPush, 1, 0},  {Op::kPull, 0, 0},  {Op::kPull, 1, 0}};
  REQUIRE(kv.ops.size() == 2 * one_step.size());
  for (std::size_t i = 0; i < kv.ops.size(); ++i) {
    const auto& [kind, key, priority] = one_step[i % one_step.size()];
    INFO("op " << i);
    CHECK(kv.ops[i].kind == kind);
    CHECK(kv.ops[i].key == key);
    CHECK(kv.ops[i].priority == priority);
  }
  CHECK(kv.wait_alls == 1);  // Start's only
  // Step 2 waits layer by layer, from the input; the epoch's end waits for step 2's pulls.
  const std::vector<std::vector<Key>> one_pass = {{0, 1}, {2, 3}, {4, 5}};
  REQUIRE(kv.waits.size() == 2 * one_pass.size());
  for (std::size_t i = 0; i < kv.waits.size(); ++i) {
    INFO("wait " << i);
    CHECK(kv.waits[i] == one_pass[i % one_pass.size()]);
  }
}

TEST_CASE("RunTraining logs Speedometer lines, test accuracy and the final line", "[trainer]") {
  testing::TempDir dir;
  TrainConfig config;
  config.kvstore = "local";
  config.device = "cpu";
  config.epochs = 1;
  config.batch_size = 100;
  config.lr = 0.05f;
  config.log_interval = 200;
  config.metrics_out = dir.file("metrics.jsonl");
  FakeKVStore kv;
  std::ostringstream log;
  const TrainSummary s = RunTraining(config, kv, log);
  const std::string text = log.str();
  INFO(text);
  CHECK(s.test_accuracy > 0.8);
  CHECK(std::regex_search(text, std::regex(R"(Epoch\[0\] Batch\[200\] Speed: [0-9.]+ samples/sec )"
                                           R"(loss=[0-9.]+ accuracy=[0-9.]+\n)")));
  CHECK(std::regex_search(text, std::regex(R"(Epoch\[0\] test_accuracy=0\.[0-9]{4}\n)")));
  std::smatch times;
  REQUIRE(std::regex_search(
      text, times,
      std::regex(R"(Epoch\[0\] Batch-time compute_ms=([0-9.]+) wait_ms=([0-9.]+)\n)")));
  CHECK(std::stod(times[1]) > 0.0);  // a CPU step of a 100-sample batch takes real time
  CHECK(std::regex_search(
      text, std::regex(R"(\nfinal test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+\n$)")));
  CHECK(kv.barriers == 1);
  std::ifstream json(config.metrics_out);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(json, line)) lines.push_back(line);
  REQUIRE(lines.size() == 3 + 1 + 1 + 1);  // batches 200, 400, 600; epoch; test; final
  CHECK(lines.front().starts_with("{\"event\":\"batch\",\"rank\":0,\"epoch\":0,\"batch\":200,"));
  CHECK(lines.back().starts_with("{\"event\":\"final\",\"rank\":0,\"test_accuracy\":0."));
  CHECK_THAT(lines[3], Catch::StartsWith("{\"event\":\"epoch\"") &&
                           Catch::Contains("\"compute_ms_per_batch\":") &&
                           Catch::Contains("\"wait_ms_per_batch\":"));
}

TEST_CASE("a diverging run stops naming the step and suggesting a lower rate", "[trainer]") {
  const Dataset data = Subset(LoadFashionMnist(kDefaultDataDir, Split::kTrain), 500);
  TrainConfig config = SmallConfig(false);
  config.lr = 1e8f;
  const ShardSampler sampler(data.count, 0, 1, config.batch_size, 3);
  std::ostringstream log;
  MetricsLog metrics(log, "", 0);
  auto backend = MakeCpuBackend();
  auto model = BuildModel("mlp", *backend, config.batch_size);
  model->InitParams(11);
  FakeKVStore kv;
  KVTrainer trainer(config, kv, *model);
  trainer.Start(static_cast<std::uint64_t>(sampler.batches_per_epoch()));
  std::string error = "no error";
  try {
    trainer.TrainEpoch(data, sampler, 0, metrics);
  } catch (const DivergenceError& e) {
    error = e.what();
  }
  CHECK_THAT(error,
             (Catch::Contains("training diverged: the loss is nan at epoch 0, batch ") ||
              Catch::Contains("training diverged: the loss is infinite at epoch 0, batch ")) &&
                 Catch::Contains("lower the learning rate (--lr 1e+08 now; try 5e+07)"));
}

TEST_CASE("the schedule's epochs become updates where the optimizer runs", "[trainer]") {
  TrainConfig c;
  c.epochs = 10;
  c.lr = 0.5f;
  c.lr_scheduler = "multifactor";
  c.lr_step_epochs = "4,7";
  c.lr_factor = 0.1f;
  c.warmup_epochs = 1;
  OptimizerConfig opt = MakeOptimizerConfig(c, 100, 0.5f);
  CHECK(opt.rescale_grad == 0.5f);
  CHECK(opt.schedule.type == "multifactor");
  CHECK(opt.schedule.steps == std::vector<std::uint64_t>{400, 700});
  CHECK(opt.schedule.warmup_steps == 100);
  CHECK(LearningRateAt(opt, 50) == Approx(0.25f));
  CHECK(LearningRateAt(opt, 400) == Approx(0.5f));
  CHECK(LearningRateAt(opt, 401) == Approx(0.05f));
  c.lr_scheduler = "factor";
  c.lr_step_epochs = "3";
  CHECK(MakeOptimizerConfig(c, 100, 1.0f).schedule.step == 300);
  c.lr_scheduler = "cosine";
  opt = MakeOptimizerConfig(c, 100, 1.0f);
  CHECK(opt.schedule.max_update == 1000);  // the rate reaches --final-lr after the last epoch
  CHECK(LearningRateAt(opt, 1000) == 0.0f);
  c.lr_step_epochs = "4,x";
  c.lr_scheduler = "multifactor";
  CHECK_THROWS_WITH(ValidateConfig(c), Catch::Contains("--lr-step-epochs '4,x' is invalid"));
  c.lr_step_epochs = "7,4";  // said in the flag's terms, not the optimizer's schedule.steps
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--lr-step-epochs '7,4' is invalid: the epochs must increase, e.g. 4,7");
  // Mistakes said in the flags given, not in the updates the optimizer counts.
  for (const std::string scheduler : {"factor", "multifactor"}) {
    c.lr_scheduler = scheduler;
    c.lr_step_epochs = "";
    CHECK_THROWS_WITH(ValidateConfig(c), Catch::StartsWith("--lr-scheduler " + scheduler +
                                                           " needs --lr-step-epochs (E"));
  }
  c.lr_scheduler = "cosine";
  c.epochs = 1;
  c.warmup_epochs = 5;
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--warmup-epochs 5 must be below --epochs 1 with "
                    "--lr-scheduler cosine (it decays over the epochs after "
                    "the warm-up)");
  c.warmup_epochs = 0;
  CHECK_NOTHROW(ValidateConfig(c));
  // Step epochs a schedule without steps would ignore: refused, not dropped.
  c.lr_step_epochs = "4";
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--lr-step-epochs 4 needs --lr-scheduler factor or multifactor (it is "
                    "cosine, which has no steps): drop one of them");
  // Given alone, they mean MXNet's multifactor schedule.
  TrainConfig steps;
  steps.lr_step_epochs = "4,7";
  ApplyModelDefaults(steps, [](std::string_view flag) { return flag == "lr_step_epochs"; });
  CHECK(steps.lr_scheduler == "multifactor");
  CHECK_NOTHROW(ValidateConfig(steps));
}

TEST_CASE("settings not given take the model's defaults, given ones stay", "[trainer]") {
  const auto nothing_given = [](std::string_view) { return false; };
  TrainConfig mlp;
  ApplyModelDefaults(mlp, nothing_given);
  CHECK(mlp.lr == 0.1f);
  CHECK(mlp.lr_scheduler == "cosine");
  CHECK(mlp.weight_decay == 1e-4f);
  CHECK(mlp.batch_size == 64);
  TrainConfig cnn;
  cnn.model = "cnn";
  ApplyModelDefaults(cnn, nothing_given);
  CHECK(cnn.lr == 0.05f);
  CHECK(cnn.batch_size == 32);
  TrainConfig cnn_batch;
  cnn_batch.model = "cnn";
  cnn_batch.batch_size = 128;
  ApplyModelDefaults(cnn_batch, [](std::string_view flag) { return flag == "batch_size"; });
  CHECK(cnn_batch.batch_size == 128);
  TrainConfig async;
  async.kvstore = "dist_async";
  ApplyModelDefaults(async, nothing_given);
  CHECK(async.lr == Approx(0.025f));
  TrainConfig two_bit;
  two_bit.gradient_compression = "2bit";
  ApplyModelDefaults(two_bit, nothing_given);
  CHECK(two_bit.momentum == 0.0f);
  CHECK(two_bit.lr == Approx(0.5f));
  CHECK(two_bit.compression_threshold == Approx(0.02f));
  TrainConfig two_bit_mine;
  two_bit_mine.gradient_compression = "2bit";
  two_bit_mine.momentum = 0.5f;
  two_bit_mine.compression_threshold = 0.1f;
  ApplyModelDefaults(two_bit_mine, [](std::string_view flag) {
    return flag == "momentum" || flag == "compression_threshold";
  });
  CHECK(two_bit_mine.momentum == 0.5f);
  CHECK(two_bit_mine.compression_threshold == 0.1f);
  // 2bit pulls alone: the threshold is their step (0.5 would move every weight by 0.5 per
  // pull), but the pushes are plain: the rate and momentum stay.
  TrainConfig pull_two_bit;
  pull_two_bit.pull_compression = "2bit";
  ApplyModelDefaults(pull_two_bit, nothing_given);
  CHECK(pull_two_bit.compression_threshold == Approx(0.02f));
  CHECK(pull_two_bit.momentum == 0.9f);
  CHECK(pull_two_bit.lr == 0.1f);
  TrainConfig fp16;
  fp16.gradient_compression = "fp16";
  ApplyModelDefaults(fp16, nothing_given);
  CHECK(fp16.momentum == 0.9f);
  CHECK(fp16.lr == 0.1f);
  TrainConfig mine;
  mine.lr = 0.3f;
  mine.lr_scheduler = "none";
  ApplyModelDefaults(mine,
                     [](std::string_view flag) { return flag == "lr" || flag == "lr_scheduler"; });
  CHECK(mine.lr == 0.3f);
  CHECK(mine.lr_scheduler == "none");
  CHECK(mine.momentum == 0.9f);
}

TEST_CASE("workers whose optimizer settings differ are told which ps-train flags set them",
          "[trainer]") {
  TrainConfig config = SmallConfig(true);
  auto backend = MakeCpuBackend();
  auto model = BuildModel("mlp", *backend, config.batch_size);
  FakeKVStore kv;
  kv.set_optimizer_error =
      "dist kvstore: SetOptimizer failed on every worker: the members disagree (...)";
  kv.set_optimizer_error_kind = ErrorKind::kDisagreement;
  {
    KVTrainer trainer(config, kv, *model);
    CHECK_THROWS_WITH(trainer.Start(),
                      Catch::StartsWith("the workers' optimizer settings differ: start every "
                                        "worker with the same --lr,") &&
                          Catch::EndsWith("; " + kv.set_optimizer_error));
  }
  {
    KVTrainer trainer(config, kv, *model);
    CHECK_THROWS_AS(trainer.Start(), DisagreementError);  // and stays one
  }
  // Another failure (a server lost, say) is passed on as it is, whatever its words.
  kv.set_optimizer_error = "dist kvstore: SetOptimizer failed: the members disagree, server 1 died";
  kv.set_optimizer_error_kind = ErrorKind::kOther;
  KVTrainer trainer(config, kv, *model);
  CHECK_THROWS_WITH(trainer.Start(), kv.set_optimizer_error);
}

TEST_CASE("bad ps-train configurations are one-line errors naming the flag", "[trainer]") {
  TrainConfig c;
  c.model = "resnet";
  CHECK_THROWS_WITH(ValidateConfig(c), "unknown --model 'resnet': use mlp or cnn");
  c = TrainConfig{};
  c.device = "gpu";
  CHECK_THROWS_WITH(ValidateConfig(c), Catch::StartsWith("unknown --device 'gpu'"));
  c = TrainConfig{};
  c.kvstore = "dist";
  CHECK_THROWS_WITH(ValidateConfig(c), Catch::StartsWith("unknown --kvstore 'dist'"));
  c = TrainConfig{};
  c.batch_size = 0;
  CHECK_THROWS_AS(ValidateConfig(c), ConfigError);
  // Where the optimizer runs: the worker runs only SGD, and only over synchronous sums.
  c = TrainConfig{};
  c.update_on_kvstore = false;
  c.kvstore = "dist_async";
  CHECK_THROWS_WITH(ValidateConfig(c),
                    Catch::StartsWith("--no-update-on-kvstore needs --kvstore dist_sync or local"));
  c.kvstore = "dist_sync";
  CHECK_NOTHROW(ValidateConfig(c));
  c.optimizer = "adam";
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--no-update-on-kvstore runs SGD on the worker: use "
                    "--update-on-kvstore for --optimizer adam");
  // Flags that break the optimizer's rules alone are named as flags.
  c = TrainConfig{};
  c.data_dir = "";
  CHECK_THROWS_WITH(ValidateConfig(c), Catch::StartsWith("--data-dir is empty: name the "
                                                         "directory of the Fashion-MNIST files"));
  c = TrainConfig{};
  c.lr = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(ValidateConfig(c), "--lr must be a finite number > 0");
  c = TrainConfig{};
  c.lr_scheduler = "factor";
  c.lr_step_epochs = "1";
  c.lr_factor = 2.0f;
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--lr-factor 2 must be in (0, 1]: the rate is multiplied by it at each step");
  c = TrainConfig{};
  c.warmup_epochs = 1;
  c.epochs = 2;
  c.lr = 0.1f;
  c.warmup_begin_lr = 5.0f;
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--warmup-begin-lr 5 is above --lr 0.1: a warm-up rises "
                    "to --lr from a lower rate (MXNet refuses it too)");
  c.warmup_begin_lr = -1.0f;
  CHECK_THROWS_WITH(ValidateConfig(c), "--warmup-begin-lr must be a finite number >= 0");
  c = TrainConfig{};
  c.lr_scheduler = "cosine";
  c.lr = 0.1f;
  c.final_lr = 1.0f;
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--final-lr 1 must be in [0, --lr 0.1]: cosine decays "
                    "from --lr down to it");
  c = TrainConfig{};
  c.checkpoint_dir = "/dev/null";  // there, but a file: found before any training
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--checkpoint-dir /dev/null is not a directory: name a "
                    "directory (made if missing)");
  c = TrainConfig{};
  c.data_dir = "/nonexistent";
  c.device = "cpu";
  FakeKVStore kv;
  std::ostringstream log;
  CHECK_THROWS_AS(RunTraining(c, kv, log), DataError);
  // A checkpoint directory that cannot be made is found before training, not after the first
  // epoch.
  c = TrainConfig{};
  c.device = "cpu";
  c.kvstore = "local";
  testing::TempDir dir;
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  c.checkpoint_dir = file + "/sub";
  CHECK_THROWS_WITH(RunTraining(c, kv, log),
                    Catch::StartsWith("--checkpoint-dir " + file + "/sub: cannot create it: "));
  // More samples than the data set holds: said, not clamped, and before the checkpoint
  // directory is made (a refused run leaves nothing behind).
  c.checkpoint_dir = dir.file("made/here");
  c.num_examples = 70000;
  CHECK_THROWS_WITH(RunTraining(c, kv, log),
                    "--num-examples 70000 is more than the 60000 training samples in " +
                        c.data_dir + " (0: all of them)");
  CHECK_FALSE(std::filesystem::exists(c.checkpoint_dir));
}

TEST_CASE("flags given that nothing would read are refused", "[trainer]") {
  const auto given = [](std::initializer_list<std::string_view> flags) {
    const std::vector<std::string_view> names(flags);
    return [names](std::string_view flag) {
      return std::find(names.begin(), names.end(), flag) != names.end();
    };
  };
  TrainConfig c;
  CHECK_NOTHROW(ValidateGivenFlags(c, given({})));
  CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"checkpoint_every"})),
                    Catch::StartsWith("--checkpoint-every needs --checkpoint-dir"));
  CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"compression_threshold"})),
                    Catch::StartsWith("--compression-threshold is for 2bit compression"));
  c.gradient_compression = "1bit";  // its step is a mean magnitude, not the threshold
  CHECK_THROWS_AS(ValidateGivenFlags(c, given({"compression_threshold"})), ConfigError);
  c.pull_compression = "2bit";
  CHECK_NOTHROW(ValidateGivenFlags(c, given({"compression_threshold"})));
  c = TrainConfig{};
  c.lr_scheduler = "cosine";
  CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"lr_factor"})),
                    "--lr-factor needs --lr-scheduler factor or multifactor (it is cosine, which "
                    "has no steps): drop one of them");
  c.lr_scheduler = "factor";
  CHECK_NOTHROW(ValidateGivenFlags(c, given({"lr_factor"})));
  // A rate a schedule without it never reaches, momentum an optimizer without it never uses.
  CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"final_lr"})),
                    "--final-lr is where --lr-scheduler cosine ends (it is factor): drop one of "
                    "them");
  c.lr_scheduler = "cosine";
  CHECK_NOTHROW(ValidateGivenFlags(c, given({"final_lr"})));
  CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"warmup_begin_lr"})),
                    Catch::StartsWith("--warmup-begin-lr is where a warm-up starts, and this "
                                      "job has none"));
  c.warmup_epochs = 1;
  CHECK_NOTHROW(ValidateGivenFlags(c, given({"warmup_begin_lr"})));
  for (const std::string optimizer : {"adam", "adagrad", "rmsprop"}) {
    c.optimizer = optimizer;
    CHECK_THROWS_WITH(ValidateGivenFlags(c, given({"momentum"})),
                      "--momentum is for --optimizer sgd or nag; " + optimizer +
                          " keeps its own moments: drop it");
  }
  c.optimizer = "nag";
  CHECK_NOTHROW(ValidateGivenFlags(c, given({"momentum"})));
}

TEST_CASE("schedule flags the job would never reach are refused", "[trainer]") {
  TrainConfig c;
  c.epochs = 2;
  c.lr_scheduler = "factor";
  c.lr_step_epochs = "100";
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--lr-step-epochs 100: epoch 100 is not below --epochs 2, so the rate never "
                    "drops there: give steps below it, or more --epochs");
  c.lr_scheduler = "multifactor";
  c.lr_step_epochs = "1,2";
  CHECK_THROWS_WITH(ValidateConfig(c), Catch::StartsWith("--lr-step-epochs 1,2: epoch 2 is not "
                                                         "below --epochs 2"));
  c.lr_step_epochs = "1";
  CHECK_NOTHROW(ValidateConfig(c));
  c = TrainConfig{};
  c.epochs = 2;
  c.warmup_epochs = 5;  // with a constant rate too: the job ends inside the warm-up
  CHECK_THROWS_WITH(ValidateConfig(c),
                    "--warmup-epochs 5 must be below --epochs 2: the job would end before the "
                    "rate reaches --lr");
}

}  // namespace
}  // namespace ps::worker
