// ps-train's record beside a checkpoint (worker/run_record.h): it round-trips, a damaged one is
// named, and a resume that cannot go on from the checkpoint is refused naming the flag.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>

#include "kvstore/checkpoint.h"
#include "tests/worker/test_util.h"
#include "worker/errors.h"
#include "worker/run_record.h"

namespace ps::worker {
namespace {

RunRecord TwoWorkers() {
  return RunRecord{.model = "mlp",
                   .optimizer = "sgd",
                   .momentum = 0.9f,
                   .kvstore = "dist_sync",
                   .gradient_compression = "none",
                   .workers = 2,
                   .batch_size = 64,
                   .examples = 4000,
                   .updates_per_epoch = 31,
                   .updates_done = 62,
                   .scheduled = true,
                   .update_flags =
                       "--lr 0.1 --momentum 0.9 --wd 0.0001 --lr-scheduler cosine "
                       "--final-lr 0 --epochs 10",
                   .seed = 7};
}

TEST_CASE("run record: written, read back, absent, damaged", "[run_record]") {
  testing::TempDir dir;
  CHECK_FALSE(ReadRunRecord(dir.path()).has_value());  // an older checkpoint: no checks
  RunRecord saved = TwoWorkers();
  saved.momentum = 0.125f;
  WriteRunRecord(dir.path(), saved);
  const std::optional<RunRecord> read = ReadRunRecord(dir.path());
  REQUIRE(read.has_value());
  CHECK(read->model == "mlp");
  CHECK(read->optimizer == "sgd");
  CHECK(read->momentum == 0.125f);
  CHECK(read->kvstore == "dist_sync");
  CHECK(read->gradient_compression == "none");
  CHECK(read->workers == 2);
  CHECK(read->batch_size == 64);
  CHECK(read->examples == 4000);
  CHECK(read->updates_per_epoch == 31);
  CHECK(read->updates_done == std::optional<std::uint64_t>(62));
  CHECK(read->scheduled);
  CHECK(read->update_flags == saved.update_flags);
  CHECK(read->seed == std::optional<std::uint64_t>(7));
  CHECK_FALSE(std::filesystem::exists(dir.file("TRAINING.tmp")));

  // Without the updates_done and update_flags lines (older records): one rate trained every
  // epoch, and the flags are not compared.
  {
    std::ifstream in(dir.file("TRAINING"));
    std::string text, line;
    while (std::getline(in, line)) {
      if (!line.starts_with("updates_done ") && !line.starts_with("update_flags ") &&
          !line.starts_with("seed ")) {
        text += line + "\n";
      }
    }
    std::ofstream(dir.file("TRAINING"), std::ios::trunc) << text;
  }
  const std::optional<RunRecord> older = ReadRunRecord(dir.path());
  REQUIRE(older.has_value());
  CHECK_FALSE(older->updates_done.has_value());
  CHECK(older->UpdatesDone(2) == 62);
  CHECK(older->update_flags.empty());
  CHECK_FALSE(older->seed.has_value());

  // A line whose value is not whole, not a count, or given twice: damage, not a value.
  WriteRunRecord(dir.path(), saved);
  std::string good;
  {
    std::ifstream in(dir.file("TRAINING"));
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const auto& [from, to, key] : {std::tuple<std::string, std::string, std::string>{
                                          "updates_done 62", "updates_done 6x2", "updates_done"},
                                      {"momentum 0.125", "momentum nan", "momentum"},
                                      {"model mlp", "model mxp", "model"},
                                      {"workers 2", "workers 0", "workers"},
                                      {"seed 7", "seed -7", "seed"}}) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    std::ofstream(dir.file("TRAINING"), std::ios::trunc) << text;
    CHECK_THROWS_WITH(ReadRunRecord(dir.path()),
                      Catch::StartsWith("--resume: " + dir.file("TRAINING") + " has no valid '" +
                                        key + "' line: the file is damaged"));
  }
  std::ofstream(dir.file("TRAINING"), std::ios::trunc) << good << "model cnn\n";
  CHECK_THROWS_WITH(ReadRunRecord(dir.path()),
                    Catch::StartsWith("--resume: " + dir.file("TRAINING") +
                                      " has two 'model' lines: the file is damaged"));

