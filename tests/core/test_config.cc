#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "ps/config.h"
#include "ps/error.h"
#include "ps/src/misspelt_settings.h"
#include "tests/util/settings_config.h"

namespace {

using Settings = std::map<std::string, std::string>;

ps::ClusterConfig ParseSettings(const Settings& settings) {
  return ps::test::ConfigFromSettings(settings);
}

Settings Valid() {
  return {{"DMLC_ROLE", "worker"},
          {"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "3"}};
}

std::string ErrorOf(const Settings& settings) {
  try {
    ParseSettings(settings);
  } catch (const ps::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: a complete environment parses with defaults", "[config]") {
  const auto config = ParseSettings(Valid());
  CHECK(config.role == ps::Role::kWorker);
  CHECK(config.root_uri == "127.0.0.1");
  CHECK(config.root_port == 9000);
  CHECK(config.num_servers == 2);
  CHECK(config.num_workers == 3);
  CHECK(config.verbose == 0);
  CHECK_FALSE(config.use_kubernetes);
  CHECK(config.heartbeat_interval == std::chrono::milliseconds(2000));
  CHECK(config.heartbeat_timeout == std::chrono::milliseconds(20000));
  CHECK(config.register_timeout == std::chrono::milliseconds(60000));
  CHECK(config.stall_timeout == std::chrono::milliseconds(600000));
  CHECK(config.use_ipc);
  CHECK(config.use_shm);
  CHECK(config.io_threads == 2);
  CHECK(config.wait_spin == std::chrono::microseconds(200));
  CHECK(config.replication);
  CHECK(config.SchedulerAddress() == "127.0.0.1:9000");
}

TEST_CASE("config: an empty setting means its default, also for the ones on by default",
          "[config]") {
  auto settings = Valid();
  for (const char* name : {"PS_USE_IPC", "PS_USE_SHM", "PS_REPLICATION", "PS_ENCRYPT",
                           "DMLC_USE_KUBERNETES", "PS_HEARTBEAT_INTERVAL", "PS_VERBOSE"}) {
    settings[name] = "";
  }
  const auto config = ParseSettings(settings);
  CHECK(config.use_ipc);
  CHECK(config.use_shm);
  CHECK(config.replication);  // `export PS_REPLICATION=` must not turn fault tolerance off
  CHECK_FALSE(config.encrypt);
  CHECK_FALSE(config.use_kubernetes);
  CHECK(config.heartbeat_interval == std::chrono::milliseconds(2000));
  CHECK(config.verbose == 0);
}

TEST_CASE("config: optional settings are read", "[config]") {
  auto settings = Valid();
  settings["DMLC_ROLE"] = "scheduler";
  settings["DMLC_PS_ROOT_PORT"] = "0";  // the scheduler may pick a free port
  settings["DMLC_NODE_HOST"] = "10.1.2.3";
  settings["DMLC_INTERFACE"] = "eth0";
  settings["PS_VERBOSE"] = "2";
  settings["DMLC_USE_KUBERNETES"] = "1";
  settings["PS_HEARTBEAT_INTERVAL"] = "0.5";
  settings["PS_HEARTBEAT_TIMEOUT"] = "3";
  settings["PS_REGISTER_TIMEOUT"] = "7.25";
  settings["PS_STALL_TIMEOUT"] = "0";
  settings["PS_RANK"] = "3";
  settings["PS_USE_IPC"] = "0";
  settings["PS_USE_SHM"] = "false";
  settings["PS_IO_THREADS"] = "1";
  settings["PS_WAIT_SPIN_US"] = "0";
  settings["PS_REPLICATION"] = "0";
  settings["PS_TCP_RCVBUF"] = "65536";
  const auto config = ParseSettings(settings);
  CHECK(config.role == ps::Role::kScheduler);
  CHECK(config.root_port == 0);
  CHECK(config.node_host == "10.1.2.3");
  CHECK(config.interface == "eth0");
  CHECK(config.verbose == 2);
  CHECK(config.use_kubernetes);
  CHECK(config.heartbeat_interval == std::chrono::milliseconds(500));
  CHECK(config.heartbeat_timeout == std::chrono::milliseconds(3000));
  CHECK(config.register_timeout == std::chrono::milliseconds(7250));
  CHECK(config.stall_timeout == std::chrono::milliseconds(0));
  CHECK(config.rank_hint == 3);
  CHECK_FALSE(config.use_ipc);
  CHECK_FALSE(config.use_shm);
  CHECK(config.io_threads == 1);
  CHECK(config.wait_spin == std::chrono::microseconds(0));
  CHECK_FALSE(config.replication);
  CHECK_FALSE(config.replicated());
  CHECK(config.tcp_receive_buffer == 65536);
  CHECK(ParseSettings(Valid()).tcp_receive_buffer == 0);  // the kernel's autotuning
}

TEST_CASE("config: every invalid value names the variable and what is accepted", "[config]") {
  struct Case {
    std::string variable;
    std::optional<std::string> value;  // nullopt: unset
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"DMLC_ROLE", std::nullopt, "DMLC_ROLE is not set: set it to scheduler, server or worker"},
      {"DMLC_ROLE", "master",
       "DMLC_ROLE='master' is invalid: expected scheduler, server or worker"},
      {"DMLC_PS_ROOT_URI", std::nullopt, "DMLC_PS_ROOT_URI is not set"},
      {"DMLC_PS_ROOT_PORT", std::nullopt, "DMLC_PS_ROOT_PORT is not set"},
      {"DMLC_PS_ROOT_PORT", "http",
       "DMLC_PS_ROOT_PORT='http' is invalid: expected an integer in 1..65535"},
      {"DMLC_PS_ROOT_PORT", "70000", "DMLC_PS_ROOT_PORT='70000' is invalid"},
      {"DMLC_PS_ROOT_PORT", "0", "DMLC_PS_ROOT_PORT='0' is invalid"},  // only the scheduler
      {"DMLC_PS_ROOT_PORT", "80x", "DMLC_PS_ROOT_PORT='80x' is invalid"},
      {"DMLC_NUM_SERVER", "0", "DMLC_NUM_SERVER='0' is invalid: expected an integer in 1..65536"},
      {"DMLC_NUM_SERVER", std::nullopt, "DMLC_NUM_SERVER is not set"},
      {"DMLC_NUM_WORKER", "-2", "DMLC_NUM_WORKER='-2' is invalid"},
      {"PS_VERBOSE", "loud", "PS_VERBOSE='loud' is invalid: expected an integer in 0..2"},
      {"DMLC_USE_KUBERNETES", "yes",
       "DMLC_USE_KUBERNETES='yes' is invalid: expected 0, 1, true or false"},
      {"PS_HEARTBEAT_INTERVAL", "-1", "PS_HEARTBEAT_INTERVAL='-1' is invalid"},
      // Below the millisecond it would read as 0, which turns heartbeats off.
      {"PS_HEARTBEAT_INTERVAL", "0.0001",
       "PS_HEARTBEAT_INTERVAL='0.0001' is invalid: expected 0 or at least 0.001 seconds"},
      {"PS_STALL_TIMEOUT", "1e-5", "PS_STALL_TIMEOUT='1e-5' is invalid: expected 0 or at least"},
      {"PS_HEARTBEAT_TIMEOUT", "soon",
       "PS_HEARTBEAT_TIMEOUT='soon' is invalid: expected a number of seconds in 1..86400"},
      // Shorter, the scheduler would take each of its 0.2 s checks for a pause of its own.
      {"PS_HEARTBEAT_TIMEOUT", "0.4",
       "PS_HEARTBEAT_TIMEOUT='0.4' is invalid: expected a number of seconds in 1..86400"},
      {"PS_REGISTER_TIMEOUT", "0", "PS_REGISTER_TIMEOUT='0' is invalid"},
      // Written as the integers are: no blank before it, no hexadecimal.
      {"PS_REGISTER_TIMEOUT", " 2",
       "PS_REGISTER_TIMEOUT=' 2' is invalid: expected a number of seconds in 0.1..86400"},
      {"PS_HEARTBEAT_INTERVAL", "0x10", "PS_HEARTBEAT_INTERVAL='0x10' is invalid"},
      {"PS_STALL_TIMEOUT", "infinity", "PS_STALL_TIMEOUT='infinity' is invalid"},
      {"PS_STALL_TIMEOUT", "-2",
       "PS_STALL_TIMEOUT='-2' is invalid: expected a number of seconds in 0..86400"},
      {"PS_RANK", "-3", "PS_RANK='-3' is invalid: expected an integer in 0..65535"},
      {"PS_USE_IPC", "maybe", "PS_USE_IPC='maybe' is invalid: expected 0, 1, true or false"},
      {"PS_USE_SHM", "2", "PS_USE_SHM='2' is invalid: expected 0, 1, true or false"},
      {"PS_REPLICATION", "on", "PS_REPLICATION='on' is invalid: expected 0, 1, true or false"},
      {"PS_IO_THREADS", "0", "PS_IO_THREADS='0' is invalid: expected an integer in 1..16"},
      {"PS_WAIT_SPIN_US", "-5",
       "PS_WAIT_SPIN_US='-5' is invalid: expected an integer in 0..1000000"},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", "0", "MXNET_KVSTORE_BIGARRAY_BOUND='0' is invalid"},
      {"PS_CHUNK_BYTES", "100", "PS_CHUNK_BYTES='100' is invalid: expected an integer in 4096.."},
      {"PS_TCP_RCVBUF", "1000",
       "PS_TCP_RCVBUF='1000' is invalid: expected 0 (the kernel's autotuning) or at least 4096"},
      {"PS_TCP_RCVBUF", "64KB", "PS_TCP_RCVBUF='64KB' is invalid: expected an integer in 0.."},
      {"PS_SERVER_WEIGHTS", "1,0", "PS_SERVER_WEIGHTS='1,0' is invalid: expected one positive"},
      {"PS_SERVER_WEIGHTS", "1,,2", "PS_SERVER_WEIGHTS='1,,2' is invalid: expected one positive"},
      {"PS_SERVER_WEIGHTS", "1,x", "PS_SERVER_WEIGHTS='1,x' is invalid: expected one positive"},
      {"PS_SERVER_WEIGHTS", "1,nan", "PS_SERVER_WEIGHTS='1,nan' is invalid"},
      {"PS_SERVER_WEIGHTS", "1,2,3",
       "PS_SERVER_WEIGHTS='1,2,3' is invalid: it has 3 weights for 2 servers (DMLC_NUM_SERVER)"},
  };
  for (const Case& c : cases) {
    auto settings = Valid();
    if (c.value) {
      settings[c.variable] = *c.value;
    } else {
      settings.erase(c.variable);
    }
    INFO(c.variable << "=" << c.value.value_or("(unset)"));
    CHECK_THAT(ErrorOf(settings), Catch::Contains(c.expected));
  }
}

TEST_CASE("config: PS_RANK must be one of the role's ranks", "[config]") {
  auto settings = Valid();  // a worker of 3, beside 2 servers
  settings["PS_RANK"] = "2";
  CHECK(ParseSettings(settings).rank_hint == 2);
  settings["PS_RANK"] = "3";
  CHECK(ErrorOf(settings) ==
        "PS_RANK='3' is invalid: a job of DMLC_NUM_WORKER=3 workers has ranks 0..2: ask for one "
        "of those, or leave PS_RANK unset");
  settings["DMLC_ROLE"] = "server";
  settings["PS_RANK"] = "2";
  CHECK(ErrorOf(settings) ==
        "PS_RANK='2' is invalid: a job of DMLC_NUM_SERVER=2 servers has ranks 0..1: ask for one "
        "of those, or leave PS_RANK unset");
  settings["PS_RANK"] = "1";
  CHECK(ParseSettings(settings).rank_hint == 1);
  settings["DMLC_NUM_SERVER"] = "1";
  CHECK(ErrorOf(settings) ==
        "PS_RANK='1' is invalid: a job of DMLC_NUM_SERVER=1 servers has only rank 0, or leave "
        "PS_RANK unset");
}

TEST_CASE("config: PS_SERVER_WEIGHTS scales each rank's share, the largest to 1000", "[config]") {
  auto settings = Valid();
  settings["DMLC_NUM_SERVER"] = "4";
  settings["PS_SERVER_WEIGHTS"] = "2,2,2,0.5";
  CHECK(ParseSettings(settings).server_weights ==
        std::vector<std::uint32_t>{1000, 1000, 1000, 250});
  settings["PS_SERVER_WEIGHTS"] = "1,1,1,0.0000001";  // none below 1 once scaled
  CHECK(ParseSettings(settings).server_weights == std::vector<std::uint32_t>{1000, 1000, 1000, 1});
  settings["PS_SERVER_WEIGHTS"] = "3,3,3,3";  // alike: the plain layout
  CHECK(ParseSettings(settings).server_weights.empty());
  CHECK(ParseSettings(Valid()).server_weights.empty());
}

TEST_CASE("config: the heartbeat timeout must exceed the interval", "[config]") {
  auto settings = Valid();
  settings["PS_HEARTBEAT_INTERVAL"] = "5";
  settings["PS_HEARTBEAT_TIMEOUT"] = "5";
  CHECK_THAT(ErrorOf(settings), Catch::Contains("PS_HEARTBEAT_TIMEOUT"));
  settings["PS_HEARTBEAT_INTERVAL"] = "0";  // off: no constraint
  CHECK(ErrorOf(settings).empty());
}

TEST_CASE("config: the job secret comes from PS_JOB_SECRET or the first line of a file",
          "[config][security]") {
  CHECK(ParseSettings(Valid()).job_secret.empty());
  Settings given = Valid();
  given["PS_JOB_SECRET"] = "s3cret";
  CHECK(ParseSettings(given).job_secret == "s3cret");

  char pattern[] = "/tmp/ps-secret-XXXXXX";
  const int fd = ::mkstemp(pattern);
  REQUIRE(fd >= 0);
  ::close(fd);
  const std::string path = pattern;
  std::ofstream(path) << "from the file\nsecond line\n";
  Settings from_file = Valid();
  from_file["PS_JOB_SECRET_FILE"] = path;
  CHECK(ParseSettings(from_file).job_secret == "from the file");
  std::ofstream(path, std::ios::trunc) << "written on Windows\r\n";  // a line ends before CR LF
  CHECK(ParseSettings(from_file).job_secret == "written on Windows");
  // A file other users may read lets them join: refused, as ssh refuses such a private key.
  std::filesystem::permissions(path, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  CHECK(ErrorOf(from_file) == "PS_JOB_SECRET_FILE='" + path +
                                  "': other users may read or write it (mode 0604), and with the "
                                  "secret join the job: chmod 600 " +
                                  path);
  std::filesystem::permissions(path, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::remove);

  Settings both = from_file;
  both["PS_JOB_SECRET"] = "s3cret";
  CHECK_THAT(ErrorOf(both), Catch::Contains("both PS_JOB_SECRET and PS_JOB_SECRET_FILE are set"));
  std::ofstream(path, std::ios::trunc) << "\nsecond line\n";
  CHECK_THAT(ErrorOf(from_file), Catch::Contains("PS_JOB_SECRET_FILE='" + path + "' is invalid") &&
                                     Catch::Contains("first line is empty"));
  std::ofstream(path, std::ios::trunc).flush();  // 0 bytes: no first line at all
  CHECK_THAT(ErrorOf(from_file), Catch::Contains("PS_JOB_SECRET_FILE='" + path + "' is invalid") &&
                                     Catch::Contains("the file is empty"));
  std::filesystem::remove(path);
  CHECK_THAT(ErrorOf(from_file), Catch::Contains("cannot be read (No such file or directory)"));
  Settings directory = Valid();
  directory["PS_JOB_SECRET_FILE"] = "/tmp";
  CHECK_THAT(ErrorOf(directory), Catch::Contains("PS_JOB_SECRET_FILE='/tmp' is a directory"));
  Settings endless = Valid();  // read with a bound (ReadSmallFile): no memory filled
  endless["PS_JOB_SECRET_FILE"] = "/dev/zero";
  CHECK_THAT(ErrorOf(endless),
             Catch::Contains("PS_JOB_SECRET_FILE='/dev/zero' cannot be read (it is not a regular "
                             "file (a device or a socket)): point it to a readable file"));
  Settings empty = Valid();
  empty["PS_JOB_SECRET"] = "";
  CHECK_THAT(ErrorOf(empty), Catch::Contains("PS_JOB_SECRET='' is invalid"));
  Settings too_long = Valid();
  too_long["PS_JOB_SECRET"] = std::string(256, 'x');
  CHECK_THAT(ErrorOf(too_long), Catch::Contains("256 bytes, at most 255"));
}

TEST_CASE("config: PS_ENCRYPT needs a job secret", "[config][security]") {
  Settings encrypt = Valid();
  encrypt["PS_ENCRYPT"] = "1";
  CHECK_THAT(ErrorOf(encrypt), Catch::Contains("PS_ENCRYPT=1 derives its keys from the job "
                                               "secret: set PS_JOB_SECRET"));
  encrypt["PS_JOB_SECRET"] = "s";
  CHECK(ParseSettings(encrypt).encrypt);
  encrypt.erase("PS_ENCRYPT");
  CHECK_FALSE(ParseSettings(encrypt).encrypt);
}

TEST_CASE("config: a config filled in by hand is checked as the environment is", "[config]") {
  auto settings = Valid();
  settings["PS_SERVER_WEIGHTS"] = "1,0.25";
  settings["PS_JOB_SECRET"] = "s3cret";
  settings["PS_ENCRYPT"] = "1";
  settings["PS_RANK"] = "2";
  settings["PS_HEARTBEAT_INTERVAL"] = "0.25";
  const ps::ClusterConfig parsed = ParseSettings(settings);
  CHECK_NOTHROW(parsed.Validate());  // what Parse gives, Validate takes
  const auto error_of = [&](const std::function<void(ps::ClusterConfig&)>& change) {
    ps::ClusterConfig config = parsed;
    change(config);
    try {
      config.Validate();
    } catch (const ps::Error& e) {
      return std::string(e.what());
    }
    return std::string("(valid)");
  };
  CHECK_THAT(error_of([](auto& c) { c.root_port = 70000; }),
             Catch::StartsWith("invalid ClusterConfig: DMLC_PS_ROOT_PORT='70000' is invalid") &&
                 Catch::EndsWith("(each field is checked as the environment variable that "
                                 "config.h names beside it)"));
  CHECK_THAT(error_of([](auto& c) { c.num_workers = 0; }),
             Catch::Contains("DMLC_NUM_WORKER='0' is invalid"));
  CHECK_THAT(error_of([](auto& c) { c.io_threads = 0; }),
             Catch::Contains("PS_IO_THREADS='0' is invalid"));
  CHECK_THAT(error_of([](auto& c) { c.rank_hint = 5; }), Catch::Contains("PS_RANK='5'"));
  CHECK_THAT(error_of([](auto& c) { c.heartbeat_timeout = std::chrono::milliseconds(0); }),
             Catch::Contains("PS_HEARTBEAT_TIMEOUT='0' is invalid"));
  CHECK_THAT(error_of([](auto& c) { c.heartbeat_interval = std::chrono::milliseconds(-1); }),
             Catch::Contains("a duration is negative"));
  CHECK_THAT(error_of([](auto& c) { c.job_secret.clear(); }),
             Catch::Contains("PS_ENCRYPT=1 derives its keys from the job secret"));
  CHECK_THAT(error_of([](auto& c) { c.chunk_bytes = 0; }),
             Catch::Contains("PS_CHUNK_BYTES='0' is invalid"));
  CHECK(error_of([](auto& c) { c.server_weights.clear(); }) == "(valid)");
}

TEST_CASE("config: a variable of ours set under a misspelt name is named", "[config]") {
  using ps::internal::MisspeltSettings;
  const auto meant = [](const std::string& name) {
    const auto found = MisspeltSettings({name});
    return found.empty() ? std::string("-") : found.front().meant;
  };
  CHECK(meant("PS_HEARTBEAT_TIMOUT") == "PS_HEARTBEAT_TIMEOUT");   // a letter left out
  CHECK(meant("PS_HAERTBEAT_TIMEOUT") == "PS_HEARTBEAT_TIMEOUT");  // two swapped
  CHECK(meant("DMLC_NUM_SEVER") == "DMLC_NUM_SERVER");
  CHECK(meant("PS_NUM_SERVER") == "DMLC_NUM_SERVER");  // another of our prefixes
  CHECK(meant("DMLC_NUM_WORKERS") == "DMLC_NUM_WORKER");
  CHECK(meant("MXNET_KVSTORE_BIGARRAY_BOUN") == "MXNET_KVSTORE_BIGARRAY_BOUND");
  CHECK(meant("PS_REPLICATON") == "PS_REPLICATION");
  // Ours, the launcher's and the tools' own, other programs', and names far from any setting.
  for (const std::string name :
       {"PS_HEARTBEAT_TIMEOUT", "DMLC_ROLE", "PS_BIN_DIR", "PS_FAILOVER_RUNS", "PS_FORMAT", "PS1",
        "PATH", "MXNET_KVSTORE_REDUCTION_NTHREADS", "DMLC_PS_VAN_TYPE", "PS_RESEND"}) {
    INFO(name);
    CHECK(meant(name) == "-");
  }
  // Short names are held to one letter: PS_RANKS is PS_RANK's, PS_RUNK too, PS_RNKK not.
  CHECK(meant("PS_RANKS") == "PS_RANK");
  CHECK(meant("PS_RNKK") == "-");

  const std::vector<ps::internal::MisspeltSetting> misspelt = {
      {"DMLC_NUM_SEVER", "DMLC_NUM_SERVER"}};
  CHECK(ps::internal::WithMisspellingHint("DMLC_NUM_SERVER is not set: set it", misspelt) ==
        "DMLC_NUM_SERVER is not set: set it; DMLC_NUM_SEVER is set: a misspelling of "
        "DMLC_NUM_SERVER?");
  CHECK(ps::internal::WithMisspellingHint("DMLC_NUM_WORKER is not set", misspelt) ==
        "DMLC_NUM_WORKER is not set");
}
