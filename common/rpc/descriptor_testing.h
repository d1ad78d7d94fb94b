// For tests: this process out of file descriptors for a while (every open fails with EMFILE),
// as a job that hits its descriptor limit for a moment is.
#ifndef PS_COMMON_RPC_DESCRIPTOR_TESTING_H_
#define PS_COMMON_RPC_DESCRIPTOR_TESTING_H_

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <vector>

namespace ps::common {

// While it lives, no descriptor can be made: the soft RLIMIT_NOFILE is lowered to just above
// the highest descriptor open, and the free numbers below it are taken (by /dev/null). Other
// threads making descriptors meanwhile fail too. ok() is false when that could not be set up.
class OutOfDescriptors {
 public:
  OutOfDescriptors() {
    if (getrlimit(RLIMIT_NOFILE, &limit_) != 0) return;
    int highest = 0;
    for (int fd = 0; fd < 65536 && static_cast<rlim_t>(fd) < limit_.rlim_cur; ++fd) {
      if (fcntl(fd, F_GETFD) != -1) highest = fd;
    }
    struct rlimit lowered = limit_;
    lowered.rlim_cur = static_cast<rlim_t>(highest) + 1;
    if (setrlimit(RLIMIT_NOFILE, &lowered) != 0) return;
    lowered_ = true;
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken_.push_back(fd);
    ok_ = errno == EMFILE;
  }
  ~OutOfDescriptors() {
    for (int fd : taken_) close(fd);
    if (lowered_) setrlimit(RLIMIT_NOFILE, &limit_);
  }
  OutOfDescriptors(const OutOfDescriptors&) = delete;
  OutOfDescriptors& operator=(const OutOfDescriptors&) = delete;

  bool ok() const { return ok_; }

 private:
  struct rlimit limit_ = {};
  bool lowered_ = false;
  bool ok_ = false;
  std::vector<int> taken_;
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_DESCRIPTOR_TESTING_H_