  std::ofstream(dir.file("TRAINING"), std::ios::trunc) << "model mlp\nworkers two\n";
  CHECK_THROWS_WITH(ReadRunRecord(dir.path()),
                    Catch::StartsWith("--resume: " + dir.file("TRAINING") +
                                      " has no 'optimizer' line: the file is damaged"));
  std::ofstream(dir.file("TRAINING"), std::ios::trunc)
      << "model mlp\noptimizer sgd\nkvstore local\ngradient_compression none\nmomentum x\n";
  CHECK_THROWS_WITH(ReadRunRecord(dir.path()),
                    Catch::StartsWith("--resume: " + dir.file("TRAINING") +
                                      " has no valid 'momentum' line: the file is damaged"));
}

TEST_CASE("a durable file replaces the old one whole, or says why it cannot", "[run_record]") {
  testing::TempDir dir;
  const std::string path = dir.file("LATEST");
  checkpoint::WriteTextFile(dir.path(), "LATEST", "epoch-1\n");
  checkpoint::WriteTextFile(dir.path(), "LATEST", "epoch-2\n");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "epoch-2\n");
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);  // no temporary file left
  CHECK_THROWS_WITH(checkpoint::WriteTextFile(dir.file("missing"), "LATEST", "x"),
                    Catch::StartsWith("cannot create " + dir.file("missing/.LATEST.tmp.")) &&
                        Catch::EndsWith(": No such file or directory"));
}

TEST_CASE("run record: a resume the checkpoint cannot carry is refused, naming the flag",
          "[run_record]") {
  const RunRecord saved = TwoWorkers();
  const std::string where = "ck/epoch-2";
  CHECK_NOTHROW(CheckResume(saved, saved, 2, where));

  RunRecord now = TwoWorkers();
  now.model = "cnn";
  CHECK_THROWS_WITH(CheckResume(saved, now, 2, where),
                    "--resume: ck/epoch-2 was written by a job of --model mlp, this one is "
                    "--model cnn: resume with --model mlp, or start the new model in another "
                    "--checkpoint-dir");

  now = TwoWorkers();
  now.optimizer = "adam";
  CHECK_THROWS_WITH(CheckResume(saved, now, 2, where),
                    Catch::EndsWith("the checkpoint holds sgd's state; resume with --optimizer "
                                    "sgd"));

  // 2bit compression sets momentum 0 unless given: the message says so.
  now = TwoWorkers();
  now.momentum = 0.0f;
  now.gradient_compression = "2bit";
  CHECK_THROWS_WITH(CheckResume(saved, now, 2, where),
                    Catch::Contains("was written by a job with momentum (--momentum 0.9), this "
                                    "one runs without it: resume with --momentum 0.9 "
                                    "(--gradient-compression 2bit or 1bit sets --momentum 0") &&
                        Catch::Contains("the checkpoint's job had --gradient-compression none"));
  now.momentum = 0.5f;  // another value, still buffers: the state fits
  CHECK_NOTHROW(CheckResume(saved, now, 2, where));

  // A third worker: 20 updates per epoch where the checkpoint counted 31.
  now = TwoWorkers();
  now.workers = 3;
  now.updates_per_epoch = 20;
  CHECK_THROWS_WITH(CheckResume(saved, now, 2, where),
                    "--resume: ck/epoch-2 was written by a job whose servers counted 62 updates "
                    "in its 2 epoch(s) (the last job on it made 31 per epoch: 2 worker(s), "
                    "--batch-size 64, 4000 examples, --kvstore dist_sync); this one makes 20 per "
                    "epoch (3 worker(s), --batch-size 64, 4000 examples, --kvstore dist_sync), so "
                    "its learning-rate schedule, which counts updates, would take them for 3.1 "
                    "epoch(s), not 2: resume with the workers, --batch-size, --num-examples and "
                    "--kvstore that trained those epochs (when one rate trained them all), or "
                    "with a constant rate (--lr-scheduler none --warmup-epochs 0)");
  now.scheduled = false;  // a constant rate does not count updates
  CHECK_NOTHROW(CheckResume(saved, now, 2, where));

  // A chain: epoch 1 at 31 updates, epoch 2 at 20 under a constant rate. A scheduled job of
  // 20 per epoch would take the 51 updates for 2.55 epochs: refused, though the last job's
  // rate is its own.
  RunRecord chained = TwoWorkers();
  chained.workers = 3;
  chained.updates_per_epoch = 20;
  chained.updates_done = 51;
  now = chained;
  now.scheduled = true;
  CHECK_THROWS_WITH(CheckResume(chained, now, 2, where),
                    Catch::Contains("counted 51 updates in its 2 epoch(s)") &&
                        Catch::Contains("would take them for 2.55 epoch(s), not 2"));
}

