#pragma once
// Address helpers for the one question every node answers at start: where is the scheduler,
// and which address of mine do I tell the others?
#include <string>

namespace ps::net {

// Resolves a host name or dotted IPv4 address to a dotted IPv4 address; throws ps::Error
// naming `what` (e.g. "DMLC_PS_ROOT_URI") when it cannot.
std::string ResolveIPv4(const std::string& host, const std::string& what);

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
