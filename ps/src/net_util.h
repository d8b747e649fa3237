#pragma once
// Address helpers for the one question every node answers at start: where is the scheduler,
// and which address of mine do I tell the others?
#include <chrono>
#include <functional>
#include <string>

namespace ps::net {

// Resolves a host name or dotted IPv4 address to a dotted IPv4 address; throws ps::Error
// naming `what` (e.g. "DMLC_PS_ROOT_URI") when it cannot.
std::string ResolveIPv4(const std::string& host, const std::string& what);

// ResolveIPv4 that keeps trying while the name does not resolve yet, until `deadline`: a
// Kubernetes pod's DNS record appears only some time after the pod starts. Calls
// `waiting(why)` about every `report_every` while it waits (why: the resolver's answer). At
// the deadline, or on an error that waiting cannot cure, throws as ResolveIPv4 does.
std::string ResolveIPv4Until(const std::string& host, const std::string& what,
                             std::chrono::steady_clock::time_point deadline,
                             std::chrono::milliseconds report_every,
                             const std::function<void(const std::string& why)>& waiting);

// What ProbeTcp found: accepted, or refused (nothing listens), or else what went wrong.
struct ProbeResult {
  bool accepted = false;
  bool refused = false;  // ECONNREFUSED
  std::string why;       // when neither: "no answer within 1 s", "network is unreachable", ...
  // How long the connection took to open or be refused: about one round trip.
  std::chrono::milliseconds round_trip{0};
};
// Opens a TCP connection to ip:port and closes it at once. Tells a wrong port from a
// scheduler that is merely slow, while a node waits for it.
ProbeResult ProbeTcp(const std::string& ip, int port, std::chrono::milliseconds timeout);

// The IPv4 address of a network interface; throws ps::Error listing the interfaces there are.
std::string InterfaceAddress(const std::string& interface);

// The local address the kernel would use to reach `ip` (a UDP connect sends nothing).
std::string RouteSourceAddress(const std::string& ip);

// Identifies "same kernel and same network namespace": the kernel's boot id plus the inode of
// this process's network namespace. Two nodes with equal identities can reach each other's
// abstract-namespace ipc sockets. "" when it cannot be read.
std::string HostIdentity();

// True when `ip` is an address of this machine (can be bound).
bool IsLocalAddress(const std::string& ip);

}  // namespace ps::net