TEST_CASE("run record: a resume with other update flags is noted, naming them", "[run_record]") {
  const RunRecord saved = TwoWorkers();
  const std::string where = "ck/epoch-2";
  CHECK(ResumeNote(saved, saved, where).empty());
  RunRecord older = saved;  // a record without the line: nothing to compare
  older.update_flags.clear();
  RunRecord now = TwoWorkers();
  now.update_flags =
      "--lr 0.05 --momentum 0.9 --wd 0.0001 --lr-scheduler cosine --final-lr 0 "
      "--epochs 20";
  CHECK(ResumeNote(older, now, where).empty());
  CHECK(ResumeNote(saved, now, where) ==
        "--resume: ck/epoch-2 was trained with --lr 0.1, --epochs 10; this job has --lr 0.05, "
        "--epochs 20: the updates' step changes from this epoch on (resume with the "
        "checkpoint's flags to go on as its job would have)");
  // Another schedule: the flags only one side has are named on that side.
  now.update_flags = "--lr 0.1 --momentum 0.9 --wd 0.0001 --lr-scheduler none";
  CHECK_THAT(ResumeNote(saved, now, where),
             Catch::StartsWith("--resume: ck/epoch-2 was trained with --lr-scheduler cosine, "
                               "--final-lr 0, --epochs 10; this job has --lr-scheduler none:"));
}

TEST_CASE("run record: a resume without the push compression is noted", "[run_record]") {
  RunRecord saved = TwoWorkers();
  saved.gradient_compression = "2bit";
  RunRecord now = TwoWorkers();  // none
  CHECK(CompressionNote(saved, now, "ck/epoch-2") ==
        "--resume: ck/epoch-2 was trained with --gradient-compression 2bit; this job has none: "
        "the workers' saved push residuals are not used (resume with --gradient-compression "
        "2bit to go on as its job would have)");
  CHECK(CompressionNote(saved, saved, "ck/epoch-2").empty());
  CHECK(CompressionNote(now, saved, "ck/epoch-2").empty());  // the store names other cases
}

TEST_CASE("run record: a resume with another --seed is noted", "[run_record]") {
  const RunRecord saved = TwoWorkers();
  const std::string where = "ck/epoch-2";
  CHECK(SeedNote(saved, saved, where).empty());
  RunRecord now = TwoWorkers();
  now.seed = 8;
  CHECK(SeedNote(saved, now, where) ==
        "--resume: ck/epoch-2 was trained with --seed 7; this job has --seed 8: its epochs are "
        "shuffled otherwise from here on (resume with --seed 7 to go on as its job would have; "
        "or ck/epoch-2 is another job's checkpoint)");
  RunRecord older = saved;  // a record without the line: nothing to compare
  older.seed.reset();
  CHECK(SeedNote(older, now, where).empty());
}

}  // namespace
}  // namespace ps::worker
