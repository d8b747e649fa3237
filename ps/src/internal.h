#pragma once
// ps's internal interface: the part of the runtime's private code that the other libraries of
// this repository build on (scheduler/ runs a node of its own). Not public: it is not
// installed (cmake/PsInstall.cmake installs ps/include only), a user's program never sees it,
// and it changes with the code that uses it. A sibling library includes this header and ps's
// public headers (ps/include), no other header of ps/src, so that ps can rearrange its private
// code behind it. The CMake target ps_internal carries its dependencies.
//
// What it offers:
//   ZmqTransport, TransportOptionsFor  a node's sockets: bind, connect, send, receive
//                                      (zmq_transport.h)
//   ReceiveLoop, PeriodicTask          a node's receive thread and timer thread
//                                      (node_threads.h)
//   net::ResolveIPv4                   host names to addresses, errors naming the variable
//                                      (net_util.h)
//   FormatSeconds, LogOccurrence       durations as users write them; rate-limited log lines
//                                      (log_text.h)
//   PS_LOG                             logging from code a worker process runs, before or
//                                      after the program sets glog up (glog_or_stderr.h)
//   ScopedFd                           a file descriptor closed with its scope (scoped_fd.h)
#include "ps/src/glog_or_stderr.h"
#include "ps/src/log_text.h"
#include "ps/src/net_util.h"
#include "ps/src/node_threads.h"
#include "ps/src/scoped_fd.h"
#include "ps/src/zmq_transport.h"
