#include "ps/src/net_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "ps/error.h"
#include "ps/src/log_text.h"
#include "ps/src/scoped_fd.h"

namespace ps::net {
namespace {

std::string ToString(const in_addr& addr) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr, text, sizeof(text));
  return text;
}

struct IfAddrsDeleter {
  void operator()(ifaddrs* list) const { freeifaddrs(list); }
};
using IfAddrsList = std::unique_ptr<ifaddrs, IfAddrsDeleter>;

IfAddrsList ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error(std::string("getifaddrs failed: ") + strerror(errno));
  return IfAddrsList(list);
}

// getaddrinfo's answer for `host`: the dotted address, or rc != 0.
struct Resolved {
  int rc = 0;
  std::string ip;
};

Resolved Lookup(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) return {rc != 0 ? rc : EAI_NONAME, ""};
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(found, &freeaddrinfo);
  return {0, ToString(reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr)};
}

// An IPv6 address as people write them: "::1", "[::1]", "fe80::1%eth0" (with a zone).
bool IsIPv6Literal(const std::string& host) {
  std::string address = host;
  if (address.size() > 2 && address.front() == '[' && address.back() == ']') {
    address = address.substr(1, address.size() - 2);
  }
  address = address.substr(0, address.find('%'));
  in6_addr ipv6{};
  return inet_pton(AF_INET6, address.c_str(), &ipv6) == 1;
}

// Refuses an IPv6 address at once: no wait makes it an IPv4 one.
void RefuseIPv6(const std::string& host, const std::string& what) {
  if (IsIPv6Literal(host)) {
    throw Error(what + "='" + host + "' is an IPv6 address, and the job's nodes speak IPv4: " +
                "set it to an IPv4 address or to a host name with one");
  }
}

// A value no resolver can take (it would wait out the registration timeout retrying a name
// that never appears): refused at once, saying what is wrong with it.
void RefuseMalformed(const std::string& host, const std::string& what) {
  RefuseIPv6(host, what);
  const auto allowed = [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '.' || c == '-' || c == '_';
  };
  if (std::all_of(host.begin(), host.end(), allowed)) return;
  const std::string value = what + "='" + host + "'";
  if (host.find("://") != std::string::npos) {
    throw Error(value + " holds a scheme: give the host name or IPv4 address alone");
  }
  if (host.find(':') != std::string::npos) {
    throw Error(value + " holds a port: give the host name or IPv4 address alone" +
                (what == "DMLC_PS_ROOT_URI" ? " (the port goes in DMLC_PS_ROOT_PORT)" : ""));
  }
  if (std::any_of(host.begin(), host.end(), [](unsigned char c) { return std::isspace(c); })) {
    throw Error(value + " holds a blank or a line break: give the host name or IPv4 address " +
                "alone");
  }
  throw Error(value + " is not a host name or IPv4 address (letters, digits, '.', '-' and '_')");
}

[[noreturn]] void ThrowUnresolved(const std::string& host, const std::string& what, int rc,
                                  const std::string& waited) {
  RefuseIPv6(host, what);
  throw Error("cannot resolve " + what + "='" + host + "'" + waited + ": " + gai_strerror(rc) +
              ": set it to a host name this machine can resolve to an IPv4 address, or to an "
              "IPv4 address");
}

}  // namespace

std::string ResolveIPv4(const std::string& host, const std::string& what) {
  RefuseMalformed(host, what);
  const Resolved resolved = Lookup(host);
  if (resolved.rc != 0) ThrowUnresolved(host, what, resolved.rc, "");
  return resolved.ip;
}

