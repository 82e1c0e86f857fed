// The driver-level gate's own channel to the daemon, for a process with no Python client: a C++
// program, or a Python one whose CUDA started before the client opened its session (JAX).
//
// It speaks the client's protocol (gpreempt/protocol.py): one JSON line per message on the
// daemon's unix socket, the control block (a sealed memfd, mode 0600) and the doorbell (an
// eventfd) passed as descriptors beside {"op":"channel"}. The daemon finds the task from the
// process's ancestry, checked with SO_PEERCRED. The daemon's watch lists (read-only descriptors
// of the blocks of the tasks that outrank this one, beside {"push":"watch"}) are mapped and
// handed to the gate, so that its barriers stop the GPU the moment one of them is active. If
// the daemon goes away the gate opens at once, and the block is handed to the next daemon that
// answers, as the Python client does.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

constexpr const char* kSocketName = "gpreempt.sock";

int memfd = -1;

double env_double(const char* name, double fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const double d = strtod(v, &end);
  return end != v ? d : fallback;
}

bool make_block(Gate& g) {
  memfd = static_cast<int>(syscall(SYS_memfd_create, "gpreempt-control",
                                   MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (memfd < 0 || fchmod(memfd, 0600) != 0 || ftruncate(memfd, kSize) != 0 ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return false;
  }
  void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) {
    return false;
  }
  g.doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g.doorbell < 0) {
    return false;
  }
  g.ctl.store(static_cast<uint8_t*>(p), std::memory_order_release);
  return true;
}

// The daemon that wrote the block's words is gone: lifts its in-flight share and lets the gate
// sleep (a share left set kept the barriers on, a sleep left forbidden the callbacks, for good),
// then opens the gate and wakes a waiting launch (ControlBlock.release).
void release_block(Gate& g) {
  uint8_t* ctl = g.ctl.load();
  store32(ctl, kOffWindowShareUs, 0);
  store32(ctl, kOffSleepOk, 1);
  store32(ctl, kOffGateClosed, 0);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(ctl + kOffGateClosed), FUTEX_WAKE, 1 << 30,
          nullptr, nullptr, 0);
}

