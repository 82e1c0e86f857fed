// Freeing work held at stream barriers when nobody else is left to, for the gate's own channel
// (a C++ or JAX process; gpreempt/client/stranded.py does the same for the Python client).
//
// The barriers wait on the GPU for the activity words of the tasks this one watches. When such
// a task's process ends inside a request, the daemon clears its words and the held work goes
// on. When the daemon is gone too, nobody would: so once the channel lost its daemon, a thread
// waits for the owner of each block watched until then to exit, and clears its words if they
// are still raised, through a writable descriptor reopened from the read-only one the daemon
// sent. That works only for a block of this process's uid (or as root): a block this process
// could not clear is not watched at all (its gate then waits for the daemon to open it, and
// opens itself once the daemon is gone).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "driver_gate.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace gpreempt_driver {

namespace {

std::string self_fd(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

void clear_activity(const WatchedBlock& b) {
  const int writable = open(self_fd(b.fd).c_str(), O_RDWR | O_CLOEXEC);
  void* p = writable < 0 ? MAP_FAILED
                         : mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, writable, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr,
                 "gpreempt: cannot mark watched process %ld, which exited inside a request, "
                 "idle (%s): work queued behind this process's stream barriers stays held\n",
                 b.pid, std::strerror(errno));
  } else {
    auto* words = static_cast<uint8_t*>(p);
    store32(words, kOffRequests, 0);
    store32(words, kOffAutoActive, 0);
    munmap(p, kSize);
  }
  if (writable >= 0) {
    close(writable);
  }
}

}  // namespace

bool watch_block(int fd, long pid, WatchedBlock* out) {
  const int writable = open(self_fd(fd).c_str(), O_RDWR | O_CLOEXEC);
  if (writable < 0) {
    return false;  // another user's block: nobody left could clear it
  }
  close(writable);
  void* p = mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return false;
  }
  out->view = static_cast<const uint8_t*>(p);
  out->fd = fd;
  out->pid = pid;
  out->pidfd = pid > 0 ? static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0))
                       : -1;
  return true;
}

void close_blocks(const std::vector<WatchedBlock>& blocks) {
  for (const WatchedBlock& b : blocks) {  // the views stay mapped: the GPU may read them
    close(b.fd);
    if (b.pidfd >= 0) {
      close(b.pidfd);
    }
  }
}

void free_stranded(std::vector<WatchedBlock> blocks) {
  std::thread([blocks = std::move(blocks)]() {
    std::vector<pollfd> owners;
    for (const WatchedBlock& b : blocks) {
      if (b.pidfd >= 0) {
        owners.push_back(pollfd{b.pidfd, POLLIN, 0});
      }
    }
    // a pidfd is readable once its process exited (an idle moment of a live owner proves
    // nothing: a barrier further down the queue may reach its words in its next request)
    while (!owners.empty()) {
      if (poll(owners.data(), owners.size(), -1) < 0 && errno != EINTR) {
        break;
      }
      for (size_t i = 0; i < owners.size();) {
        if (owners[i].revents == 0) {
          ++i;
          continue;
        }
        for (const WatchedBlock& b : blocks) {
          if (b.pidfd == owners[i].fd && (load32(b.view, kOffRequests) != 0 ||
                                          load32(b.view, kOffAutoActive) != 0)) {
            clear_activity(b);
          }
        }
        owners.erase(owners.begin() + static_cast<long>(i));
      }
    }
    close_blocks(blocks);
  }).detach();
}

}  // namespace gpreempt_driver