std::string ResolveIPv4Until(const std::string& host, const std::string& what,
                             std::chrono::steady_clock::time_point deadline,
                             std::chrono::milliseconds report_every,
                             const std::function<void(const std::string& why)>& waiting) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kRetryEvery = std::chrono::milliseconds(250);
  RefuseMalformed(host, what);
  const auto start = Clock::now();
  auto next_report = start + report_every;
  while (true) {
    const Resolved resolved = Lookup(host);
    if (resolved.rc == 0) return resolved.ip;
    // Only "no such name (yet)" and "the resolver did not answer" can change by waiting.
    const bool may_appear = resolved.rc == EAI_NONAME || resolved.rc == EAI_AGAIN ||
                            resolved.rc == EAI_FAIL || resolved.rc == EAI_NODATA;
    const auto now = Clock::now();
    if (!may_appear || now >= deadline) {
      ThrowUnresolved(
          host, what, resolved.rc,
          may_appear
              ? " within " + FormatSeconds(
                                 std::chrono::duration_cast<std::chrono::milliseconds>(now - start))
              : "");
    }
    if (now >= next_report) {
      waiting(gai_strerror(resolved.rc));
      next_report = now + report_every;
    }
    // Polling an outside service (DNS) that cannot notify us; bounded by the deadline.
    std::this_thread::sleep_for(std::min<Clock::duration>(kRetryEvery, deadline - Clock::now()));
  }
}

ProbeResult ProbeTcp(const std::string& ip, int port, std::chrono::milliseconds timeout) {
  const ScopedFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd.get() < 0) return {.why = std::string("cannot open a socket: ") + strerror(errno)};
  if (inet_pton(AF_INET, ip.c_str(), &target.sin_addr) != 1) {
    return {.why = "'" + ip + "' is no address"};
  }
  int error = 0;
  const auto started = std::chrono::steady_clock::now();
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
    if (errno != EINPROGRESS) {
      error = errno;
    } else {
      pollfd wait_for{fd.get(), POLLOUT, 0};
      const int ready = poll(&wait_for, 1, static_cast<int>(timeout.count()));
      if (ready == 0) return {.why = "no answer within " + FormatSeconds(timeout)};
      socklen_t length = sizeof(error);
      if (ready < 0) {
        error = errno;
      } else {
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
  }
  const auto round_trip = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  if (error == 0) return {.accepted = true, .why = "", .round_trip = round_trip};
  if (error == ECONNREFUSED) return {.refused = true, .why = "", .round_trip = round_trip};
  std::string why = strerror(error);
  if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
  return {.why = why};
}

std::string InterfaceAddress(const std::string& interface) {
  const IfAddrsList list = ListInterfaces();
  std::string names;
  for (const ifaddrs* it = list.get(); it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (interface == it->ifa_name) {
      return ToString(reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr);
    }
    names += std::string(names.empty() ? "" : ", ") + it->ifa_name;
  }
  throw Error("DMLC_INTERFACE='" + interface +
              "' is not an interface with an IPv4 address on this machine; there are: " + names);
}

std::string RouteSourceAddress(const std::string& ip) {
  const ScopedFd fd(socket(AF_INET, SOCK_DGRAM, 0));
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(9);  // any port: a UDP connect only picks the route
  if (fd.get() < 0 || inet_pton(AF_INET, ip.c_str(), &target.sin_addr) != 1 ||
      connect(fd.get(), reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
    throw Error("no route to the scheduler at " + ip +
                ": set DMLC_NODE_HOST or DMLC_INTERFACE to this node's address");
  }
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length);
  return ToString(local.sin_addr);
}

std::string HostIdentity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  struct stat netns {};
  if (!std::getline(boot, boot_id) || boot_id.empty() || stat("/proc/self/ns/net", &netns) != 0) {
    return "";
  }
  return boot_id + "/" + std::to_string(netns.st_ino);
}

bool IsLocalAddress(const std::string& ip) {
  in_addr wanted{};
  if (inet_pton(AF_INET, ip.c_str(), &wanted) != 1) return false;
  // The whole 127/8 block is local on Linux, not only the addresses lo lists.
  if ((ntohl(wanted.s_addr) >> 24) == 127) return true;
  const IfAddrsList list = ListInterfaces();
  for (const ifaddrs* it = list.get(); it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr == wanted.s_addr) {
      return true;
    }
  }
  return false;
}

}  // namespace ps::net
