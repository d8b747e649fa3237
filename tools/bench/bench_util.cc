#include "tools/bench/bench_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace ps::bench {

std::vector<std::string> ParseList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    // "1,,2" is a typo, not the list 1,2; a blank list is the caller's to judge.
    if (item.empty() && text.find_first_not_of(" \t") != std::string::npos) {
      throw std::invalid_argument("'" + text +
                                  "' has an empty item: want items separated by "
                                  "single commas");
    }
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::vector<std::size_t> ParseSizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  for (const std::string& item : ParseList(text)) {
    std::size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) {
      ++digits;
    }
    std::string unit = item.substr(digits);
    for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::size_t scale = 0;
    if (unit.empty() || unit == "B") scale = 1;
    if (unit == "K" || unit == "KB" || unit == "KIB") scale = std::size_t{1} << 10;
    if (unit == "M" || unit == "MB" || unit == "MIB") scale = std::size_t{1} << 20;
    if (unit == "G" || unit == "GB" || unit == "GIB") scale = std::size_t{1} << 30;
    if (digits == 0 || digits > 6 || scale == 0) {
      throw std::invalid_argument("bad size '" + item + "' (examples: 4B, 4KB, 16MB)");
    }
    const std::size_t bytes = std::stoull(item.substr(0, digits)) * scale;
    if (bytes == 0 || bytes % 4 != 0 || bytes > (std::size_t{2} << 30)) {
      throw std::invalid_argument("bad size '" + item +
                                  "': need a multiple of 4 bytes (float32 elements) up to 2 GB");
    }
    sizes.push_back(bytes);
  }
  if (sizes.empty()) throw std::invalid_argument("no sizes given");
  return sizes;
}

std::vector<int> ParseInts(const std::string& text, int min, int max) {
  std::vector<int> values;
  for (const std::string& item : ParseList(text)) {
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value < min || value > max) {
      throw std::invalid_argument("bad number '" + item + "' (accepted: " + std::to_string(min) +
                                  ".." + std::to_string(max) + ")");
    }
    values.push_back(value);
  }
  if (values.empty()) throw std::invalid_argument("empty list");
  return values;
}

std::string SizeFlag(std::size_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  int unit = 0;
  while (unit < 3 && bytes % 1024 == 0 && bytes >= 1024) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + units[unit];
}

std::string Fixed(double value, int precision) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", precision, value);
  return text;
}

std::string SizeName(std::size_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (unit < 3 && value >= 1024) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (value == std::floor(value)) {
    std::snprintf(text, sizeof(text), "%.0f %s", value, units[unit]);
  } else {
    std::snprintf(text, sizeof(text), "%.1f %s", value, units[unit]);
  }
  return text;
}

std::string JoinSizes(const std::vector<std::size_t>& sizes) {
  std::vector<std::string> items;
  for (std::size_t size : sizes) items.push_back(SizeFlag(size));
  return Join(items);
}

std::string Join(const std::vector<std::string>& items) {
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : ",") + item;
  return joined;
}

Latency Summarize(std::vector<double> samples_us) {
  Latency latency;
  if (samples_us.empty()) return latency;
  std::sort(samples_us.begin(), samples_us.end());
  const auto rank = [&](double p) {
    // Nearest rank: the smallest sample with at least p of the samples at or below it.
    const auto n = samples_us.size();
    auto index = static_cast<std::size_t>(std::ceil(p * static_cast<double>(n)));
    index = std::clamp<std::size_t>(index, 1, n);
    return samples_us[index - 1];
  };
  latency.count = samples_us.size();
  latency.min_us = samples_us.front();
  latency.max_us = samples_us.back();
  latency.p50_us = rank(0.50);
  latency.p99_us = rank(0.99);
  double sum = 0;
  for (double sample : samples_us) sum += sample;
  latency.mean_us = sum / static_cast<double>(samples_us.size());
  return latency;
}

int CalibratedIterations(const Calibration& calibration, double seconds_per_iteration) {
  if (calibration.fixed_iterations > 0) return calibration.fixed_iterations;
  double wanted = static_cast<double>(calibration.max_iterations);
  if (seconds_per_iteration > 0)
    wanted = std::ceil(calibration.target_seconds / seconds_per_iteration);
  wanted = std::clamp(wanted, static_cast<double>(calibration.min_iterations),
                      static_cast<double>(calibration.max_iterations));
  return static_cast<int>(wanted);
}

int WarmupFor(const Calibration& calibration, std::size_t bytes) {
  if (calibration.warmup >= 0) return calibration.warmup;
  const std::size_t traffic = std::size_t{128} << 20;
  return static_cast<int>(
      std::clamp<std::size_t>(traffic / std::max<std::size_t>(bytes, 1), 2, 50));
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

namespace {

std::string Number(double value, int precision) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", precision, value);
  return text;
}

}  // namespace

std::string ToJson(const Result& r) {
  std::string json = "{";
  json += "\"op\": " + JsonString(r.op);
  json += ", \"size\": " + std::to_string(r.size);
  json += ", \"size_label\": " + JsonString(SizeFlag(r.size));
  json += ", \"workers\": " + std::to_string(r.workers);
  json += ", \"servers\": " + std::to_string(r.servers);
  json += ", \"mode\": " + JsonString(r.mode);
  json += ", \"transport\": " + JsonString(r.transport);
  json += ", \"iterations\": " + std::to_string(r.iterations);
  json += ", \"samples\": " + std::to_string(r.latency.count);
  json += ", \"min_us\": " + Number(r.latency.min_us, 3);
  json += ", \"p50_us\": " + Number(r.latency.p50_us, 3);
  json += ", \"p99_us\": " + Number(r.latency.p99_us, 3);
  json += ", \"max_us\": " + Number(r.latency.max_us, 3);
  json += ", \"mean_us\": " + Number(r.latency.mean_us, 3);
  json += ", \"throughput_gbps\": " + Number(r.gbps, 6);
  if (r.wire_sent >= 0) {
    json += ", \"compression\": " + JsonString(r.compression);
    json += ", \"wire_sent_bytes\": " + Number(r.wire_sent, 1);
    json += ", \"wire_received_bytes\": " + Number(r.wire_received, 1);
  }
  if (!r.note.empty()) json += ", \"note\": " + JsonString(r.note);
  return json + "}";
}

void PrintTable(const std::string& title, const std::vector<Result>& results) {
  if (results.empty()) return;
  std::printf("\n%s\n", title.c_str());
  std::printf("%-22s %8s %2s %2s %-10s %-4s %7s %11s %11s %11s %11s %9s\n", "op", "size", "W", "S",
              "mode", "net", "iters", "min_us", "p50_us", "p99_us", "max_us", "GB/s");
  for (const Result& r : results) {
    const std::string w = r.workers > 0 ? std::to_string(r.workers) : "-";
    const std::string s = r.servers > 0 ? std::to_string(r.servers) : "-";
    const std::string net = r.transport.empty() ? "-" : r.transport;
    std::printf("%-22s %8s %2s %2s %-10s %-4s %7ld %11.1f %11.1f %11.1f %11.1f %9.3f\n",
                r.op.c_str(), SizeName(r.size).c_str(), w.c_str(), s.c_str(), r.mode.c_str(),
                net.c_str(), r.iterations, r.latency.min_us, r.latency.p50_us, r.latency.p99_us,
                r.latency.max_us, r.gbps);
  }
  std::fflush(stdout);
}

}  // namespace ps::bench
