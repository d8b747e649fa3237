// The ps-train program's command line: --help, and one-line errors with a non-zero exit for
// input a user can get wrong. Runs the real binary with the local KVStore.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "worker/device.h"

namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr together
};

// Owns a popen() stream; pclose() on scope exit if not closed explicitly.
struct PipeCloser {
  void operator()(FILE* f) const { pclose(f); }
};

// `redirect`: where the output goes (the default: both streams into the result).
Result RunPsTrain(const std::string& args, const std::string& env = "",
                  const std::string& redirect = "2>&1") {
  const std::string cmd = "env -u DMLC_ROLE " + env + " " + std::string(PS_BIN_DIR) + "/ps-train " +
                          args + " " + redirect;
  std::unique_ptr<FILE, PipeCloser> pipe(popen(cmd.c_str(), "r"));
  REQUIRE(pipe != nullptr);
  Result r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe.get())) > 0)
    r.output.append(buf.data(), n);
  const int raw = pclose(pipe.release());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

// One line, starting "ps-train: error: ", containing `fragment`.
void CheckOneLineError(const Result& r, const std::string& fragment) {
  INFO("output: " << r.output);
  CHECK(r.status == 1);
  CHECK(r.output.rfind("ps-train: error: ", 0) == 0);
  CHECK(r.output.find(fragment) != std::string::npos);
  CHECK(r.output.find('\n') == r.output.size() - 1);
}

TEST_CASE("ps-train --version prints the version", "[ps-train]") {
  const Result r = RunPsTrain("--version");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.rfind("ps-train version 0.", 0) == 0);
}

TEST_CASE("ps-train --help describes every flag", "[ps-train]") {
  const Result r = RunPsTrain("--help");
  INFO(r.output);
  CHECK(r.status == 0);
  for (const char* flag : {"--model", "--device", "--data-dir", "--batch-size", "--epochs", "--lr",
                           "--momentum", "--wd", "--seed", "--log-interval", "--metrics-out",
                           "--kvstore", "--update-on-kvstore", "--no-update-on-kvstore"}) {
    CHECK(r.output.find(flag) != std::string::npos);
  }
}

TEST_CASE("ps-train rejects bad input with a one-line error and exit status 1", "[ps-train]") {
  CheckOneLineError(RunPsTrain("--kvstore local --momentum 0.999999999"),
                    "--momentum 0.999999999 reads as 1 in float32, in which ps-train computes");
  CheckOneLineError(RunPsTrain("--kvstore local --model resnet"),
                    "unknown --model 'resnet': use mlp or cnn");
  CheckOneLineError(RunPsTrain("--kvstore local --device tpu"), "unknown --device 'tpu'");
  CheckOneLineError(RunPsTrain("--kvstore local --device cpu --data-dir /nonexistent"),
                    "cannot open data file /nonexistent/train-images-idx3-ubyte.gz");
  CheckOneLineError(RunPsTrain("--kvstore local --batch-size 0"), "--batch-size");
  CheckOneLineError(RunPsTrain("--kvstore local stray"), "unexpected argument 'stray'");
  CheckOneLineError(RunPsTrain("--kvstore local --epoch 2"), "unknown flag --epoch: see --help");
  CheckOneLineError(RunPsTrain("--kvstore local --epochs two"),
                    "invalid value 'two' for --epochs (int32)");
  // Yes/no flags: a value only after '=', and none after the negation.
  CheckOneLineError(RunPsTrain("--kvstore local --resume false"),
                    "--resume false: a yes/no flag takes its value after '=', not as the next "
                    "argument: write --resume=false");
  CheckOneLineError(RunPsTrain("--kvstore local --noresume false"),
                    "--noresume false: a negated yes/no flag takes no value: write "
                    "--resume=false (or --noresume) or --resume=true");
  CheckOneLineError(
      RunPsTrain("--kvstore local --no-update-on-kvstore=true"),
      "a negated yes/no flag takes no value: write --update-on-kvstore=false (or "
      "--noupdate-on-kvstore) to turn it off, --update-on-kvstore=true to turn it on");
  // Values float32 cannot hold are not read as 0 or infinity.
  CheckOneLineError(RunPsTrain("--kvstore local --lr 1e-50"),
                    "--lr 1e-50 is outside float32's range (magnitudes from about 1.2e-38 to "
                    "3.4e38), in which ps-train computes");
  CheckOneLineError(RunPsTrain("--kvstore local --lr 1e39"), "--lr 1e+39 is outside float32's");
  CheckOneLineError(RunPsTrain("--kvstore local --lr 1e-40"), "--lr 1e-40 is outside float32's");
  CheckOneLineError(RunPsTrain("--kvstore local --compression-threshold 1e-50"),
                    "--compression-threshold 1e-50 is outside");
  CheckOneLineError(RunPsTrain("--kvstore local", "PS_LOCAL_RANK=first"),
                    "PS_LOCAL_RANK='first' is invalid");
  CheckOneLineError(RunPsTrain("--kvstore local", "PS_LOCAL_RANK=-1"),
                    "PS_LOCAL_RANK='-1' is invalid");
  if (ps::worker::ProbeCuda().devices == 0) {
    CheckOneLineError(RunPsTrain("--kvstore local --device cuda"), "no CUDA device found");
  }
}

TEST_CASE("ps-train fails when its metrics or its log cannot be written", "[ps-train]") {
  // Not exit 0 with the metrics or the final accuracy lost (a full disk).
  const std::string run =
      "--kvstore local --device cpu --epochs 1 --num-examples 256 --log-interval 1";
  CheckOneLineError(RunPsTrain(run + " --metrics-out /dev/full", "", "2>&1 >/dev/null"),
                    "cannot write --metrics-out /dev/full: No space left on device");
  CheckOneLineError(RunPsTrain(run, "", "2>&1 >/dev/full"), "cannot write the standard output");
}

TEST_CASE("ps-train refuses --kvstore local in a job's environment", "[ps-train]") {
  // Each worker would train alone and never register: the job would wait out its timeouts.
  const std::string run = "--kvstore local --device cpu --epochs 1 --num-examples 256";
  CheckOneLineError(RunPsTrain(run, "DMLC_NUM_WORKER=2"),
                    "--kvstore local would train this process alone, but DMLC_NUM_WORKER=2 says "
                    "it is one of a job's workers: to train together, use --kvstore dist_sync or "
                    "dist_async");
  const Result alone = RunPsTrain(run, "DMLC_NUM_WORKER=1");
  INFO(alone.output);
  CHECK(alone.status == 0);
  CHECK(alone.output.find("warning") == std::string::npos);
}

TEST_CASE("ps-train: gradient compression flags, and their wrong use", "[ps-train][compression]") {
  const Result help = RunPsTrain("--help");
  for (const char* flag :
       {"--gradient-compression", "--compression-threshold", "--pull-compression"}) {
    CHECK(help.output.find(flag) != std::string::npos);
  }
  CheckOneLineError(RunPsTrain("--kvstore dist_sync --gradient-compression 3bit"),
                    "unknown --gradient-compression '3bit': use none, 2bit, 1bit or fp16");
  CheckOneLineError(RunPsTrain("--kvstore dist_sync --pull-compression int8"),
                    "unknown --pull-compression 'int8'");
  CheckOneLineError(RunPsTrain("--kvstore local --gradient-compression 2bit"),
                    "--gradient-compression needs --kvstore dist_sync or dist_async");
  CheckOneLineError(
      RunPsTrain("--kvstore dist_sync --gradient-compression 2bit --compression-threshold 0"),
      "--compression-threshold must be a finite number > 0");
}

}  // namespace
