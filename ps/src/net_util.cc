#include "net_util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>

#include "ps/error.h"

namespace ps::net {
namespace {

std::string ToString(const in_addr& addr) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr, text, sizeof(text));
  return text;
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct IfAddrsDeleter {
  void operator()(ifaddrs* list) const { freeifaddrs(list); }
};
using IfAddrsList = std::unique_ptr<ifaddrs, IfAddrsDeleter>;

IfAddrsList ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error(std::string("getifaddrs failed: ") + strerror(errno));
  return IfAddrsList(list);
}

}  // namespace

std::string ResolveIPv4(const std::string& host, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw Error("cannot resolve " + what + "='" + host + "': " + gai_strerror(rc) +
                ": set it to a host name this machine can resolve or to an IP address");
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(found, &freeaddrinfo);
  const auto* addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  return ToString(addr->sin_addr);
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
  const Fd fd(socket(AF_INET, SOCK_DGRAM, 0));
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