// A connected socket on which the daemon took the block, or -1 (the caller releases the block:
// a daemon slow to answer may have taken it and written its words before the answer timed out).
int connect_channel() {
  const char* dir = getenv("GPREEMPT_RUNTIME_DIR");
  if (dir == nullptr) {
    return -1;
  }
  const std::string path = std::string(dir) + "/" + kSocketName;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return -1;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return -1;
  }
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  static const char kRequest[] = "{\"op\":\"channel\",\"nfds\":2}\n";
  iovec iov{const_cast<char*>(kRequest), sizeof(kRequest) - 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {memfd, gate().doorbell};
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  std::string reply;
  if (sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(iov.iov_len)) {
    char ch = 0;
    while (reply.size() < 65536 && recv(fd, &ch, 1, 0) == 1 && ch != '\n') {
      reply.push_back(ch);
    }
  }
  if (reply.find("\"ok\":true") == std::string::npos) {
    close(fd);
    return -1;
  }
  timeval none{0, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  return fd;
}

// The number after `"key":` in a JSON line, or -1.
long json_number(const std::string& line, const char* key) {
  const std::string quoted = std::string("\"") + key + "\":";
  const size_t at = line.find(quoted);
  if (at == std::string::npos) {
    return -1;
  }
  return std::strtol(line.c_str() + at + quoted.size(), nullptr, 10);
}

// The elements of the flat JSON array after `"key":`, each read as a number (0 for anything
// else: null), or none where there is no such array (`found` false).
std::vector<long> json_numbers(const std::string& line, const char* key, bool* found) {
  const std::string quoted = std::string("\"") + key + "\":[";
  const size_t at = line.find(quoted);
  const size_t open = at == std::string::npos ? at : at + quoted.size();
  const size_t close = open == std::string::npos ? open : line.find(']', open);
  *found = close != std::string::npos;
  std::vector<long> numbers;
  for (size_t i = open; *found && i < close;) {
    const size_t end = std::min(line.find(',', i), close);
    numbers.push_back(std::strtol(line.c_str() + i, nullptr, 10));
    i = end + 1;
  }
  return numbers;
}

// The blocks of the watch list the daemon sent last (the channel's thread alone uses it).
std::vector<WatchedBlock> watched;

// One message from the daemon and the descriptors that came with it (taken, closed here).
void on_message(Gate& g, const std::string& line, std::deque<int>& fds) {
  const long nfds = std::max(0L, json_number(line, "nfds"));
  std::vector<int> mine;
  for (long i = 0; i < nfds && !fds.empty(); ++i) {
    mine.push_back(fds.front());
    fds.pop_front();
  }
  if (line.find("\"push\":\"watch\"") != std::string::npos) {
    auto* list = new WatchList();  // never freed: a launch may read it; its pages stay mapped
    const long version = json_number(line, "version");
    bool listed = false, named = false;
    const size_t tasks = json_numbers(line, "tasks", &listed).size();
    const std::vector<long> pids = json_numbers(line, "pids", &named);
    const bool complete = listed && tasks == mine.size() && static_cast<long>(mine.size()) == nfds &&
                          mine.size() <= kMaxWatched;
    std::vector<WatchedBlock> blocks;
    for (size_t i = 0; i < mine.size(); ++i) {
      WatchedBlock b;
      if (list->n < kMaxWatched && watch_block(mine[i], i < pids.size() ? pids[i] : 0, &b)) {
        list->blocks[list->n++] = b.view;
        blocks.push_back(b);
        mine[i] = -1;  // the block keeps it
      }
    }
    list->version = complete && version > 0 && list->n == mine.size()
                        ? static_cast<uint32_t>(version)
                        : 0;
    g.watch.store(list->n == 0 ? nullptr : list, std::memory_order_release);
    close_blocks(watched);
    watched = std::move(blocks);
  }
  for (int fd : mine) {
    if (fd >= 0) {
      close(fd);
    }
  }
}

// Reads the daemon's pushes until it goes away, then opens the gate and hands the block to the
// next daemon.
void channel_loop(int fd) {
  Gate& g = gate();
  std::string pending;
  std::deque<int> fds;
  for (;;) {
    char buffer[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(16 * sizeof(int))];
    iovec iov{buffer, sizeof(buffer)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int received = -1;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds.push_back(received);
        }
      }
    }
    if (n > 0) {
      pending.append(buffer, static_cast<size_t>(n));
      for (size_t end; (end = pending.find('\n')) != std::string::npos;) {
        on_message(g, pending.substr(0, end), fds);
        pending.erase(0, end + 1);
      }
      if (pending.size() > (1u << 20)) {
        pending.clear();  // no message of the daemon is this long
      }
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    close(fd);
    for (int left : fds) {
      close(left);
    }
    fds.clear();
    pending.clear();
    g.watch.store(nullptr, std::memory_order_release);
    release_block(g);
    // barriers already queued may wait on the watched words: freed where their owner exits
    free_stranded(std::move(watched));
    watched.clear();
    do {
      sleep(1);
      fd = connect_channel();
      if (fd < 0) {
        release_block(g);  // a daemon that took it over a connection given up on, then died
      }
    } while (fd < 0);
  }
}

}  // namespace

Config config_from_environment() {
  // gpreempt run writes these for its command (gpreempt.client.gate.driver.config_environment)
  Config c;
  c.bound = env_double("GPREEMPT_DRIVER_BOUND", 1.0) != 0.0;
  c.auto_activity = env_double("GPREEMPT_DRIVER_ACTIVITY", 1.0) != 0.0;
  c.barrier_us = env_double("GPREEMPT_DRIVER_BARRIER_US", c.barrier_us);
  c.window_ms = env_double("GPREEMPT_DRIVER_WINDOW_MS", c.window_ms);
  c.idle_grace_ms = env_double("GPREEMPT_DRIVER_GRACE_MS", c.idle_grace_ms);
  return c;
}

bool open_own_channel(Gate& g) {
  if (!make_block(g)) {
    return false;
  }
  publish_devices(g);
  const int fd = connect_channel();
  std::thread([fd]() {
    int first = fd;
    while (first < 0) {
      // no daemon holds the block; one slow to answer may have taken it before the answer
      // timed out, and would leave its words set for good if it died now
      release_block(gate());
      sleep(1);
      first = connect_channel();
    }
    channel_loop(first);
  }).detach();
  return fd >= 0;
}

}  // namespace gpreempt_driver
